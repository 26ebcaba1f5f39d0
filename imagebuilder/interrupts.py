"""Ctrl-C (and SIGTERM, what CI timeouts send) as the CLI takes them: the first raises
KeyboardInterrupt, so every container, temporary folder and intermediate image the command
started is removed on the way out (cli.py then prints "interrupted", exit 130); a second one,
pressed while that clean-up runs, exits at once."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

INTERRUPTED = 130


class _Handler:
    def __init__(self) -> None:
        self.pressed = False
        self.settled = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.settled:
            return
        if self.pressed:
            os.write(2, b"interrupted\n")
            os._exit(INTERRUPTED)
        self.pressed = True
        raise KeyboardInterrupt


_installed: list[_Handler] = []


def install() -> None:
    """Take SIGINT and SIGTERM as above (main thread only, as Python runs signal handlers)."""
    handler = _Handler()
    _installed.append(handler)
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def settle() -> None:
    """The command's work is done and meant to outlive it (a lazy mount serving on): a Ctrl-C
    from now on, while the command says so and exits, changes nothing (not an exit 130 with the
    work left behind). The signals are ignored by the OS from here on, not only by the handler:
    Python's shutdown puts its own handlers back to the default, so a Ctrl-C while the
    interpreter exits would otherwise kill the process (-SIGINT) after its work succeeded."""
    for handler in _installed:
        handler.settled = True
    if _installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
