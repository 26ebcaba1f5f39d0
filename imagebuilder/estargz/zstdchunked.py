"""zstd:chunked's bytes, as containers/storage writes them and the stargz snapshotter reads them.

The same layout as eStargz (toc.py), with zstd frames for gzip members: every chunk of a file's
content starts a frame, so the blob still decompresses to the layer's tar with any zstd reader
(Docker >= 23, containerd >= 1.5 pull it as plain zstd), while a lazy reader decompresses a chunk
from its TOC offset alone. After the tar's end blocks (the last zstd frame) come skippable frames,
which decoders pass over, so none is in the diff:
  1. the TOC JSON, zstd-compressed; it names the tar-split's digest (`tarSplitDigest`);
  2. the tar-split (tarsplit.py), zstd-compressed: without it containers/storage (Podman, CRI-O)
     will not pull a layer partially (pkg/chunked/storage_linux.go, makeZstdChunkedDiffer);
  3. containers/storage's 64-byte footer (pkg/chunked/internal/minimal, footerDataToBlob): the
     TOC's offset, compressed and raw length, the manifest type (1), the tar-split's offset,
     compressed and raw length, "GnUlInUx";
  4. the 40-byte footer the snapshotter reads, last: it reads only the blob's last 40 bytes
     (estargz/zstdchunked, ParseFooter: offset, compressed and raw length, type, magic; 0.12 and
     its main branch of 2026-08 alike), where the 64-byte one would give it the manifest type as
     the TOC's offset. containers/storage reads neither footer: it finds both frames from the
     layer's annotations (readZstdChunkedManifest), so the 64-byte one describes the blob for
     other readers, 48 bytes before the end.
Offsets are where a frame's compressed bytes start (its skippable frame's start + 8).

Chunks prefetched by copy (writer.py): a layer may carry, in a skippable frame before its
landmark, copies of chunks of large files that the start reads, so that the snapshotter's one
prefetch read fetches them with the start's whole files. Decoders pass over that frame, so the
diff is still the tar. Only the snapshotter may be told of the copies: containers/storage takes a
chunk's end to be the next chunk's offset (pkg/chunked/storage_linux.go, 1.43 and 1.57 alike), so
a file whose chunks lie in two places would read wrong. Such a layer therefore has two TOCs: the
snapshotter's (its copied chunks at their copies' offsets), found by the 40-byte footer and named
by the snapshotter's annotation, after containers/storage's (every chunk in its place), which its
annotations, the older names (Podman 4) and the 64-byte footer name.

Two annotation sets name the frames, and no one manifest can carry both: containers/storage's
(io.github.containers.zstd-chunked.*: the TOC's compressed digest and position, the tar-split's
position) and the snapshotter's, which checks the raw TOC's sha256 against eStargz's
ANNOTATION_TOC_DIGEST (it takes no other: fs/fs.go). containers/image >= 5.30 refuses a layer
with both ("both zstd:chunked and eStargz TOC found", storage's pkg/chunked/toc GetTOCDigest), in
every pull, partial or not. The snapshotter's set keeps the older io.containers.zstd-chunked.*
names, which its stargz-store and containers/storage up to 1.4x (Podman 4) read.

Frames are made by libzstd (the zstd CLI's library, on every Debian and in every image that
runs dpkg) through ctypes: its compression releases the GIL, so the writer's pool compresses
on every core, like zlib's gzip members.
"""

from __future__ import annotations

import ctypes
import hashlib
import ctypes.util
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import BadRequest

STORAGE_CHECKSUM = "io.github.containers.zstd-chunked.manifest-checksum"
STORAGE_POSITION = "io.github.containers.zstd-chunked.manifest-position"
STORAGE_TAR_SPLIT = "io.github.containers.zstd-chunked.tarsplit-position"
OLD_CHECKSUM = "io.containers.zstd-chunked.manifest-checksum"
OLD_POSITION = "io.containers.zstd-chunked.manifest-position"
SKIPPABLE_MAGIC = b"\x50\x2a\x4d\x18"
SKIPPABLE_HEADER = 8
FOOTER_MAGIC = b"GnUlInUx"
MANIFEST_TYPE_CRFS = 1
DEFAULT_LEVEL = 3  # zstd's own default, and BuildKit's


class NoLibzstd(BadRequest):
    template = ("--compression zstd:chunked compresses with libzstd, which is not on this host: "
                "install it (Debian: apt-get install libzstd1), or give --compression estargz")


