"""What the rest of imagebuilder sees of a container engine: value objects and small protocols.

Each protocol is sized to its callers: a `Builder` turns a context into an image (build/run.py,
publish.py), an `ImageStore` answers about local images (build/run.py, lock/base_pin.py, verify.py), a
`Runner` runs a container (verify.py), a `Pusher` pushes (publish.py), an `ImageInspector`
reads an image's config (buildkit.py, publish.py). `DockerEngine`
(docker.py) is all of the last three; the builders are classic.py and buildkit.py, and
select.py is the one place that decides which builder a command uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from .errors import EngineError
from .export import Export

BuilderKind = Literal["buildkit", "classic"]
TAIL_LINES = 30
"""Output lines of a failed step an error keeps."""


@dataclass(frozen=True)
class BuildRequest:
    context: Path
    """Directory holding the Dockerfile and the files it copies."""
    tags: tuple[str, ...]
    """All applied only when the build succeeds; the first is the primary."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Applied at build time (the classic builder adds them as a last LABEL step)."""
    dockerfile: str = "Dockerfile"
    nocache: bool = False
    pull: bool = False
    log_path: Path | None = None
    timeout: float = 3600
    buildargs: Mapping[str, str] = field(default_factory=dict)
    platform: str | None = None
    """os/arch to build for (linux/arm64); None: the daemon's own."""
    secrets: Mapping[str, Path] = field(default_factory=dict)
    """Build secrets by id (BuildKit's `RUN --mount=type=secret,id=...`); in no layer."""
    contexts: Mapping[str, Path] = field(default_factory=dict)
    """Named build contexts (buildx's `--build-context NAME=DIR`, `RUN --mount=...,from=NAME`)."""
    export: Export | None = None
    """BuildKit only: compression, provenance and registry caches; None: `--load`."""


def check_request(req: BuildRequest) -> None:
    """What every builder needs before it starts: a tag and a rendered Dockerfile."""
    if not req.tags:
        raise ValueError("BuildRequest.tags must name at least one tag")
    if not (req.context / req.dockerfile).is_file():
        raise EngineError(f"no {req.dockerfile} in the build context {req.context}; "
                          "render the Dockerfile first")


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    size: int
    seconds: float
    steps: int
    cached_steps: int
    executed_steps: int
    """Steps that ran (neither FROM nor served from cache); 0 for a fully cached build."""
    log_path: Path | None
    export_seconds: float | None = None
    """BuildKit: the seconds its export took (compressing the layers, unpacking them into the
    image store); None where the builder does not say."""
    removed: tuple[str, ...] = ()
    """Images this build made and nobody asked for, removed after it: the earlier stages of a
    multi-stage build, and the image a rebuilt tag pointed at before when no tag is left on it."""


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    instruction: str
    elapsed: float
    """Seconds since the build started."""
    cached: bool
    line: str | None
    """An output line of the step; None for the event that starts (or caches) the step."""
    activity: str | None = None
    """Work between or after the steps (BuildKit's export: compressing the layers, unpacking
    them into the image store) still going after `elapsed` seconds; None: a step's event."""


@dataclass(frozen=True)
class Pushed:
    digest: str
    """The manifest (or index) digest the registry stored."""
    uploaded: frozenset[str]
    """The short ids (12 hex digits) of the blobs this push uploaded, as the daemon names them."""

    def uploaded_bytes(self, blobs: Mapping[str, tuple[int, str]]) -> int:
        """The bytes uploaded, given the pushed image's blobs (digest -> (size, media type))."""
        return sum(size for digest, (size, _) in blobs.items()
                   if digest.removeprefix("sha256:")[:12] in self.uploaded)


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    output: str
    """stdout and stderr together; lines of the two streams may come out of order."""
    timed_out: bool
    seconds: float


