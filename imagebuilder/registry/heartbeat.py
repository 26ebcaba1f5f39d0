"""Long work is never silent: a call every few seconds on a thread of its own while a block runs
(the registry client's unanswered tries, the squashfs's unpacking and mksquashfs)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def every(seconds: float, call: Callable[[], None], name: str = "heartbeat") -> Iterator[None]:
    """`call` every `seconds` while the body runs, on a daemon thread named `name`."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(seconds):
            call()

    thread = threading.Thread(target=beat, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
