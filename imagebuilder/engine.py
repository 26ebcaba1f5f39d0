"""The only module that talks to the Docker Engine: build, run, push, pull, inspect.

Everything else sees the `Engine` protocol and the value objects below, so another engine
(`docker buildx`, podman) can be added in one file. `docker` is imported lazily:
`imagebuilder --help` must work on a machine without the SDK's dependencies loaded.

Builds use the Engine API's classic builder (what docker-py drives), streamed, so the
progress of every `Step n/m` reaches the caller and every line reaches the log file.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from imagebuilder.errors import ImageBuilderError

if TYPE_CHECKING:
    import docker
    import requests

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
TAIL_LINES = 30


# --------------------------------------------------------------------------- errors


class EngineError(ImageBuilderError):
    """A container-engine operation failed."""


class DaemonUnavailable(EngineError):
    def __init__(self, base_url: str, reason: str) -> None:
        self.base_url = base_url
        self.reason = reason
        super().__init__(
            f"could not reach the Docker daemon at {base_url}: {reason}; start it with "
            "`sudo systemctl start docker` or `dockerd &`, or point DOCKER_HOST at a running one"
        )


class BaseImageMissing(EngineError):
    def __init__(self, image: str, detail: str) -> None:
        self.image = image
        self.detail = detail
        super().__init__(
            f"base image {image} is not available locally and could not be pulled ({detail}); "
            "build or pull it first, or pass --base-image with one that exists"
        )


class BuildFailed(EngineError):
    """A build step failed. `cause` is "disk-full", "network" or None (the step itself)."""

    def __init__(
        self,
        *,
        step: int | None,
        total: int | None,
        instruction: str | None,
        error: str,
        tail: tuple[str, ...],
        log_path: Path | None,
        cause: str | None = None,
    ) -> None:
        self.step = step
        self.total = total
        self.instruction = instruction
        self.error = error
        self.tail = tail
        self.log_path = log_path
        self.cause = cause
        exit_code = re.search(r"returned a non-zero code: (\d+)", error)
        self.step_exit_code = int(exit_code[1]) if exit_code else None
        where = f"step {step}/{total} `{instruction}`" if step is not None else "the build"
        what = f"exit code {exit_code[1]}" if exit_code else error
        log = f"full log: {log_path}" if log_path else "rerun with a log file for the full output"
        super().__init__(f"{where} failed: {what}; {_CAUSE_HINTS[cause] if cause else ''}{log}")

    def details(self) -> list[str]:
        """The failing step's last output lines."""
        if not self.tail:
            return []
        return [f"last {len(self.tail)} lines of the failing step:", *(f"  | {line}" for line in self.tail)]

    def report(self) -> str:
        """The message plus the failing step's last output lines, for a terminal."""
        return "\n".join([str(self), *self.details()])


class BuildTimedOut(EngineError):
    def __init__(self, *, seconds: float, step: int | None, instruction: str | None,
                 log_path: Path | None) -> None:
        self.seconds = seconds
        self.step = step
        self.instruction = instruction
        self.log_path = log_path
        where = f" in step {step} `{instruction}`" if step is not None else ""
        super().__init__(
            f"the build was stopped after {seconds:.0f}s{where}; its containers were removed; "
            f"raise the build timeout or make the step faster (log: {log_path or 'none'})"
        )


class TagFailed(EngineError):
    def __init__(self, image_id: str, tag: str, detail: str) -> None:
        self.image_id = image_id
        self.tag = tag
        self.detail = detail
        super().__init__(
            f"built {image_id} but could not tag it {tag} ({detail}); no tag was left applied; "
            "check the tag's spelling (lowercase repository, tag of [A-Za-z0-9_.-])"
        )


class ImageMissing(EngineError):
    def __init__(self, ref: str) -> None:
        self.ref = ref
        super().__init__(f"image {ref} does not exist locally; build or pull it first")


