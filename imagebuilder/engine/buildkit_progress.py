"""BuildKit's `--progress=plain` output parsed (PlainProgress). The plain progress names every
step as `[stage i/m] INSTRUCTION`; it becomes the same `Progress` events (step n/m over the whole
Dockerfile) the classic builder gives (classic_stream.py), and a failure the step it failed in.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .api import TAIL_LINES, Progress
from .dockerfile import is_from, parse_from
from .errors import LOST_RECORD, BuildFailed, EngineError, base_image_missing, classify_failure, lost_record

# BuildKit counts these instructions in a stage's `[i/m]`; ENV, LABEL, ... make no step.
_COUNTED = frozenset({"FROM", "RUN", "COPY", "ADD", "WORKDIR"})
_LINE = re.compile(r"^#(\d+) (.*)$")
_STEP = re.compile(r"^\[(?P<label>[^\]]*?)\s*(?P<i>\d+)/(?P<m>\d+)\] (?P<instruction>.*)$")
_OUTPUT = re.compile(r"^\d+\.\d+ (.*)$")
_MOUNT = re.compile(r"--mount=\S+\s+")
_METADATA = re.compile(r"^\[internal\] load metadata for (\S+)")
# An internal vertex's timed status line: "exporting layers 35.2s done", "unpacking to NAME 12.3s done".
_STATUS_DONE = re.compile(r"^(?P<what>.*?) (?P<seconds>\d+\.\d+)s done$")
_EXPORT_WORK = ("exporting layers", "unpacking to", "exporting cache", "writing layer")
QUIET_FOR = 2.0
"""Seconds without an event after which the build says again what is still going: the plain
output is silent while BuildKit compresses the layers and unpacks them (minutes for a torch
image). The printer writes at most one line per 10 s of these (ProgressPrinter.HEARTBEAT), so
with an event at least every ~3 s no silence on the screen lasts more than ~13 s."""


def dockerfile_stages(dockerfile: str) -> tuple[tuple[str, int], ...]:
    """(BuildKit's name of each stage, the steps BuildKit counts in it), in order.

    An unnamed stage is `stage-N` (N its index), as BuildKit labels it."""
    stages: list[tuple[str, int]] = []
    logical = re.sub(r"\\\n", " ", dockerfile)
    for line in logical.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        keyword = words[0].upper()
        if (stage := parse_from(line)) is not None:
            stages.append((stage.stage or f"stage-{len(stages)}", 1))
        elif keyword in _COUNTED and stages:
            name, count = stages[-1]
            stages[-1] = (name, count + 1)
    return tuple(stages)


@dataclass
class _Vertex:
    """One BuildKit vertex (#N); `step` is None for internal work (loading, exporting)."""

    name: str
    step: int | None = None
    instruction: str = ""
    cached: bool = False
    done: bool = False
    error: str | None = None
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))


