"""An image's registry cache, exported beside its verification.

publish exports each image's build cache to the registry (HOST/NS/imagebuilder-cache:KEY,
mode=min: the image's own blobs and every step's cache key): an empty builder builds from it,
and the image's push mounts its layers from there instead of uploading them (push.py).
Exported inside the image's build, that upload stood between the build and verify: 17.2 s of
a 110.5 s cold build of a torch runtime image (2.7 GB of zstd blobs to a local registry,
measured by bench/bench_publish.py), while verify, which took 45.6 s, does not need it; only
the push does.

So the image's build exports the image alone, and a second build of the same Dockerfile in
the same context, every step cached and every blob compressed already, exports the cache
only (`--output type=cacheonly`) in the background while verify runs. The push waits for it
before mounting; where it failed, the push uploads the layers itself and the outcome says so.
Whoever starts one waits for it or stops it: no build outlives the command.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..engine.api import BackgroundBuilder, BuildRequest, Running
from ..errors import ImageBuilderError

PROGRESS_EVERY = 15.0
"""Seconds between the lines that say the push still waits for the export."""


class CacheExport:
    """A registry cache export running in the background; the directory it builds from goes
    when it ends. One that fails is run once more (`again`: its blobs in the registry already
    are not uploaded twice): on a shared daemon another job's prune can pull a record from under
    a build, which then ends "failed to solve: not found" (seen once in seven exports here, with a
    prune running beside it)."""

    def __init__(self, running: Running, ref: str, log_path: Path | None, cleanup: Callable[[], None],
                 again: Callable[[], tuple[Running, Path | None]] | None = None) -> None:
        self.ref, self.log_path = ref, log_path
        self._running, self._cleanup, self._again = running, cleanup, again
        self._started = time.monotonic()
        self._rc: int | None = None
        self.seconds: float | None = None
        """How long it ran, once it has ended and been waited for."""

    def _ended(self, rc: int | None) -> bool:
        if rc is None:
            return False
        if rc != 0 and self._again is not None and self.seconds is None:
            again, self._again = self._again, None
            try:
                self._running, self.log_path = again()
                return False
            except ImageBuilderError:  # (the CLI gone since the first run): the first run's failure stands
                pass
        if self.seconds is None:
            # When it ended, not when it was seen to: the push may ask long after.
            self._rc, self.seconds = rc, (self._running.ended_at or time.monotonic()) - self._started
            self._cleanup()
        return True

    def wait(self, on_wait: Callable[[float], None] = lambda elapsed: None) -> str | None:
        """Wait for it to end, calling `on_wait` (seconds since it started) every 15 s while it
        runs; why it failed, or None when the cache is in the registry."""
        while not self._ended(self._running.wait(PROGRESS_EVERY)):
            on_wait(time.monotonic() - self._started)
        if self._rc == 0:
            return None
        return f"the export of its registry cache {self.ref} failed (exit {self._rc}; log: {self.log_path})"

    def stop(self) -> None:
        """End it now if it still runs (a failed or interrupted publish)."""
        if self.seconds is None:
            self._again = None  # stopped, not failed: no second run
            self._running.stop()
            rc = self._running.wait(0)
            self._ended(-1 if rc is None else rc)


def can_start(builder: object) -> bool:
    """Whether `builder` can export the cache in the background (BuildKit through buildx); where
    it cannot, the image's build exports the cache itself, as before."""
    return isinstance(builder, BackgroundBuilder) and builder.can_start()


def start_cache_export(builder: BackgroundBuilder, request: BuildRequest, cleanup: Callable[[], None]) -> CacheExport:
    """Start the cache-only build of `request`, whose export names the cache ref (and, if it
    fails, once more, logging beside the first: -2.log); `cleanup` runs once it has ended."""
    assert request.export is not None and request.export.cache_to is not None and not request.export.image

    def again() -> tuple[Running, Path | None]:
        log = request.log_path.with_name(request.log_path.stem + "-2.log") if request.log_path else None
        return builder.start(replace(request, log_path=log)), log

    return CacheExport(builder.start(request), request.export.cache_to, request.log_path, cleanup, again)