class GpuUnavailable(EngineError):
    def __init__(self, image: str, detail: str) -> None:
        self.image = image
        self.detail = detail
        super().__init__(
            f"could not start {image} with GPUs ({detail}); install the NVIDIA Container "
            "Toolkit and restart dockerd, or run without GPUs"
        )


class ContainerFailed(EngineError):
    def __init__(self, image: str, detail: str) -> None:
        self.image = image
        self.detail = detail
        super().__init__(f"could not run a container from {image}: {detail}")


class PushFailed(EngineError):
    def __init__(self, ref: str, attempts: int, detail: str) -> None:
        self.ref = ref
        self.attempts = attempts
        self.detail = detail
        super().__init__(
            f"pushing {ref} failed after {attempts} attempt(s): {detail}; check that the "
            "registry answers and that you are logged in (`docker login <registry>`)"
        )


class PullFailed(EngineError):
    def __init__(self, ref: str, detail: str) -> None:
        self.ref = ref
        self.detail = detail
        super().__init__(
            f"pulling {ref} failed: {detail}; check the reference and that the registry answers"
        )


# The recognisable failures inside a build step, and what to do about each.
_CAUSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("disk-full", re.compile(r"no space left on device", re.I)),
    ("network", re.compile(
        r"CERTIFICATE_VERIFY_FAILED|invalid peer certificate|Could not fetch URL|"
        r"Name or service not known|Temporary failure in name resolution|Connection reset|"
        r"Connection refused|Network is unreachable|ConnectTimeoutError|ReadTimeoutError|"
        r"Max retries exceeded|Failed to fetch http|dns error|error sending request for url",
        re.I,
    )),
)
_CAUSE_HINTS = {
    "disk-full": "the Docker host ran out of disk space: free some with `docker system prune` "
    "or move Docker's data-root to a larger disk; ",
    "network": "pip inside the build could not reach the index: check the network and "
    "proxy of the Docker host; pass --ca-bundle $SSL_CERT_FILE behind a TLS-intercepting "
    "proxy; ",
}


def classify_failure(error: str, tail: Sequence[str]) -> str | None:
    """The cause of a failed step, from its error and last output lines (None: the step)."""
    text = "\n".join([error, *tail])
    for cause, pattern in _CAUSES:
        if pattern.search(text):
            return cause
    return None


# --------------------------------------------------------------------------- values


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


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    output: str
    """stdout and stderr together; lines of the two streams may come out of order."""
    timed_out: bool
    seconds: float


class Engine(Protocol):
    """What imagebuilder needs from a container engine."""

    def ping(self) -> None: ...

    def info(self) -> dict[str, Any]: ...

    def build(self, req: BuildRequest,
              on_progress: Callable[[Progress], None] | None = None) -> BuildResult: ...

    def image_exists(self, ref: str) -> bool: ...

    def image_labels(self, ref: str) -> dict[str, str]: ...

    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None: ...

    def remove_image(self, ref: str, force: bool = True) -> None: ...

    def run(self, image: str, command: Sequence[str] | str, *, timeout: float,
            gpus: bool = False, shm_size: str | None = None,
            environment: Mapping[str, str] | None = None,
            volumes: Mapping[str, str] | None = None, workdir: str | None = None) -> RunResult: ...

    def push(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> str: ...

    def pull(self, ref: str) -> None: ...


# --------------------------------------------------------------------------- build stream


_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_RUNNING_IN = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})$")
_LAYER = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
_BOOKKEEPING = re.compile(r"^( ---> |Removing intermediate container |Successfully (built|tagged) )")


