"""Verified lazy reads of the squashfs blob: what the nbdkit plugin (nbdkit_plugin.py) serves.

A read is served from a local sparse cache file, chunk by chunk (chunks.py's 1 MiB chunks); a
chunk not there yet is fetched from the registry with a range GET (the registry client's auth
and retries), checked against the chunk table, written to the cache, and only then served: a
chunk whose sha256 differs raises ChunkCorrupt and is never served nor kept. Missing chunks
next to each other are fetched in one request. Each read also starts fetching the next
`readahead` chunks in the background (a squashfs read is mostly followed by the blocks after
it: a file's data blocks lie in a row), so a reader waits on the link only where it jumps.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..errors import ImageBuilderError
from .chunks import ChunkTable

READAHEAD = 2
"""Chunks fetched ahead of each read (8 MiB: 64 ms at 1 Gbit/s)."""
WORKERS = 4
"""Range GETs in flight for the readahead."""
LONGEST_GET = 8
"""Chunks one range GET asks for at most."""
RECENT = 32
"""Reads remembered to tell a read in a row (readahead) from a jump (none)."""


class CacheFailed(ImageBuilderError):
    template = "cannot write the lazy squashfs's cache {cache}: {detail}; free space on its disk, release and serve again"


class RangeReader(Protocol):
    """What the cache needs of a registry (registry.client.HttpRegistry)."""

    def blob_range(self, ref: str, digest: str, start: int, length: int) -> bytes: ...


class ChunkCache:
    def __init__(self, reader: RangeReader, ref: str, blob: str, table: ChunkTable, cache: Path, *,
                 readahead: int = READAHEAD, workers: int = WORKERS, say: Callable[[str], None] = print) -> None:
        self._reader, self._ref, self._blob, self._table = reader, ref, blob, table
        self._readahead = readahead
        self._say = say
        self._path = cache
        self._fd = os.open(cache, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, table.size)  # sparse: only fetched chunks take disk
        self._have = bytearray(len(table.digests))
        self._pending: dict[int, threading.Event] = {}
        self._recent: list[int] = []  # the last chunk of each of the latest reads
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="squashfs-readahead")
        self.fetched_bytes = 0
        self.requests = 0

    @property
    def size(self) -> int:
        return self._table.size

    def pread(self, offset: int, length: int) -> bytes:
        """Bytes offset..offset+length-1 of the squashfs, each of their chunks checked."""
        wanted = self._table.chunks(offset, length)
        self._ensure(wanted)
        window = self._window(wanted)
        if window:
            ahead = range(wanted[-1] + 1, min(wanted[-1] + 1 + window, len(self._table.digests)))
            claimed = self._claim(ahead)
            for run in _runs(claimed):
                self._pool.submit(self._fetch_quietly, run)
        return os.pread(self._fd, min(length, self._table.size - offset), offset)

    def _window(self, wanted: range) -> int:
        """Chunks to fetch ahead of a read of `wanted`: `readahead` where it continues a recent
        read (a file read in a row), none where it jumps (a few blocks of a big library)."""
        if not wanted or not self._readahead:
            return 0
        with self._lock:
            follows = any(wanted[0] - 1 <= last < wanted[-1] for last in self._recent)  # into the next chunk
            self._recent.append(wanted[-1])
            del self._recent[:-RECENT]
        return self._readahead if follows else 0

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        os.close(self._fd)

    def _ensure(self, wanted: range) -> None:
        """Every chunk of `wanted` in the cache: fetched here, or waited for where another
        thread fetches it (and fetched here where that one failed)."""
        while True:
            claimed = self._claim(wanted)
            for run in _runs(claimed):
                self._fetch(run)
            with self._lock:
                waiting = [self._pending[index] for index in wanted if not self._have[index] and index in self._pending]
                if not waiting and all(self._have[index] for index in wanted):
                    return
            for event in waiting:
                event.wait()

    def _claim(self, indexes: range) -> list[int]:
        """The chunks of `indexes` neither cached nor being fetched, now this thread's to fetch."""
        with self._lock:
            claimed = [index for index in indexes if not self._have[index] and index not in self._pending]
            for index in claimed:
                self._pending[index] = threading.Event()
            return claimed

    def _fetch(self, run: list[int]) -> None:
        """Fetch, check and cache the chunks of `run` (consecutive, claimed by this thread)."""
        try:
            start, _ = self._table.span(run[0])
            last_start, last_size = self._table.span(run[-1])
            data = self._reader.blob_range(self._ref, self._blob, start, last_start + last_size - start)
            with self._lock:
                self.requests += 1
            for index in run:
                begin, size = self._table.span(index)
                piece = data[begin - start:begin - start + size]
                self._table.check(index, piece, self._blob)
                try:
                    os.pwrite(self._fd, piece, begin)
                except OSError as e:
                    raise CacheFailed(cache=self._path, detail=e.strerror) from e
                with self._lock:  # the readahead's threads fetch beside the reads
                    self._have[index] = 1
                    self.fetched_bytes += size
        finally:
            with self._lock:
                for index in run:
                    self._pending.pop(index).set()

    def _fetch_quietly(self, run: list[int]) -> None:
        """A readahead: a failure leaves the chunks to the read that needs them, which says why."""
        try:
            self._fetch(run)
        except Exception:  # noqa: BLE001 - the read that needs the chunk fetches it again and raises
            pass


def _runs(indexes: list[int]) -> list[list[int]]:
    """Consecutive indexes grouped, each group at most LONGEST_GET long."""
    runs: list[list[int]] = []
    for index in indexes:
        if runs and runs[-1][-1] == index - 1 and len(runs[-1]) < LONGEST_GET:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs
