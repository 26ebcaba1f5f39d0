"""How much of each file a start read: the file's pages in the page cache, dropped before the
start and counted after it (mincore(2)).

strace sees which files a start opens, not which of their bytes it reads: a shared library is
mapped, and only the pages its loader relocates and its code runs are faulted in. A CUDA
library of 500 MB whose import touches a few MB would, prefetched whole, cost a lazy node more
than the on-demand reads it saves. So before the start runs, every regular file of the
container's root is dropped from the page cache (posix_fadvise DONTNEED: only those files, not
the host's cache); after it, a stopped container of the same image maps each opened file and
asks mincore which pages are resident. Overlay files share the page cache of the layer files
under them, so the second container sees what the first one read (plus the kernel's readahead,
which a lazy node's chunked fetches also read around).

The answer is counted per CHUNK (the eStargz chunk size: what the snapshotter fetches on a
miss): the bytes of the chunks the start touched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from .trace import NOT_FILES as KERNEL_FILES

CHUNK = 4 << 20
NOT_FILES = tuple(path.strip("/") for path in KERNEL_FILES)  # (the folders' names under a root)

_PROT_READ, _MAP_SHARED = 0x1, 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
PAGE = os.sysconf("SC_PAGE_SIZE")


def drop(root: Path) -> int:
    """Drop every regular file under `root` (a container's root, /proc/PID/root) from the page
    cache, not following links and leaving out the kernel's file systems; how many files."""
    dropped = 0
    for folder, folders, files in os.walk(root, followlinks=False):
        if Path(folder) == root:
            folders[:] = [name for name in folders if name not in NOT_FILES]
        for name in files:
            try:
                fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue  # a socket, a fifo, a link, unreadable: nothing of the layers' bytes
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                dropped += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return dropped


def touched(path: str | Path, chunk: int = CHUNK) -> tuple[int, int]:
    """(size, bytes of the `chunk`-sized pieces of which any page is in the page cache)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # (an absolute link would leave the container's root)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        address = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            pages = (size + PAGE - 1) // PAGE
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            resident = bytes(vector)
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)
    return size, chunks_touched(resident, size, chunk)


def chunks_touched(resident: bytes, size: int, chunk: int = CHUNK) -> int:
    """Pure: the bytes of the chunks of a `size`-byte file with any page resident (mincore's
    vector, a byte a page, bit 0 set where resident)."""
    per_chunk = max(1, chunk // PAGE)
    total = 0
    for first in range(0, len(resident), per_chunk):
        if any(page & 1 for page in resident[first:first + per_chunk]):
            start = first * PAGE
            total += min(size, start + per_chunk * PAGE) - start
    return total


def reads(root: Path, paths: Iterable[str], chunk: int = CHUNK) -> Mapping[str, tuple[int, int]]:
    """Each of `paths` (container paths) that is a regular file under `root` -> touched()."""
    found: dict[str, tuple[int, int]] = {}
    for path in paths:
        try:
            found[path] = touched(root / path.lstrip("/"), chunk)
        except OSError:
            continue  # gone, or not a regular file in this image: the profile keeps it unmeasured
    return found