class _BuildState:
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
            if self.instruction.upper().startswith("FROM "):
                self.from_steps += 1
            self._emit(cached=False, line=None)
        elif line == " ---> Using cache":
            self.cached_steps += 1
            self._emit(cached=True, line=None)
        elif m := _RUNNING_IN.match(line):
            self.containers.add(m[1])
        elif m := _LAYER.match(line):
            self.last_layer = m[1]
        elif m := re.match(r"^Successfully built ([0-9a-f]+)$", line):
            self.image_id = self.image_id or m[1]
        elif self.step is not None and not _BOOKKEEPING.match(line):
            self.tail.append(line)
            self._emit(cached=False, line=line)

    def _emit(self, *, cached: bool, line: str | None) -> None:
        if self.on_progress is not None and self.step is not None:
            self.on_progress(Progress(self.step, self.total, self.instruction,
                                      time.monotonic() - self.started, cached, line))

    @property
    def in_from_step(self) -> bool:
        return self.instruction.upper().startswith("FROM ")

    def base_image(self) -> str:
        # "FROM [--platform=x] image [AS name]"
        words = [w for w in self.instruction.split()[1:] if not w.startswith("--")]
        return words[0] if words else self.instruction


class _Watchdog:
    """Shuts the build's connection when the build's time is up, from another thread."""

    def __init__(self, seconds: float, abort: Callable[[], None]) -> None:
        self.fired = False
        self._abort = abort
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        self._abort()

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


# --------------------------------------------------------------------------- docker


class DockerEngine:
    """The Docker Engine through docker-py (classic builder; no BuildKit)."""

    def __init__(self, base_url: str | None = None, *, api_timeout: float = 120) -> None:
        self.base_url = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
        self._explicit_url = base_url
        self._api_timeout = api_timeout
        self._client_obj: docker.DockerClient | None = None
        # The build running in this thread collects its HTTP response here (see build()).
        self._response_sink = threading.local()

    # -- plumbing

    @property
    def _client(self) -> docker.DockerClient:
        if self._client_obj is None:
            import docker

            try:
                if self._explicit_url:
                    client = docker.DockerClient(base_url=self._explicit_url,
                                                 timeout=int(self._api_timeout))
                else:
                    client = docker.from_env(timeout=int(self._api_timeout))
            except docker.errors.DockerException as e:
                raise DaemonUnavailable(self.base_url, _short(e)) from e
            # Keep the streamed build's HTTP response reachable, so an interrupt or a
            # timeout can close its connection: that is what makes dockerd cancel the build.
            client.api.hooks["response"].append(self._collect_response)
            self._client_obj = client
        return self._client_obj

    def _collect_response(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        sink: list[requests.Response] | None = getattr(self._response_sink, "responses", None)
        if sink is not None and "/build" in (response.url or ""):
            sink.append(response)

    @contextmanager
    def _daemon_errors(self) -> Iterator[None]:
        import docker
        import requests

        import urllib3

        try:
            yield
        except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError,
                urllib3.exceptions.ProtocolError) as e:
            # Also a daemon that dies mid-stream: the streamed response breaks off.
            raise DaemonUnavailable(self.base_url, _short(e)) from e
        except docker.errors.DockerException as e:
            if "Error while fetching server API version" in str(e):
                raise DaemonUnavailable(self.base_url, _short(e)) from e
            raise

    def ping(self) -> None:
        with self._daemon_errors():
            self._client.ping()

    def info(self) -> dict[str, Any]:
        """The daemon's `docker info` (runtimes, CDI devices, ...)."""
        with self._daemon_errors():
            return dict(self._client.info())

    # -- build

    def build(self, req: BuildRequest,
              on_progress: Callable[[Progress], None] | None = None) -> BuildResult:
        if not req.tags:
            raise ValueError("BuildRequest.tags must name at least one tag")
        dockerfile = req.context / req.dockerfile
        if not dockerfile.is_file():
            raise EngineError(f"no {req.dockerfile} in the build context {req.context}; "
                              "render the Dockerfile first")
        self.ping()
        started = time.monotonic()
        wall_started = time.time()
        state = _BuildState(started, on_progress)
        responses: list[requests.Response] = []
        self._response_sink.responses = responses
        abort: Callable[[], None] = functools.partial(_close_responses, responses)
        log: IO[str] | None = None
        if req.log_path is not None:
            req.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = req.log_path.open("w", encoding="utf-8")
        error: str | None = None
        try:
            with _Watchdog(req.timeout, abort) as watchdog:
                try:
                    error = self._stream_build(req, state, log)
                except KeyboardInterrupt:
                    abort()
                    self._remove_build_containers(state, wall_started)
                    if log:
                        log.write("\n[imagebuilder] build interrupted; its containers were removed\n")
                    raise
                except Exception:
                    if not watchdog.fired:
                        raise
            if watchdog.fired:
                self._remove_build_containers(state, wall_started)
                if log:
                    log.write(f"\n[imagebuilder] build stopped after {req.timeout:.0f}s\n")
                raise BuildTimedOut(seconds=req.timeout, step=state.step,
                                    instruction=state.instruction or None, log_path=req.log_path)
        finally:
            self._response_sink.responses = None
            if log:
                log.close()
        if error is not None:
            raise self._build_error(error, state, req)
        if state.image_id is None:
            raise BuildFailed(step=state.step, total=state.total or None,
                              instruction=state.instruction or None,
                              error="the daemon ended the build without an image id",
                              tail=tuple(state.tail), log_path=req.log_path)
        image = self._tag_all(state.image_id, req.tags)
        return BuildResult(
            image_id=image.id,
            tags=req.tags,
            size=int(image.attrs.get("Size", 0)),
            seconds=time.monotonic() - started,
            steps=state.total,
            cached_steps=state.cached_steps,
            executed_steps=state.total - state.cached_steps - state.from_steps,
            log_path=req.log_path,
        )

    def _stream_build(self, req: BuildRequest, state: _BuildState, log: IO[str] | None) -> str | None:
        """Feed the build's stream to `state` and the log; the daemon's error, if any."""
        with self._daemon_errors():
            stream = self._client.api.build(
                path=str(req.context),
                dockerfile=req.dockerfile,
                labels=dict(req.labels) or None,
                buildargs=dict(req.buildargs) or None,
                nocache=req.nocache,
                pull=req.pull,
                rm=True,
                forcerm=True,
                decode=True,
            )
            for chunk in stream:
                if "stream" in chunk:
                    text = str(chunk["stream"])
                    if log:
                        log.write(text)
                        log.flush()
                    state.feed(text)
                elif "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
                    state.image_id = str(chunk["aux"]["ID"])
                elif "errorDetail" in chunk or "error" in chunk:
                    detail = chunk.get("errorDetail") or {}
                    message = str(detail.get("message") or chunk.get("error") or "unknown error")
                    state.flush()
                    if log:
                        log.write(f"\nERROR: {message}\n")
                    return message
                elif "status" in chunk and log:
                    # FROM pulls report layer progress as status messages.
                    log.write(f"{chunk['status']} {chunk.get('progress', '')}".rstrip() + "\n")
            state.flush()
        return None

    def _build_error(self, error: str, state: _BuildState, req: BuildRequest) -> EngineError:
        if state.in_from_step:
            return BaseImageMissing(state.base_image(), _short_text(error))
        tail = tuple(state.tail)
        return BuildFailed(step=state.step, total=state.total, instruction=state.instruction,
                           error=_short_text(error), tail=tail, log_path=req.log_path,
                           cause=classify_failure(error, tail))

    def _remove_build_containers(self, state: _BuildState, since: float, settle: float = 10) -> None:
        """Remove the intermediate containers a cancelled classic build left behind.

        The classic builder names its containers nowhere but in the stream ("Running in
        <id>") and gives them no label; dockerd removes the running step's container when
        it sees the connection close, but may have created the next one before it looks.
        So: every container the stream named, and every container created since the build
        started from this build's last layer running the current step's command, until
        none has shown up for a second. Others share the daemon: nothing wider than that.
        """
        import docker

        client = self._client
        deadline = time.monotonic() + settle
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            found = False
            for container in client.api.containers(all=True):
                if self._is_build_container(container, state, since):
                    cid: str = container["Id"]
                    found = True
                    try:
                        client.api.remove_container(cid, force=True)
                    except docker.errors.NotFound:
                        pass
                    except docker.errors.APIError as e:
                        if "already in progress" not in str(e):
                            raise
            if found:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 1:
                return
            time.sleep(0.2)

    @staticmethod
    def _is_build_container(container: Mapping[str, Any], state: _BuildState, since: float) -> bool:
        cid = str(container["Id"])
        if any(cid.startswith(named) for named in state.containers):
            return True
        if state.last_layer is None or int(container.get("Created", 0)) < int(since) - 1:
            return False
        image = str(container.get("ImageID", "")).removeprefix("sha256:")
        _, _, arguments = state.instruction.partition(" ")
        return image.startswith(state.last_layer) and bool(arguments) and (
            arguments in str(container.get("Command", ""))
        )

    def _tag_all(self, image_id: str, tags: Sequence[str]) -> Any:
        import docker

        with self._daemon_errors():
            image = self._client.images.get(image_id)
            applied: list[str] = []
            for tag in tags:
                repository, name = _split_ref(tag)
                try:
                    if not image.tag(repository, name):
                        raise docker.errors.APIError(f"the daemon refused tag {tag}")
                except docker.errors.APIError as e:
                    for done in applied:
                        self._client.api.remove_image(done, noprune=True)
                    raise TagFailed(image.id, tag, _short(e)) from e
                applied.append(tag)
            image.reload()
            return image

    # -- images

    def image_exists(self, ref: str) -> bool:
        import docker

        with self._daemon_errors():
            try:
                self._client.api.inspect_image(ref)
            except docker.errors.ImageNotFound:
                return False
            return True

    def image_labels(self, ref: str) -> dict[str, str]:
        import docker

        with self._daemon_errors():
            try:
                attrs = self._client.api.inspect_image(ref)
            except docker.errors.ImageNotFound as e:
                raise ImageMissing(ref) from e
        return dict((attrs.get("Config") or {}).get("Labels") or {})

    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        """(image id, RepoDigests) of a local image, None when the engine has no such image:
        what a lock pins a local base image by."""
        import docker

        with self._daemon_errors():
            try:
                attrs = self._client.api.inspect_image(ref)
            except docker.errors.ImageNotFound:
                return None
        return str(attrs["Id"]), tuple(attrs.get("RepoDigests") or ())

    def remove_image(self, ref: str, force: bool = True) -> None:
        import docker

        with self._daemon_errors():
            try:
                self._client.api.remove_image(ref, force=force)
            except docker.errors.ImageNotFound:
                pass

    # -- containers

    def run(self, image: str, command: Sequence[str] | str, *, timeout: float,
            gpus: bool = False, shm_size: str | None = None,
            environment: Mapping[str, str] | None = None,
            volumes: Mapping[str, str] | None = None, workdir: str | None = None) -> RunResult:
        """Run `command` in a new container; the container is removed in every case.

        `volumes` maps host paths to container paths (mounted read-only). On timeout the
        container is killed and `timed_out` is True (exit code 137 or -1).
        """
        import docker
        import requests

        client = self._client
        device_requests = (
            [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None
        )
        binds = {host: {"bind": inside, "mode": "ro"} for host, inside in (volumes or {}).items()}
        started = time.monotonic()
        container = None
        try:
            with self._daemon_errors():
                try:
                    container = client.containers.create(
                        image, command, environment=dict(environment or {}), shm_size=shm_size,
                        device_requests=device_requests, volumes=binds or None,
                        working_dir=workdir, labels={"org.imagebuilder.run": "1"},
                    )
                    container.start()
                except docker.errors.ImageNotFound as e:
                    raise ImageMissing(image) from e
                except docker.errors.APIError as e:
                    if gpus and ("gpu" in str(e).lower() or "nvidia" in str(e).lower()):
                        raise GpuUnavailable(image, _short(e)) from e
                    raise ContainerFailed(image, _short(e)) from e
                timed_out = False
                try:
                    status = container.wait(timeout=timeout)
                    exit_code = int(status.get("StatusCode", -1))
                except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                    # docker-py surfaces wait()'s read timeout as either exception.
                    if time.monotonic() - started < timeout:
                        raise
                    timed_out = True
                    try:
                        container.kill()
                    except docker.errors.APIError:
                        pass  # it finished just now
                    exit_code = int(container.wait(timeout=30).get("StatusCode", -1))
                output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
                return RunResult(exit_code, output, timed_out, time.monotonic() - started)
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass

    # -- registry

    def push(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> str:
        """Push `ref`; the manifest digest the registry stored. Retries transient errors."""
        import docker

        repository, tag = _split_ref(ref)
        attempts = 0
        detail = ""
        while attempts < max(1, retries):
            attempts += 1
            try:
                with self._daemon_errors():
                    digest, detail = self._push_once(repository, tag)
            except docker.errors.ImageNotFound as e:
                raise ImageMissing(ref) from e
            except docker.errors.APIError as e:
                digest, detail = None, _short(e)
            if digest:
                return digest
            if _PERMANENT_PUSH_ERROR.search(detail):
                break
            if attempts < retries:
                time.sleep(backoff * 2 ** (attempts - 1))
        raise PushFailed(ref, attempts, detail)

    def _push_once(self, repository: str, tag: str) -> tuple[str | None, str]:
        digest: str | None = None
        for event in self._client.api.push(repository, tag=tag, stream=True, decode=True):
            if "errorDetail" in event or "error" in event:
                detail = event.get("errorDetail") or {}
                return None, _short_text(str(detail.get("message") or event.get("error")))
            aux = event.get("aux")
            if isinstance(aux, dict) and aux.get("Digest"):
                digest = str(aux["Digest"])
        return (digest, "") if digest else (None, "the daemon reported no digest")

    def pull(self, ref: str) -> None:
        import docker

        with self._daemon_errors():
            try:
                # docker-py splits "repo:tag" and "repo@sha256:..." itself when tag is None.
                for event in self._client.api.pull(ref, stream=True, decode=True):
                    if "errorDetail" in event or "error" in event:
                        detail = event.get("errorDetail") or {}
                        raise PullFailed(ref, _short_text(str(detail.get("message") or event.get("error"))))
            except docker.errors.APIError as e:
                raise PullFailed(ref, _short(e)) from e


_PERMANENT_PUSH_ERROR = re.compile(
    r"denied|unauthorized|authentication required|does not exist locally|invalid reference", re.I
)


def _split_ref(ref: str) -> tuple[str, str]:
    """("host:5000/repo", "tag") from "host:5000/repo:tag"; the tag defaults to latest."""
    # "host:5000/repo" has a port, not a tag; "repo@sha256:..." is a digest reference.
    if "@" not in ref and ":" in ref.rsplit("/", 1)[-1]:
        repository, _, tag = ref.rpartition(":")
        return repository, tag
    return ref, "latest"


def _close_responses(responses: Sequence[requests.Response]) -> None:
    """Close a streamed build's connection; dockerd then cancels the build and its step."""
    for response in responses:
        # close() alone does not wake a recv() blocked in another thread; shutdown() does.
        sock = getattr(getattr(response.raw, "_connection", None), "sock", None)
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            response.close()
        except Exception:  # noqa: BLE001 - the connection is going away either way
            pass


def _short_text(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(e: BaseException) -> str:
    return _short_text(str(e) or type(e).__name__)
