"""An uncompressed layer tar -> one eStargz (or zstd:chunked) blob, compressed on every core.

`publish --compression estargz` writes each layer so that the stargz snapshotter, mounting it,
fetches the files the image's start reads in one range request: those files first, then the
prefetch landmark, then the rest (order.py decides the order, toc.py holds the format's bytes).

The layer can be several GB, so it is read twice and never whole: one pass of tarfile indexes its
members (names, headers, data offsets), then each member's content is read by seek in the new
order, one chunk at a time. Every chunk starts a gzip member, and members do not depend on one
another, so they are compressed on a pool of threads (zlib releases the GIL) while this thread
reads, hashes (the diff id, the blob digest, each multi-chunk file) and writes the members in
order. At most a few chunks per thread are in flight, so memory stays bounded; the bytes depend on
the input, the profile and the level only, never on the number of threads.

zstd:chunked (zstdchunked.py) is the same layout with a zstd frame for each gzip member and its own
end (the TOC and the tar-split in skippable frames, then the footers): `codec` chooses. Its
tar-split (tarsplit.py) is gathered as the tar is written; containers/storage checks that each
header it holds matches the TOC's entry, so a zstd:chunked header keeps no more than the TOC says:
its mtime in whole seconds, no atime or ctime.

zstd:chunked can also prefetch parts of a file (`copied`): a library of 500 MB of which the start
touches a few MB is not worth fetching whole, and on demand its chunks come one request after
another as the loader faults them in. So the chunks the start touched (profile.py's pages) are
also written, compressed, in one skippable frame right after the blob's first frame, before the
landmark, and the snapshotter's TOC names those copies (zstdchunked.py: a TOC per reader). A
file's first chunk is never copied: the snapshotter's prefetch caches every chunk of a file whose
first chunk lies before the landmark, which would fetch the whole library.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import tarfile
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ..engine.export import ESTARGZ, ZSTD_CHUNKED, Compression
from ..errors import ImageBuilderError
from .order import prioritize
from .toc import (ANNOTATION_TOC_DIGEST, ANNOTATION_UNCOMPRESSED_SIZE, DEFAULT_CHUNK_SIZE, END_OF_TAR,
                  LANDMARK_CONTENTS, TOC_NAME, OwnerNames, clean_name, entry_of, footer, gzip_member, header, kind_of,
                  padding, synthetic, toc_json)
from .tarsplit import Crc64, TarSplit
from .zstdchunked import SKIPPABLE_MAGIC, trailer, zstd_frame

CODECS: dict[str, Callable[[Sequence[bytes], int], bytes]] = {ESTARGZ: gzip_member, ZSTD_CHUNKED: zstd_frame}

EMPTY_DIGEST = "sha256:" + hashlib.sha256(b"").hexdigest()


class BadLayer(ImageBuilderError):
    template = "the layer tar cannot be read ({detail}); export the image again"


@dataclass(frozen=True)
class Written:
    digest: str
    """sha256:HEX of the blob (the compressed bytes)."""
    size: int
    diff_id: str
    """sha256:HEX of the blob gunzipped: the image config's rootfs.diff_ids entry."""
    uncompressed_size: int
    toc_digest: str
    """sha256:HEX of the TOC JSON, which the snapshotter checks against the layer's annotation."""
    prioritized: tuple[str, ...]
    """The profile's paths this layer holds, in the order written before the landmark."""
    prioritized_bytes: int
    """Content bytes written before the landmark (the profile's files and hard links' targets)."""
    codec: str = ESTARGZ
    toc_annotations: dict[str, str] = field(default_factory=dict)
    """zstd:chunked's for the snapshotter: the compressed TOC's digest and position, by their older names."""
    storage_annotations: dict[str, str] = field(default_factory=dict)
    """zstd:chunked's for containers/storage: the compressed TOC's digest and position, the tar-split's
    position. Never beside annotations(): containers/image refuses a layer with both (zstdchunked.py)."""
    copied_chunks: int = 0
    """Chunks written a second time before the landmark (zstd:chunked's prefetch by chunk)."""
    copied_bytes: int = 0
    """Their compressed bytes: what the copies add to the blob."""

    def annotations(self) -> dict[str, str]:
        """The layer descriptor's annotations the snapshotter reads."""
        return {ANNOTATION_TOC_DIGEST: self.toc_digest, ANNOTATION_UNCOMPRESSED_SIZE: str(self.uncompressed_size),
                **self.toc_annotations}


