"""Which builder a command uses, decided once, without building the images: BuildKit or classic.

Every path asks here (render, build, publish, and publish --dry-run), so what a dry run
renders, and so the inputs hash it compares with the registry, is what the run builds.
`decide()` answers the kind (which templates to render) and how BuildKit runs here;
`make_builder()` turns that decision into the builder that builds.

`auto` detects, it does not assume: a docker CLI whose `buildx version` answers builds
with `docker buildx build` (asked without a daemon); else one whose built-in BuildKit
really builds (Debian's 20.10 CLI does; a docker 23+ CLI without the buildx plugin refuses:
probed with an empty FROM scratch build to /dev/null); else the classic builder through the
Engine API (a remote daemon with only the API, a host without a BuildKit CLI).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import BadRequest
from ..trust.labels import PROBE
from .api import Builder, BuilderKind
from .buildkit import BuildKitBuilder, BuildKitCli
from .classic import ClassicBuilder
from .docker import DockerEngine

CHOICES = ("auto", "buildkit", "classic")
_PROBE_TIMEOUT = 60.0
# The smallest build there is: no base image, nothing written anywhere but /dev/null.
_PROBE_DOCKERFILE = f"FROM scratch\nLABEL {PROBE}=1\n"


class NoBuildKit(BadRequest):
    asked: str
    tried: str
    template = ("{asked} needs a docker CLI with BuildKit; none here builds with it "
                "(tried: {tried}); install the buildx plugin (docker-buildx-plugin) or use --builder classic")


def _asked(option: str, env: str, value: str) -> str:
    """How the user asked for `value`: the error names the setting they made (the environment
    variable, in CI), not an option they never typed."""
    return f"{env}={value}" if os.environ.get(env) == value else f"{option} {value}"


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
            if buildx_builder and _answers([docker, "context", "inspect", buildx_builder])[0]:
                # A docker context's own builder (buildx's docker driver on that engine): buildx
                # refuses `--builder CONTEXT` ("use `docker --context=CONTEXT buildx`").
                command = (docker, "--context", buildx_builder, "buildx", "build")
            elif buildx_builder:
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


@dataclass(frozen=True)
class Decision:
    """The builder a command will use: its kind, and for BuildKit the CLI that runs it."""

    kind: BuilderKind
    cli: BuildKitCli | None = None

    @property
    def buildx(self) -> bool:
        """BuildKit through buildx, which takes named build contexts (an old CLI's built-in one does not)."""
        return self.cli is not None and self.cli.buildx

    def describe(self) -> str:
        if self.cli is not None:
            return f"BuildKit ({self.cli.description or ' '.join(self.cli.command)})"
        return "the classic builder (Docker Engine API)"


CLASSIC = Decision("classic")


def decide(choice: str, buildx_builder: str | None = None) -> Decision:
    """The builder `--builder` asks for; `auto`: BuildKit when a CLI here builds with it."""
    if choice not in CHOICES:
        raise BadRequest(f"unknown builder {choice!r}; known: {', '.join(CHOICES)}")
    if choice == "classic":
        if buildx_builder:
            raise BadRequest(f"{_asked('--buildx-builder', 'BUILDX_BUILDER', buildx_builder)} needs a BuildKit builder, "
                             f"but {_asked('--builder', 'IMAGEBUILDER_BUILDER', choice)} asks for the classic one; "
                             "give --builder buildkit or auto")
        return CLASSIC
    cli, tried = detect_buildkit(buildx_builder or os.environ.get("BUILDX_BUILDER") or None)
    if cli is not None:
        return Decision("buildkit", cli)
    if choice == "buildkit" or buildx_builder:
        asked = (_asked("--builder", "IMAGEBUILDER_BUILDER", choice) if choice == "buildkit"
                 else _asked("--buildx-builder", "BUILDX_BUILDER", buildx_builder or ""))
        raise NoBuildKit(asked=asked, tried="; ".join(tried) or "no docker CLI on PATH")
    return CLASSIC


def kind_before_probing(choice: str) -> BuilderKind:
    """The builder `decide` picks, as far as it is known before probing for a CLI (which may ask
    a daemon): classic only when asked for; else BuildKit, which refuses nothing classic takes."""
    return CLASSIC.kind if choice == "classic" else "buildkit"


def decide_for_render(choice: str | None, foreign_platform: bool) -> Decision:
    """`render`: the builder asked for; none asked: classic (any `docker build` takes its
    Dockerfile), but BuildKit for another platform than the host's (only BuildKit builds that)."""
    if choice is None:
        return Decision("buildkit") if foreign_platform else CLASSIC  # rendered, not built: no CLI needed
    return decide(choice)


def make_builder(decision: Decision, engine: DockerEngine) -> Builder:
    """The builder that builds what `decision` rendered for."""
    if decision.cli is not None:
        return BuildKitBuilder(decision.cli, engine)
    if decision.kind == "buildkit":
        raise ValueError("a BuildKit decision without a CLI renders only; decide() the builder that builds")
    return ClassicBuilder(engine)
