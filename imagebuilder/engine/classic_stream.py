"""The classic builder's stream, parsed: `BuildState` is fed the Engine API's /build output one
chunk at a time and says each `Step n/m` as Progress, the images the build made, the tail of its
log and its base image. Pure: tested on canned output (classic.py drives the daemon)."""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable

from .api import TAIL_LINES, Progress
from .dockerfile import is_from, parse_from


_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_RUNNING_IN = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})$")
_LAYER = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
_BOOKKEEPING = re.compile(r"^( ---> |Removing intermediate container |Successfully (built|tagged) )")


class BuildState:
    """What the classic builder's stream said so far; pure, fed one stream chunk at a time."""

    def __init__(self, started: float, on_progress: Callable[[Progress], None] | None) -> None:
        self.started = started
        self.on_progress = on_progress
        self.step: int | None = None
        self.total = 0
        self.instruction = ""
        self.cached_steps = 0
        self.from_steps = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.containers: set[str] = set()
        self.last_layer: str | None = None
        self.stage_images: list[str] = []  # the last image of each finished build stage
        self._stage_layer: str | None = None
        self._step_cached = False
        self.image_id: str | None = None
        self._partial = ""

    def feed(self, text: str) -> None:
        # The classic builder sends "Step n/m : X" and its newline as two chunks, and a
        # RUN step's output arrives in whatever pieces the process wrote: split on lines.
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._line(line.rstrip("\r"))

    def flush(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""

    def _line(self, line: str) -> None:
        if m := _STEP.match(line):
            self.step, self.total, self.instruction = int(m[1]), int(m[2]), m[3]
            self.tail.clear()
            self._step_cached = False
            if is_from(self.instruction):
                self.from_steps += 1
                if self._stage_layer is not None:
                    self.stage_images.append(self._stage_layer)
                self._stage_layer = None
            self._emit(cached=False, line=None)
        elif line == " ---> Using cache":
            self.cached_steps += 1
            self._step_cached = True
            self._emit(cached=True, line=None)
        elif m := _RUNNING_IN.match(line):
            self.containers.add(m[1])
        elif m := _LAYER.match(line):
            self.last_layer = m[1]
            if not self.in_from_step:  # after FROM, " ---> id" is the base image itself
                # A stage served from cache was made by an earlier build, and a concurrent
                # build may be using it: only what this build made is this build's to remove.
                self._stage_layer = None if self._step_cached else m[1]
        elif m := re.match(r"^Successfully built ([0-9a-f]+)$", line):
            self.image_id = self.image_id or m[1]
        elif self.step is not None and not _BOOKKEEPING.match(line):
            self.tail.append(line)
            self._emit(cached=False, line=line)

    def _emit(self, *, cached: bool, line: str | None) -> None:
        if self.on_progress is not None and self.step is not None:
            self.on_progress(Progress(self.step, self.total, self.instruction,
                                      time.monotonic() - self.started, cached, line))

    def images_made(self) -> list[str]:
        """The last image of every stage so far, the unfinished one included: what a build
        that stops here leaves behind (each one's untagged parents go with it)."""
        return [*self.stage_images, *([self._stage_layer] if self._stage_layer else [])]

    @property
    def in_from_step(self) -> bool:
        return is_from(self.instruction)

    def base_image(self) -> str:
        line = parse_from(self.instruction)
        return (line.image if line else "") or self.instruction


# --------------------------------------------------------------------------- the builder