def write_estargz(source: BinaryIO, out: BinaryIO, prioritized: Sequence[str] = (), *, level: int = 6,
                  codec: str = ESTARGZ, chunk_size: int = DEFAULT_CHUNK_SIZE, workers: int | None = None,
                  on_progress: Callable[[int], None] | None = None,
                  copied: Mapping[str, Collection[int]] | None = None) -> Written:
    """Write the layer tar `source` (seekable, read from where it stands) to `out` as eStargz (or
    zstd:chunked, `codec`), the files of the start profile `prioritized` (image paths; those not
    in the layer are ignored) first, and (zstd:chunked) a copy of the chunks `copied` names (image
    path -> chunk indices, of `chunk_size`) of the files after the landmark, but their first.
    `on_progress` gets the layer bytes done so far, about every chunk."""
    if codec not in CODECS:
        raise ValueError(f"codec {codec!r} is not one of {', '.join(CODECS)}")
    compress, levels = CODECS[codec], Compression.LEVELS[codec]
    if level not in levels:
        raise ValueError(f"{codec} level {level} is not {levels.start}-{levels.stop - 1}")
    if chunk_size <= 0:
        raise ValueError(f"chunk size {chunk_size} is not positive")
    threads = workers if workers is not None else len(os.sched_getaffinity(0))
    if threads < 1:
        raise ValueError(f"workers {workers} is not positive")
    if copied and codec != ZSTD_CHUNKED:
        raise ValueError("chunks are copied ahead in zstd:chunked only")
    try:
        members = tarfile.open(fileobj=source, mode="r:").getmembers()
    except tarfile.TarError as e:
        raise BadLayer(detail=str(e)) from e
    order = prioritize(members, prioritized)
    landmark = synthetic(order.landmark, len(LANDMARK_CONTENTS))

    def content(info: tarfile.TarInfo, offset: int, size: int) -> bytes:
        if info is landmark:
            return LANDMARK_CONTENTS
        source.seek(info.offset_data + offset)
        data = source.read(size)
        if len(data) != size:
            raise BadLayer(detail=f"{info.name} ends {size - len(data)} bytes early")
        return data

    copies = _copies(order.after, copied or {}, chunk_size)
    split = TarSplit() if codec == ZSTD_CHUNKED else None
    with _Members(out, compress, level, threads, chunk_size, on_progress) as blob:
        frames = blob.compress_all([content(info, index * chunk_size, min(chunk_size, info.size - index * chunk_size))
                                    for info, index in copies])
        owners, entries, placed = OwnerNames(), [], {}
        for number, info in enumerate((*order.before, landmark, *order.after)):
            entries.extend(_write_entry(blob, info, owners, chunk_size, content, split))
            if number == 0 and frames:  # the copies right after the first frame: a zstd blob starts with one
                placed = blob.write_skippable(frames, [(_path(info), index) for info, index in copies])
        payload_end = blob.finish_payload()
        old, storage = {}, {}
        if split is None:  # eStargz: the TOC is the tar's last entry, in the member the footer points at
            document = toc_json(entries)
            blob.write_last([header(synthetic(TOC_NAME, len(document))), document, padding(len(document)), END_OF_TAR])
            blob.write_raw(footer(payload_end))
        else:  # the tar's end is the last frame; the TOC and the tar-split are no tar entries
            blob.write_last([END_OF_TAR])
            split.raw(END_OF_TAR)
            raw_split = split.document()
            compressed_split = zstd_frame([raw_split], level)
            split_digest = "sha256:" + hashlib.sha256(compressed_split).hexdigest()
            storage_document = toc_json(entries, tar_split_digest=split_digest)
            document, snapshotter_toc = storage_document, None
            if placed:
                document = toc_json(_at_copies(entries, placed, chunk_size), tar_split_digest=split_digest)
                snapshotter_toc = (zstd_frame([document], level), len(document))
            end = trailer(blob.written, zstd_frame([storage_document], level), len(storage_document),
                          compressed_split, len(raw_split), snapshotter_toc)
            blob.write_raw(end.data)
            old, storage = end.old_annotations(), end.storage_annotations()
    return Written(digest=blob.digest(), size=blob.written, diff_id=blob.diff_id(),
                   uncompressed_size=blob.uncompressed, toc_digest="sha256:" + hashlib.sha256(document).hexdigest(),
                   prioritized=order.found, prioritized_bytes=sum(i.size for i in order.before if i.isreg()),
                   codec=codec, toc_annotations=old, storage_annotations=storage, copied_chunks=len(frames),
                   copied_bytes=sum(map(len, frames)))


def _path(info: tarfile.TarInfo) -> str:
    return "/" + clean_name(info.name)