class _Lib:
    """libzstd's calls the frames need, loaded once. Compression contexts are kept in a free list
    and reused by whichever thread compresses next: there are never more than the threads that
    compress at once, and none is lost when a writer's pool of threads ends."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        lib.ZSTD_compressBound.restype = ctypes.c_size_t
        lib.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
        lib.ZSTD_createCCtx.restype = ctypes.c_void_p
        lib.ZSTD_compressCCtx.restype = ctypes.c_size_t
        lib.ZSTD_compressCCtx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p,
                                          ctypes.c_size_t, ctypes.c_int]
        lib.ZSTD_isError.restype = ctypes.c_uint
        lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
        lib.ZSTD_getErrorName.restype = ctypes.c_char_p
        lib.ZSTD_getErrorName.argtypes = [ctypes.c_size_t]
        self.lib, self.free, self.lock = lib, list[int](), threading.Lock()

    def compress(self, data: bytes, level: int) -> bytes:
        with self.lock:
            context = self.free.pop() if self.free else None
        if context is None:
            context = self.lib.ZSTD_createCCtx()
            if not context:
                raise MemoryError("ZSTD_createCCtx")
        try:
            bound = self.lib.ZSTD_compressBound(len(data))
            out = ctypes.create_string_buffer(bound)
            size = self.lib.ZSTD_compressCCtx(context, out, bound, data, len(data), level)
        finally:
            with self.lock:
                self.free.append(context)
        if self.lib.ZSTD_isError(size):
            raise RuntimeError(f"zstd: {self.lib.ZSTD_getErrorName(size).decode()}")
        return ctypes.string_at(out, size)


_loaded: list[_Lib] = []
_loading = threading.Lock()


def _library() -> _Lib:
    with _loading:
        if not _loaded:
            path = ctypes.util.find_library("zstd")
            if path is None:
                raise NoLibzstd()
            try:
                _loaded.append(_Lib(path))
            except (OSError, AttributeError):
                raise NoLibzstd() from None
        return _loaded[0]


def check_available() -> None:
    """Refuses (exit 2) before any work where libzstd cannot be loaded."""
    _library()


def zstd_frame(pieces: Sequence[bytes], level: int) -> bytes:
    """One zstd frame of the pieces' bytes (with their size; deterministic for the bytes and level)."""
    return _library().compress(b"".join(pieces), level)


def skippable(payload: bytes) -> bytes:
    """A skippable frame around `payload`: decoders pass over it."""
    return SKIPPABLE_MAGIC + struct.pack("<I", len(payload)) + payload


@dataclass(frozen=True)
class Span:
    """Where a skippable frame's compressed payload lies in the blob, and its raw size."""
    offset: int
    compressed: int
    raw: int


@dataclass(frozen=True)
class Trailer:
    """The blob's bytes after the tar, and where its TOCs and tar-split lie."""
    data: bytes
    toc: Span
    """containers/storage's TOC (every chunk in its place)."""
    tar_split: Span
    toc_checksum: str
    """sha256:HEX of containers/storage's compressed TOC."""
    snapshotter_toc: Span
    """The TOC the last footer names: the snapshotter's (the same span as `toc` without copies)."""

    def storage_annotations(self) -> dict[str, str]:
        """containers/storage's: "offset:compressed:raw:type" and "offset:compressed:raw"."""
        return {STORAGE_CHECKSUM: self.toc_checksum, STORAGE_POSITION: _position(self.toc) + f":{MANIFEST_TYPE_CRFS}",
                STORAGE_TAR_SPLIT: _position(self.tar_split)}

    def old_annotations(self) -> dict[str, str]:
        """The older names of containers/storage's TOC's checksum and position (Podman 4, the
        snapshotter's store)."""
        return {OLD_CHECKSUM: self.toc_checksum, OLD_POSITION: _position(self.toc) + f":{MANIFEST_TYPE_CRFS}"}


def trailer(start: int, toc: bytes, toc_raw: int, tar_split: bytes, tar_split_raw: int,
            snapshotter_toc: tuple[bytes, int] | None = None) -> Trailer:
    """What follows the tar's last frame, which ends at blob offset `start`: the compressed TOC
    and tar-split, each in its skippable frame, the snapshotter's own compressed TOC (and its raw
    length) where it differs (chunks copied), then the two footers (the module's comment)."""
    toc_span = Span(start + SKIPPABLE_HEADER, len(toc), toc_raw)
    split_span = Span(toc_span.offset + len(toc) + SKIPPABLE_HEADER, len(tar_split), tar_split_raw)
    data = skippable(toc) + skippable(tar_split)
    snapshotter_span = toc_span
    if snapshotter_toc is not None:
        snapshotter_span = Span(split_span.offset + len(tar_split) + SKIPPABLE_HEADER, len(snapshotter_toc[0]),
                                snapshotter_toc[1])
        data += skippable(snapshotter_toc[0])
    storage_footer = struct.pack("<7Q", toc_span.offset, toc_span.compressed, toc_span.raw, MANIFEST_TYPE_CRFS,
                                 split_span.offset, split_span.compressed, split_span.raw) + FOOTER_MAGIC
    snapshotter_footer = struct.pack("<4Q", snapshotter_span.offset, snapshotter_span.compressed,
                                     snapshotter_span.raw, MANIFEST_TYPE_CRFS) + FOOTER_MAGIC
    data += skippable(storage_footer) + skippable(snapshotter_footer)
    return Trailer(data, toc_span, split_span, "sha256:" + hashlib.sha256(toc).hexdigest(), snapshotter_span)


def _position(span: Span) -> str:
    return f"{span.offset}:{span.compressed}:{span.raw}"
