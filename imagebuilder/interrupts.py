"""Ctrl-C (and SIGTERM, what CI timeouts send) as the CLI takes them: the first raises
KeyboardInterrupt, so every container, temporary folder and intermediate image the command
started is removed on the way out (cli.py then prints "interrupted", exit 130); a second one,
pressed while that clean-up runs, exits at once."""

from __future__ import annotations

import os
import signal
from types import FrameType

INTERRUPTED = 130


class _Handler:
    def __init__(self) -> None:
        self.pressed = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.pressed:
            os.write(2, b"interrupted\n")
            os._exit(INTERRUPTED)
        self.pressed = True
        raise KeyboardInterrupt


def install() -> None:
    """Take SIGINT and SIGTERM as above (main thread only, as Python runs signal handlers)."""
    handler = _Handler()
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