def _copies(after: Sequence[tarfile.TarInfo], copied: Mapping[str, Collection[int]],
            chunk_size: int) -> list[tuple[tarfile.TarInfo, int]]:
    """The (file, chunk index) pairs to copy ahead: of the files after the landmark that
    `copied` names, each named chunk the file has, but its first; in the tar's order."""
    if not copied:
        return []
    pairs: list[tuple[tarfile.TarInfo, int]] = []
    for info in after:
        wanted = copied.get(_path(info)) if info.isreg() and info.size > chunk_size else None
        if wanted:
            chunks = -(-info.size // chunk_size)
            pairs.extend((info, index) for index in sorted(set(wanted)) if 1 <= index < chunks)
    return pairs


def _at_copies(entries: Sequence[dict[str, Any]], placed: Mapping[tuple[str, int], int],
               chunk_size: int) -> list[dict[str, Any]]:
    """The TOC's entries with each copied chunk's offset at its copy (the snapshotter's TOC)."""
    moved = []
    for entry in entries:
        key = ("/" + clean_name(entry["name"]), int(entry.get("chunkOffset", 0)) // chunk_size)
        moved.append({**entry, "offset": placed[key]} if entry["type"] in ("reg", "chunk") and key in placed else entry)
    return moved


def _whole_seconds(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """The member as its zstd:chunked header says it: the mtime the TOC's modtime says (whole
    seconds, the epoch for under a second), no PAX times (a PAX record outranks the field)."""
    kept = {key: value for key, value in info.pax_headers.items() if key not in ("mtime", "atime", "ctime")}
    mtime = 0 if math.floor(info.mtime) == 0 else math.floor(info.mtime + 0.5)
    if mtime == info.mtime and kept == info.pax_headers:
        return info
    info = copy.copy(info)
    info.mtime, info.pax_headers = mtime, kept
    return info


def _write_entry(blob: _Members, info: tarfile.TarInfo, owners: OwnerNames, chunk_size: int,
                 content: Callable[[tarfile.TarInfo, int, int], bytes], split: TarSplit | None) -> list[dict[str, Any]]:
    """Write one tar member: its header into the open gzip member, each content chunk at the start
    of a new one, and into `split` (zstd:chunked's tar-split). Its TOC entries (one, and a "chunk"
    per further chunk)."""
    if kind_of(info) == "reg" and info.type != tarfile.REGTYPE:
        info = copy.copy(info)  # an old type ('\\0', contiguous '7') written as '0', as Go's tar reader reads it
        info.type = tarfile.REGTYPE
    if split is not None:
        info = _whole_seconds(info)
    encoded = header(info)
    entry = entry_of(info, info.name + "/" if info.isdir() else info.name, owners)
    blob.add(encoded)
    crc = Crc64() if split is not None and info.isreg() and info.size else None
    if split is not None:
        split.raw(encoded)
    if not info.isreg() or info.size == 0:
        if info.isreg():
            entry["digest"] = EMPTY_DIGEST
        if split is not None:
            split.file(entry["name"], 0, None)
        return [entry]
    whole = hashlib.sha256() if info.size > chunk_size else None
    entries = []
    for start in range(0, info.size, chunk_size):
        size = min(chunk_size, info.size - start)
        chunk = entry if start == 0 else {"name": entry["name"], "type": "chunk"}
        chunk["chunkOffset"] = start
        if size == chunk_size:
            chunk["chunkSize"] = size  # upstream leaves it out for a last chunk shorter than the rest
        data = content(info, start, size)
        if whole is not None:
            whole.update(data)
        if crc is not None:
            crc.update(data)
        blob.start_chunk(data, chunk, file_digest=entry if whole is None else None)
        entries.append(chunk)
    if whole is not None:
        entry["digest"] = "sha256:" + whole.hexdigest()
    blob.add(padding(info.size))
    if split is not None and crc is not None:
        split.file(entry["name"], info.size, crc.digest())
        split.raw(padding(info.size))
    return entries


@dataclass
class _Pending:
    future: Future[tuple[bytes, str]]
    size: int
    chunk: dict[str, Any] | None
    file_digest: dict[str, Any] | None


def _compress(compress: Callable[[Sequence[bytes], int], bytes], pieces: list[bytes], level: int,
              digest_first: bool) -> tuple[bytes, str]:
    """A worker's job: the member (or frame), and the sha256 of its first piece (a chunk's content)."""
    digest = "sha256:" + hashlib.sha256(pieces[0]).hexdigest() if digest_first else ""
    return compress(pieces, level), digest


class _Members:
    """The blob's gzip members: the one open gathers pieces; closed ones are compressed on the pool
    (or here, for one worker) and written in order, each chunk's TOC entry getting its offset and
    chunkDigest as its member is written."""

    def __init__(self, out: BinaryIO, compress: Callable[[Sequence[bytes], int], bytes], level: int, workers: int,
                 chunk_size: int, on_progress: Callable[[int], None] | None) -> None:
        self.out, self.compress, self.level, self.on_progress = out, compress, level, on_progress
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="estargz") if workers > 1 else None
        self.max_pending, self.max_pending_bytes = 4 * workers, 2 * workers * chunk_size
        self.progress_step, self.done, self.reported = chunk_size, 0, 0
        self.pending: deque[_Pending] = deque()
        self.pending_bytes = 0
        self.pieces: list[bytes] = []
        self.chunk: dict[str, Any] | None = None
        self.file_digest: dict[str, Any] | None = None
        self.written = self.uncompressed = 0
        self._blob, self._diff = hashlib.sha256(), hashlib.sha256()

    def __enter__(self) -> _Members:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            for pending in self.pending:
                pending.future.cancel()
            self.pool.shutdown(wait=True)

    def add(self, piece: bytes) -> None:
        """Append bytes to the open member."""
        if piece:
            self.pieces.append(piece)

    def start_chunk(self, data: bytes, chunk: dict[str, Any], file_digest: dict[str, Any] | None) -> None:
        """Close the open member and start one with a chunk's content; `file_digest`: the file's
        entry, where this chunk is the whole file (its digest is the chunk's)."""
        self._close()
        self.pieces, self.chunk, self.file_digest = [data], chunk, file_digest

    def compress_all(self, chunks: Sequence[bytes]) -> list[bytes]:
        """Each chunk compressed on its own (on the pool), in order; the blob is not touched."""
        if self.pool is None:
            return [self.compress([chunk], self.level) for chunk in chunks]
        return list(self.pool.map(lambda chunk: self.compress([chunk], self.level), chunks))

    def write_skippable(self, frames: Sequence[bytes], keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Write every member so far, then one skippable frame holding `frames`, which decoders
        pass over: where each frame starts in the blob, by its key."""
        self.finish_payload()
        size = sum(map(len, frames))
        if size >= 1 << 32:
            raise ValueError(f"{size} bytes of copied chunks do not fit one skippable frame (4 GiB)")
        self.write_raw(SKIPPABLE_MAGIC + size.to_bytes(4, "little"))
        placed = {}
        for key, frame in zip(keys, frames, strict=True):
            placed[key] = self.written
            self.write_raw(frame)
        return placed

    def finish_payload(self) -> int:
        """Close the open member, write every member; the offset the next one starts at."""
        self._close()
        while self.pending:
            self._write_oldest()
        return self.written

    def write_last(self, pieces: list[bytes]) -> None:
        """Compress and write one member here (the TOC's)."""
        self.done += self._account(pieces)
        self.write_raw(self.compress(pieces, self.level))
        self._report(force=True)

    def write_raw(self, data: bytes) -> None:
        self.out.write(data)
        self._blob.update(data)
        self.written += len(data)

    def digest(self) -> str:
        return "sha256:" + self._blob.hexdigest()

    def diff_id(self) -> str:
        return "sha256:" + self._diff.hexdigest()

    def _close(self) -> None:
        if not self.pieces:
            return
        pieces, size = self.pieces, self._account(self.pieces)
        digest_first = self.chunk is not None
        if self.pool is None:
            future: Future[tuple[bytes, str]] = Future()
            future.set_result(_compress(self.compress, pieces, self.level, digest_first))
        else:
            future = self.pool.submit(_compress, self.compress, pieces, self.level, digest_first)
        self.pending.append(_Pending(future, size, self.chunk, self.file_digest))
        self.pending_bytes += size
        self.pieces, self.chunk, self.file_digest = [], None, None
        while self.pending and (len(self.pending) > self.max_pending or self.pending_bytes > self.max_pending_bytes):
            self._write_oldest()

    def _account(self, pieces: list[bytes]) -> int:
        for piece in pieces:
            self._diff.update(piece)
        size = sum(map(len, pieces))
        self.uncompressed += size
        return size

    def _write_oldest(self) -> None:
        pending = self.pending.popleft()
        member, digest = pending.future.result()
        if pending.chunk is not None:
            pending.chunk["offset"], pending.chunk["chunkDigest"] = self.written, digest
        if pending.file_digest is not None:
            pending.file_digest["digest"] = digest
        self.write_raw(member)
        self.pending_bytes -= pending.size
        self.done += pending.size
        self._report()

    def _report(self, force: bool = False) -> None:
        if self.on_progress is not None and (force or self.done - self.reported >= self.progress_step):
            self.reported = self.done
            self.on_progress(self.done)
