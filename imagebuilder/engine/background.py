"""The docker CLI as a process of its own: stopped as a terminal's Ctrl-C stops it (SIGINT, so
the CLI cancels the solve in the daemon, then a kill), and, for a build started in the background
(BuildKitBuilder.start), waited for against its deadline, its end stamped as it happens."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from typing import Any

_STOP_GRACE = 10.0  # seconds the CLI gets to cancel the build before it is killed


class BackgroundBuild:
    """A build BuildKitBuilder.start() started: waited for, or stopped as a Ctrl-C stops one."""

    def __init__(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        self._proc, self._deadline = proc, deadline
        self._ended: float | None = None
        threading.Thread(target=self._watch, name="imagebuilder-background-build", daemon=True).start()

    def _watch(self) -> None:
        self._proc.wait()
        self._ended = time.monotonic()

    @property
    def ended_at(self) -> float | None:
        return self._ended

    def wait(self, timeout: float | None = None) -> int | None:
        left = self._deadline - time.monotonic()
        try:
            return self._proc.wait(timeout=left if timeout is None else max(0.0, min(timeout, left)))
        except subprocess.TimeoutExpired:
            if time.monotonic() < self._deadline:
                return None
        self.stop()  # past its deadline
        return self._proc.returncode

    def stop(self) -> None:
        stop(self._proc)


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGINT first: the CLI then cancels the solve in the daemon, as on a terminal."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=_STOP_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
