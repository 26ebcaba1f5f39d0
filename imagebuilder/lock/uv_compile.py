"""Resolving one lock: an image's requirements -> a Lock, through uv.

The resolver is uv (`uv pip compile` for a target Python and platform: nothing is
installed). `imagebuilder lock` (lock/command.py) runs it for each distinct lock of a selection.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadRequest
from ..matrix.model import Matrix
from ..matrix.resolve import BuildSpec
from ..platforms import DEFAULT_PLATFORM, PLATFORMS
from .lockfile import (SEED, Lock, LockError, index_args, lock_name, parse_lock,
                       requirements)


class ResolutionFailed(LockError):
    name: str
    requirements: str
    detail: str
    template = "cannot lock {name} ({requirements}): {detail}"

    @property
    def unsatisfiable(self) -> bool:
        """The requirements contradict each other (uv proved it): the request, not the index's answer."""
        return "No solution found" in self.detail or "unsatisfiable" in self.detail


class BadUv(BadRequest):
    template = "--uv {uv} is not a uv executable ({why}); pass the path of uv, or leave --uv out"


@dataclass(frozen=True)
class LockRequest:
    spec: BuildSpec
    extras: tuple[str, ...] = ()
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    platform: str = DEFAULT_PLATFORM


Resolver = Callable[[LockRequest, Sequence[str], "Lock | None"], str]
"""(request, requirements, constraints lock) -> uv's compiled requirements text."""

UV_TIMEOUT_S = 600

def default_uv() -> str:
    """The uv beside this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else (shutil.which("uv") or "uv")


class UvCompile:
    """The resolver: `uv pip compile` for the image's Python and platform, with hashes.

    A context manager: its one temporary folder (the constraint files) and every uv it started
    are gone when it exits, however it exits (Ctrl-C, SIGTERM, an error in another thread).
    Calls may come from several threads at once."""

    def __init__(self, uv: str) -> None:
        self.uv = uv
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._running: set[subprocess.Popen[str]] = set()
        self._guard = threading.Lock()
        self._closed = False
        self._count = 0

    def __enter__(self) -> UvCompile:
        self._tmp = tempfile.TemporaryDirectory(prefix="imagebuilder-lock-")
        return self

    def __exit__(self, *exc: object) -> None:
        with self._guard:
            self._closed = True
            running = list(self._running)
        for process in running:
            process.kill()
        for process in running:
            process.wait()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _start(self, cmd: list[str]) -> subprocess.Popen[str]:
        with self._guard:
            if self._closed:
                raise KeyboardInterrupt  # the run is being stopped: start nothing more
            try:
                process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
            except FileNotFoundError as e:
                raise LockError(f"uv not found at {self.uv}; install uv (matrix.yaml's tools.uv) or pass --uv PATH") from e
            except OSError as e:  # not a program: a text file, no exec permission, another arch
                raise BadUv(uv=self.uv, why=e.strerror or str(e)) from e
            self._running.add(process)
            return process

    def __call__(self, request: LockRequest, reqs: Sequence[str], constraints: Lock | None) -> str:
        assert self._tmp is not None, "use UvCompile as a context manager"
        spec = request.spec
        name = lock_name(spec, request.extras, request.platform)
        # --no-build (a lock is of wheels) and --no-python-downloads: otherwise uv fetches a
        # Python of the target version from GitHub to build sdists with, on every call, and
        # behind a proxy that serves only the index it spends ~45 s in retries each time.
        cmd = [self.uv, "pip", "compile", "--no-config", "--generate-hashes", "--no-header",
               "--no-annotate", "--no-build", "--no-python-downloads", "--python-version", str(spec.python),
               "--python-platform", PLATFORMS[request.platform].uv_platform]
        for option, value in index_args(spec, request.index_url, request.extra_index_urls):
            cmd += [option, value]
        if constraints is not None:
            with self._guard:
                self._count += 1
                path = os.path.join(self._tmp.name, f"constraints-{self._count}.txt")
            Path(path).write_text(constraints.text())
            cmd += ["--constraint", path]
        cmd.append("-")
        process = self._start(cmd)
        try:
            out, err = process.communicate("\n".join(reqs) + "\n", timeout=UV_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            process.kill()
            process.communicate()
            raise ResolutionFailed(name=name, requirements=" ".join(reqs), detail=f"uv took over {UV_TIMEOUT_S} s") from e
        finally:
            with self._guard:
                self._running.discard(process)
        if process.returncode != 0:
            if self._closed:
                raise KeyboardInterrupt
            # From uv's last `error:` on: what precedes it is noise (a failed download of a
            # Python to build sdists with, say), what follows is the resolver's explanation.
            lines = err.strip().splitlines()
            start = max((n for n, line in enumerate(lines) if line.startswith("error:")), default=0)
            detail = " ".join(line.strip() for line in lines[start:])
            raise ResolutionFailed(name=name, requirements=" ".join(reqs),
                                   detail=detail or f"uv exited {process.returncode}")
        return out


def resolve_lock(request: LockRequest, matrix: Matrix, resolver: Resolver, parent: Lock | None = None) -> Lock:
    """The image's complete locked set, the seed packages included (the venv is made without
    uv's unpinned ones). A jupyter image resolves JupyterLab under its runtime image's lock
    as constraints and keeps only what that adds."""
    spec = request.spec
    reqs = requirements(spec, matrix, request.extras)
    asked = reqs if spec.parent is not None else [*reqs, *SEED]
    compiled = parse_lock("compiled", resolver(request, asked, parent))
    pins = compiled.pins
    if parent is not None:
        have = {(p.name, p.version) for p in parent.pins}
        pins = tuple(p for p in pins if (p.name, p.version) not in have)
    return Lock(name=lock_name(spec, request.extras, request.platform), requirements=tuple(asked),
                platform=PLATFORMS[request.platform].uv_platform, python=str(spec.python), pins=pins)