@dataclass(frozen=True)
class HostAccess:
    """What a container is given of its host beyond Docker's defaults: device paths (a
    directory gives every device in it), ulimits (-1: unlimited) and added capabilities."""

    devices: tuple[str, ...] = ()
    ulimits: tuple[tuple[str, int], ...] = ()
    capabilities: tuple[str, ...] = ()

    def flags(self) -> str:
        """As `docker run` takes them: "--device /dev/infiniband --ulimit memlock=-1 --cap-add IPC_LOCK"."""
        return " ".join([*(f"--device {path}" for path in self.devices),
                         *(f"--ulimit {name}={value}" for name, value in self.ulimits),
                         *(f"--cap-add {name}" for name in self.capabilities)])

    def lacks(self, wanted: HostAccess) -> HostAccess:
        """What of `wanted` this does not give."""
        return HostAccess(tuple(d for d in wanted.devices if d not in self.devices),
                          tuple(u for u in wanted.ulimits if u not in self.ulimits),
                          tuple(c for c in wanted.capabilities if c not in self.capabilities))

    def __bool__(self) -> bool:
        return bool(self.devices or self.ulimits or self.capabilities)


NO_ACCESS = HostAccess()
"""Docker's defaults: no device, ulimit or capability added."""

OnProgress = Callable[[Progress], None]


class Builder(Protocol):
    """Turns a build context into a tagged image."""

    @property
    def kind(self) -> BuilderKind:
        """Which templates the images it builds are rendered for."""
        ...

    def describe(self) -> str: ...

    def build(self, req: BuildRequest, on_progress: OnProgress | None = None) -> BuildResult: ...


class Running(Protocol):
    """A build started in the background (BackgroundBuilder.start)."""

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit code once it has ended; None while it still runs after `timeout` seconds."""
        ...

    def stop(self) -> None:
        """End it now if it still runs (nothing of it outlives its caller)."""
        ...

    @property
    def ended_at(self) -> float | None:
        """When it ended (time.monotonic()), seen as it happened; None while it runs."""
        ...


@runtime_checkable
class BackgroundBuilder(Protocol):
    """A builder that can run a build beside other work, its output to its log only."""

    def can_start(self) -> bool:
        """Whether this one can (BuildKit's builtin `docker build` cannot: no cache-only output)."""
        ...

    def start(self, req: BuildRequest) -> Running: ...


class ImageStore(Protocol):
    """The engine's local images, as a build uses them (build/run.py, lock/base_pin.py)."""

    def image_exists(self, ref: str) -> bool: ...

    def image_labels(self, ref: str) -> dict[str, str]: ...

    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        """(image id, RepoDigests), None when the engine has no such image."""
        ...

    def read_file(self, image: str, path: str, *, platform: str | None = None) -> bytes | None: ...

    def remove_image(self, ref: str, force: bool = True) -> None: ...

    def tag_image(self, source: str, ref: str) -> None:
        """`ref` names `source` (an image id or another ref) from now on."""
        ...


class ImageInspector(Protocol):
    """What a builder that builds outside the SDK reads back (buildkit.py)."""

    def ping(self) -> None: ...

    def inspect_image(self, ref: str) -> dict[str, Any]: ...


class Runner(Protocol):
    """Containers of an image, run and always removed after (verify.py)."""

    def ping(self) -> None: ...

    def info(self) -> dict[str, Any]:
        """The daemon's `docker info` (runtimes, CDI devices, ...); {} when it will not say."""
        ...

    def image_exists(self, ref: str) -> bool: ...

    def image_labels(self, ref: str) -> dict[str, str]: ...

    def pull(self, ref: str) -> None: ...

    def run(self, image: str, command: Sequence[str] | str, *, timeout: float,
            gpus: bool = False, shm_size: str | None = None,
            environment: Mapping[str, str] | None = None,
            volumes: Mapping[str, str] | None = None, workdir: str | None = None,
            archives: Mapping[str, bytes] | None = None,
            on_output: Callable[[str], None] | None = None, access: HostAccess = NO_ACCESS) -> RunResult:
        """`on_output`, when given, is told each line the container prints as it comes; `access`
        is what the container is given of the host (devices, ulimits, capabilities)."""
        ...


class Pusher(Protocol):
    """Images to and from a registry, through the engine (publish.py)."""

    def pull(self, ref: str) -> None: ...

    def push(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> str:
        """Push `ref`; the manifest digest the registry stored."""
        ...

    def push_counted(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> Pushed:
        """push(), also saying which blobs this push uploaded (publish reports the bytes)."""
        ...


class Engine(ImageStore, ImageInspector, Runner, Pusher, Protocol):
    """The whole engine, as publish uses it: builds' images, smoke tests' containers, pushes,
    and an image's config (publish compares it with the registry's before pushing)."""
