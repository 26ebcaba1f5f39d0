"""One-layer zstd:chunked images that publish's own writer and push make, for the tests where a
real containers/storage (Podman 4 on the host, Podman 5 in its tool image) pulls them partially.

Two images share all but one file: a root of the host's dash and libc, six files of 1 MiB random
bytes and a marker; the second has a seventh file and another marker. The second layer is a new
blob, but containers/storage finds the files it already holds by the TOC's digests and asks the
registry, in Range requests, for the rest only; the registry's access log (support.registry)
says which requests it answered and how many bytes it sent.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path

from imagebuilder.engine.export import ZSTD_CHUNKED
from imagebuilder.estargz.saved import SavedImage
from imagebuilder.estargz.writer import Written, write_estargz
from imagebuilder.publish.estargz import _put
from imagebuilder.registry.client import HttpRegistry

from .ordered_saves import add_files
from .unavailable import _unavailable

ROOT_FILES = ("/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2")
MIB = 1 << 20


def two_images() -> dict[str, dict[str, bytes]]:
    """The two images' files by name ("first", "second"), by path in the layer."""
    if any(not Path(path).exists() for path in ROOT_FILES):
        _unavailable(f"the image's root is the host's dash and libc: {', '.join(ROOT_FILES)}")
    root = {name.lstrip("/"): Path(name).read_bytes() for name in ROOT_FILES}
    data = {f"data/f{i}": os.urandom(MIB) for i in range(1, 8)}
    return {"first": {**root, **{k: v for k, v in data.items() if k != "data/f7"}, "marker": b"first\n"},
            "second": {**root, **data, "marker": b"second\n"}}


def layer(files: dict[str, bytes], varied: bool = False) -> bytes:
    """The uncompressed layer: its folders, then `files`, all 0755, one mtime (PAX tar). `varied`
    adds the entries whose metadata containers/storage 1.57 checks against the TOC (the TOC and the
    tar-split must agree on each: ensureTOCMatchesTarSplit): a symlink, a hard link, a name over
    100 bytes (a PAX path), an xattr, an owner with names, an empty file, a mode with the file
    type's bits, PAX mtime under the second and atime/ctime (the writer rounds and drops those)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_files(tar, files, mode=0o755)
        if varied:
            for info, data in _varied():
                info.mtime = info.mtime or 1_700_000_000
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _varied() -> list[tuple[tarfile.TarInfo, bytes]]:
    def entry(name: str, **fields: object) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        for key, value in fields.items():
            setattr(info, key, value)
        return info
    return [(entry("varied/", type=tarfile.DIRTYPE, mode=0o755), b""),
            (entry("varied/link", type=tarfile.SYMTYPE, linkname="../marker"), b""),
            (entry("varied/hard", type=tarfile.LNKTYPE, linkname="marker"), b""),
            (entry("varied/" + "long-name-" * 12), b"long\n"),
            (entry("varied/empty"), b""),
            (entry("varied/owned", uid=1000, gid=1000, uname="user", gname="group"), b"owned\n"),
            (entry("varied/xattr", pax_headers={"SCHILY.xattr.user.imagebuilder": "value"}), b"xattr\n"),
            (entry("varied/typed-mode", mode=0o100644), b"typed\n"),
            (entry("varied/times", pax_headers={"mtime": "1700000000.25", "atime": "1700000001", "ctime": "1700000002"}),
             b"times\n")]


def push(address: str, repository: str, files: dict[str, bytes], varied: bool = False,
         copied: dict[str, set[int]] | None = None) -> Written:
    """The one-layer image of `files` (and `varied`: layer()) as publish pushes zstd:chunked:
    the blob, then _put's config, manifests and index under :v1. `copied`: the chunks (of 4 MiB)
    copied ahead, as a start profile with pages has them (the marker its one file before the landmark)."""
    ref = f"{address}/{repository}:v1"
    out = io.BytesIO()
    written = write_estargz(io.BytesIO(layer(files, varied)), out, ("/marker",) if copied else (), codec=ZSTD_CHUNKED,
                            level=3, workers=2, copied=copied)
    registry = HttpRegistry()
    registry.upload_blob(ref, written.digest, io.BytesIO(out.getvalue()), written.size)
    put_image(ref, written, ["/bin/dash"], registry)
    return written


def put_image(ref: str, written: Written, command: list[str], registry: HttpRegistry) -> None:
    """The one-layer image of the uploaded layer `written` under `ref`, running `command`: _put's
    config, manifests and index, as publish puts them."""
    config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
              "config": {"Cmd": command}}
    saved = SavedImage(manifest={}, config=json.dumps(config).encode(), layers=(),
                       platform={"os": "linux", "architecture": "amd64"})
    _put(ref, [ref], saved, [written], None, registry)


def fetched(log: Path, digest: str) -> tuple[int, int]:
    """(Range requests answered 206, bytes sent) for the blob `digest`, from the access log."""
    ranges = sent = 0
    for line in log.read_text(errors="replace").splitlines():
        found = re.search(rf'"GET /v2/[^ ]*/blobs/{digest} HTTP/[0-9.]+" (\d+) (\d+)', line)
        if found:
            ranges += found.group(1) == "206"
            sent += int(found.group(2))
    return ranges, sent
