"""What a long build or push shows meanwhile: the builder's steps as one updating line per step
(ProgressPrinter, over engine.api's Progress), and sizes as people read them (human_size)."""

from __future__ import annotations

import re
import sys
from typing import Any

from .api import Progress


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{size} B"
        value /= 1000
    return f"{size} B"


class ProgressPrinter:
    """Step n/m, the instruction and the elapsed time: one updating line per step on a
    terminal, plain lines elsewhere (CI logs)."""

    HEARTBEAT = 10.0  # seconds between lines for a long step, when not on a terminal

    def __init__(self, label: str, stream: Any = None, tty: bool | None = None) -> None:
        self.label = label
        self.printed_at = 0.0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.step = 0
        self.activity: str | None = None
        self.width = 0

    def __call__(self, p: Progress) -> None:
        instruction = re.sub(r"\s+", " ", p.instruction)
        if p.activity is not None:
            text = f"[{self.label}] {p.activity[:90]}"
        else:
            text = f"[{self.label}] step {p.step}/{p.total} {instruction[:70]}"
            text += " (cached)" if p.cached else ""
        if self.tty:
            line = f"{text} {p.elapsed:6.1f}s"
            if (p.step != self.step or p.activity != self.activity) and self.step:
                self.stream.write("\n")
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
            self.stream.flush()
        elif p.step != self.step or p.activity != self.activity or p.elapsed - self.printed_at >= self.HEARTBEAT:
            still = "" if p.step != self.step or p.activity != self.activity else " still running"
            self.stream.write(f"{text}{still} at {p.elapsed:.1f}s\n")
            self.stream.flush()
            self.printed_at = p.elapsed
        self.step = p.step
        self.activity = p.activity

    def close(self) -> None:
        if self.tty and self.step:
            self.stream.write("\n")
            self.stream.flush()