class PlainProgress:
    """What `--progress=plain` said so far; pure, fed one line at a time.

    Steps are numbered over the whole Dockerfile (stage offsets from `dockerfile_stages`),
    so a two-stage build counts 1..m like the classic builder's `Step n/m`."""

    def __init__(self, dockerfile: str, started: float,
                 on_progress: Callable[[Progress], None] | None = None, export_note: str = "") -> None:
        self.stages = dockerfile_stages(dockerfile)
        self.total = sum(count for _, count in self.stages)
        self._offsets: dict[str, int] = {}
        offset = 0
        for index, (name, count) in enumerate(self.stages):
            self._offsets[name] = self._offsets[f"stage-{index}"] = offset
            offset += count
        self.started = started
        self.on_progress = on_progress
        self.vertices: dict[int, _Vertex] = {}
        self.trailer: list[str] = []  # the lines after the vertices: the CLI's final error
        self.export_note = export_note  # said with "exporting layers": how they are compressed
        self.activity: str | None = None  # the internal work going on (export, unpack), if any
        self.export_seconds = 0.0  # what BuildKit's export took: compressing, unpacking, caches
        self._said_at = started
        self._lock = threading.Lock()

    def feed(self, line: str) -> None:
        line = line.rstrip("\r\n")
        m = _LINE.match(line)
        if m is None:
            if line.strip() and line.strip() != "------":
                self.trailer.append(line.strip())
            return
        number, text = int(m[1]), m[2]
        vertex = self.vertices.get(number)
        if vertex is None:
            self.vertices[number] = vertex = self._new_vertex(text)
            if vertex.step is not None:
                self._emit(vertex, None)
            else:
                self._status(text)
            return
        if text == "CACHED":
            vertex.cached = True
            if vertex.step is not None:
                self._emit(vertex, None)
        elif text.startswith("DONE"):
            vertex.done = True
            if vertex.step is None:
                self.activity = None
        elif text.startswith("ERROR:"):
            vertex.error = text.removeprefix("ERROR:").strip()
        elif output := _OUTPUT.match(text):
            vertex.tail.append(output[1])
            if vertex.step is not None:
                self._emit(vertex, output[1])
        elif vertex.step is None:
            self._status(text)

    def _status(self, text: str) -> None:
        """An internal vertex's status line: what the build does between and after its steps."""
        done = _STATUS_DONE.match(text)
        if done is None:
            what = text + (f" ({self.export_note})" if self.export_note and text.startswith("exporting layers") else "")
            self.activity = what if text.startswith(_EXPORT_WORK) or text.startswith("exporting to") else None
            if self.activity is not None:
                self._announce()
            return
        if done["what"].startswith(_EXPORT_WORK):
            self.export_seconds += float(done["seconds"])
        self.activity = None

    def heartbeat(self) -> None:
        """After QUIET_FOR seconds without a line: what is still going (a step without output,
        the export), so the build is never silent for longer."""
        if time.monotonic() - self._said_at < QUIET_FOR:
            return
        running = self.current
        if running is not None:
            self._emit(running, None)
        else:
            self._announce()

    def _announce(self) -> None:
        if self.on_progress is not None and self.activity is not None:
            with self._lock:
                self._said_at = time.monotonic()
                self.on_progress(Progress(self.total, self.total, self.activity, self._said_at - self.started,
                                          False, None, activity=self.activity))

    def _new_vertex(self, name: str) -> _Vertex:
        step = _STEP.match(name)
        if step is None:
            return _Vertex(name)
        # The label is "[stage]", or "[platform stage]" in a build for several platforms.
        stage = next((w for w in step["label"].split() if "/" not in w), "stage-0")
        i, m = int(step["i"]), int(step["m"])
        # The mounts are how the step runs, not what it does: a progress line shows the latter.
        instruction = _MOUNT.sub("", step["instruction"])
        if stage in self._offsets:
            return _Vertex(name, step=self._offsets[stage] + i, instruction=instruction)
        # A Dockerfile this parser read differently from BuildKit: number within the stage.
        self.total = max(self.total, m)
        return _Vertex(name, step=i, instruction=instruction)

    def _emit(self, vertex: _Vertex, line: str | None) -> None:
        if self.on_progress is not None and vertex.step is not None:
            with self._lock:
                self._said_at = time.monotonic()
                self.on_progress(Progress(vertex.step, self.total, vertex.instruction,
                                          self._said_at - self.started, vertex.cached, line))

    # -- what the build came to

    @property
    def steps(self) -> list[_Vertex]:
        return [v for v in self.vertices.values() if v.step is not None]

    @property
    def cached_steps(self) -> int:
        return sum(1 for v in self.steps if v.cached)

    @property
    def executed_steps(self) -> int:
        return sum(1 for v in self.steps if v.done and not v.cached
                   and not is_from(v.instruction))

    @property
    def failed(self) -> _Vertex | None:
        return next((v for v in self.vertices.values() if v.error is not None), None)

    @property
    def current(self) -> _Vertex | None:
        """The last step that started and did not finish (a Ctrl-C or a timeout hit it)."""
        running = [v for v in self.steps if not v.done and not v.cached]
        return max(running, key=lambda v: v.step or 0) if running else None

    def error(self, rc: int, log_path: Path | None) -> EngineError:
        """The failure the output shows, as the classic builder's errors say it."""
        vertex = self.failed
        message = (vertex.error if vertex and vertex.error else None) or (
            self.trailer[-1] if self.trailer else f"the docker CLI exited with code {rc}")
        message = re.sub(r"^(ERROR: )?(failed to solve: )?", "", message)
        if vertex is not None:
            metadata = _METADATA.match(vertex.name)
            if metadata or is_from(vertex.instruction):
                base = metadata[1] if metadata else _from_image(vertex.instruction)
                return base_image_missing(base.removeprefix("docker.io/library/"), message)
        tail = tuple(vertex.tail) if vertex else tuple(self.trailer[-TAIL_LINES:])
        lost = (vertex is None or vertex.step is None) and lost_record(message)
        return BuildFailed(step=vertex.step if vertex else None, total=self.total or None,
                           instruction=vertex.instruction if vertex else None, error=message,
                           tail=tail, log_path=log_path, cause=LOST_RECORD if lost else classify_failure(message, tail))


def _from_image(instruction: str) -> str:
    line = parse_from(instruction)
    return (line.image if line else "") or instruction
