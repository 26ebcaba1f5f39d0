"""The squashfs's chunk table: the sha256 of each 1 MiB chunk of the file, published as a
second blob of the artifact (so the artifact's signature covers it), so a node that reads the
squashfs lazily (lazy.py) checks every chunk it serves without the whole file's digest.

The table is JSON: {"chunk_size": 1048576, "size": FILE BYTES, "sha256": [HEX per chunk]}, the
last chunk shorter where the size is not a multiple. Pure, but for table_of(), which reads a file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ImageBuilderError

CHUNK_SIZE = 1 << 20


class BadChunkTable(ImageBuilderError):
    template = "the squashfs's chunk table {digest} is not valid ({detail}); publish the squashfs again"


class ChunkCorrupt(ImageBuilderError):
    template = ("chunk {index} of the squashfs {blob} (bytes {start}-{end}) arrived with sha256 {actual}, not "
                "{expected}: the registry or the link corrupted it; release the mount and try again")


@dataclass(frozen=True)
class ChunkTable:
    chunk_size: int
    size: int
    digests: tuple[str, ...]

    def span(self, index: int) -> tuple[int, int]:
        """(first byte, bytes) of chunk `index`."""
        start = index * self.chunk_size
        return start, min(self.chunk_size, self.size - start)

    def chunks(self, offset: int, length: int) -> range:
        """The chunks that bytes offset..offset+length-1 lie in."""
        if length <= 0:
            return range(0)
        return range(offset // self.chunk_size, (min(offset + length, self.size) - 1) // self.chunk_size + 1)

    def check(self, index: int, data: bytes, blob: str) -> None:
        """Raise ChunkCorrupt unless `data` is chunk `index` of the file."""
        actual = hashlib.sha256(data).hexdigest()
        if actual != self.digests[index]:
            start, _ = self.span(index)
            raise ChunkCorrupt(index=index, blob=blob, start=start, end=start + len(data) - 1, actual=actual[:16],
                               expected=self.digests[index][:16])


def table_of(path: Path, chunk_size: int = CHUNK_SIZE) -> bytes:
    """The chunk table document of the file at `path`."""
    return digest_and_table(path, chunk_size)[1]


def digest_and_table(path: Path, chunk_size: int = CHUNK_SIZE) -> tuple[str, bytes]:
    """The whole file's digest (sha256:HEX) and its chunk table, in one read of it."""
    digests, size, whole = [], 0, hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(chunk_size), b""):
            digests.append(hashlib.sha256(chunk).hexdigest())
            whole.update(chunk)
            size += len(chunk)
    table = json.dumps({"chunk_size": chunk_size, "size": size, "sha256": digests}, separators=(",", ":")).encode()
    return "sha256:" + whole.hexdigest(), table


def parse_table(body: bytes, digest: str, size: int) -> ChunkTable:
    """The table in `body` (blob `digest`) for a squashfs of `size` bytes, checked whole."""
    try:
        document: Any = json.loads(body)
        chunk_size, total, digests = int(document["chunk_size"]), int(document["size"]), document["sha256"]
    except (ValueError, KeyError, TypeError) as e:
        raise BadChunkTable(digest=digest, detail=f"not a table: {e}") from e
    if chunk_size <= 0 or total != size:
        raise BadChunkTable(digest=digest, detail=f"it is of {total} bytes in chunks of {chunk_size}, the blob {size}")
    if not isinstance(digests, list) or len(digests) != -(-size // chunk_size) or not all(
            isinstance(item, str) and len(item) == 64 for item in digests):
        raise BadChunkTable(digest=digest, detail=f"{len(digests) if isinstance(digests, list) else 0} digests for "
                                                  f"{-(-size // chunk_size)} chunks")
    return ChunkTable(chunk_size, size, tuple(digests))
