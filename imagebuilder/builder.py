"""The narrow builder interface and the choice of builder: BuildKit where it works, else classic.

A builder turns a build context into a tagged image: `build(BuildRequest) -> BuildResult`
(the request carries the context, tags, platform and secrets; the result the image id and
the log). Running, inspecting, tagging and pushing stay with the Docker SDK (engine.py).

`auto` detects, it does not assume: a docker CLI whose `buildx version` answers builds
with `docker buildx build`; else one whose built-in BuildKit really builds (Debian's 20.10
CLI does; a docker 23+ CLI without the buildx plugin refuses); else the classic builder
through the Engine API (a remote daemon with only the API, a host without a BuildKit CLI).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Protocol

from .buildkit import BuildKitBuilder, BuildKitCli
from .engine import BuildRequest, BuildResult, DockerEngine, Progress
from .errors import BadRequest

CHOICES = ("auto", "buildkit", "classic")
_PROBE_TIMEOUT = 60.0
# The smallest build there is: no base image, nothing written anywhere but /dev/null.
_PROBE_DOCKERFILE = "FROM scratch\nLABEL io.imagebuilder.probe=1\n"


class Builder(Protocol):
    name: str
    """"buildkit" or "classic": which templates the images it builds are rendered with."""

    def describe(self) -> str: ...

    def build(self, req: BuildRequest,
              on_progress: Callable[[Progress], None] | None = None) -> BuildResult: ...


class ClassicBuilder:
    """The Engine API's classic builder, as docker-py drives it (engine.py)."""

    name = "classic"

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine

    def describe(self) -> str:
        return "the classic builder (Docker Engine API)"

    def build(self, req: BuildRequest,
              on_progress: Callable[[Progress], None] | None = None) -> BuildResult:
        return self.engine.build(req, on_progress)


class NoBuildKit(BadRequest):
    tried: str
    template = ("--builder buildkit needs a docker CLI with BuildKit; none here builds with it "
                "(tried: {tried}); install the buildx plugin (docker-buildx-plugin) or use --builder classic")


def docker_clis() -> list[str]:
    """Every docker executable on PATH, in PATH order (`type -a docker`), each file once."""
    found: list[str] = []
    seen: set[str] = set()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = shutil.which("docker", path=folder or ".")
        if path and os.path.realpath(path) not in seen:
            seen.add(os.path.realpath(path))
            found.append(path)
    return found


def _answers(argv: list[str], env: dict[str, str] | None = None, stdin: str | None = None) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env,
                              timeout=_PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    lines = (done.stderr or done.stdout).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else f"exit code {done.returncode}"


@functools.lru_cache(maxsize=8)
def detect_buildkit(buildx_builder: str | None = None) -> tuple[BuildKitCli | None, tuple[str, ...]]:
    """The first working BuildKit CLI here, and what was tried (for the error without one).

    `buildx_builder` (or BUILDX_BUILDER, which buildx reads itself) names a buildx builder
    instance, a remote BuildKit say; only buildx can use one."""
    tried: list[str] = []
    clis = docker_clis()
    for docker in clis:
        ok, said = _answers([docker, "buildx", "version"])
        if ok:
            command: tuple[str, ...] = (docker, "buildx", "build")
            if buildx_builder:
                command += ("--builder", buildx_builder)
            return BuildKitCli(command, description=f"{docker} buildx, {said}"), tuple(tried)
        tried.append(f"{docker} buildx: {said}")
    if buildx_builder:
        return None, (*tried, f"--buildx-builder {buildx_builder} needs the buildx plugin")
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    for docker in clis:
        ok, said = _answers([docker, "build", "--progress=plain", "--output", "type=tar,dest=/dev/null", "-"],
                            env=env, stdin=_PROBE_DOCKERFILE)
        if ok:
            return BuildKitCli((docker, "build"), buildkit_env=True,
                               description=f"DOCKER_BUILDKIT=1 {docker} build"), tuple(tried)
        tried.append(f"DOCKER_BUILDKIT=1 {docker} build: {said}")
    return None, tuple(tried)


def select_builder(choice: str, engine: DockerEngine, buildx_builder: str | None = None) -> Builder:
    """The builder `--builder` asks for; `auto`: BuildKit when a CLI here builds with it."""
    if choice not in CHOICES:
        raise BadRequest(f"unknown builder {choice!r}; known: {', '.join(CHOICES)}")
    if choice == "classic":
        if buildx_builder:
            raise BadRequest("--buildx-builder needs --builder buildkit or auto")
        return ClassicBuilder(engine)
    cli, tried = detect_buildkit(buildx_builder or os.environ.get("BUILDX_BUILDER") or None)
    if cli is not None:
        return BuildKitBuilder(cli, engine)
    if choice == "buildkit" or buildx_builder:
        raise NoBuildKit(tried="; ".join(tried) or "no docker CLI on PATH")
    return ClassicBuilder(engine)

