"""zstd:chunked's bytes, as the stargz snapshotter's reader (estargz/zstdchunked, 0.12+) reads them.

The same layout as eStargz (toc.py), with zstd frames for gzip members: every chunk of a file's
content starts a frame, so the blob still decompresses to the layer's tar with any zstd reader
(Docker >= 23, containerd >= 1.5 pull it as plain zstd), while the snapshotter decompresses a
chunk from its TOC offset alone. The end differs: the tar's end blocks are the last frame, then
the TOC JSON, zstd-compressed, in a skippable frame (no tar entry: decoders skip it, so it is not
in the diff), then a skippable frame holding the 40-byte footer: the compressed TOC's offset,
its compressed and raw sizes, the manifest type (1: this CRFS-style TOC) and "GnUlInUx".
The layer's annotations name the compressed TOC's digest and position (containers/storage's
names); the snapshotter checks the raw TOC's sha256 against ANNOTATION_TOC_DIGEST, as for eStargz.

Frames are made by libzstd (the zstd CLI's library, on every Debian and in every image that
runs dpkg) through ctypes: its compression releases the GIL, so the writer's pool compresses
on every core, like zlib's gzip members.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
import threading
from collections.abc import Sequence

from ..errors import BadRequest

MANIFEST_CHECKSUM = "io.containers.zstd-chunked.manifest-checksum"
MANIFEST_POSITION = "io.containers.zstd-chunked.manifest-position"
SKIPPABLE_MAGIC = b"\x50\x2a\x4d\x18"
FOOTER_MAGIC = b"GnUlInUx"
FOOTER_SIZE = 40
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


def footer(toc_offset: int, compressed: int, raw: int) -> bytes:
    """The last 48 bytes: a skippable frame of the 40-byte footer. `toc_offset` is where the
    compressed TOC's bytes start (its skippable frame's start + 8)."""
    return skippable(struct.pack("<QQQQ", toc_offset, compressed, raw, MANIFEST_TYPE_CRFS) + FOOTER_MAGIC)


def position(toc_offset: int, compressed: int, raw: int) -> str:
    """MANIFEST_POSITION's value: "offset:compressed:raw:type"."""
    return f"{toc_offset}:{compressed}:{raw}:{MANIFEST_TYPE_CRFS}"
