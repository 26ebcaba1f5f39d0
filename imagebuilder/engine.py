"""The only module that talks to the Docker Engine: build, run, push, pull, inspect.

Everything else sees the `Engine` protocol and the value objects below, so another engine
(`docker buildx`, podman) can be added in one file. `docker` is imported lazily:
`imagebuilder --help` must work on a machine without the SDK's dependencies loaded.

Builds use the Engine API's classic builder (what docker-py drives), streamed, so the
progress of every `Step n/m` reaches the caller and every line reaches the log file. The
stream's parser lives in classic_stream.py and the errors in engine_errors.py; this module
is the adapter that moves bytes between them and the daemon.
"""

from __future__ import annotations

import functools
import io
import os
import posixpath
import re
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from .classic_stream import Progress
from .export import Export
from .classic_stream import BuildState as _BuildState
from .engine_errors import (BaseImageMissing, BuildFailed, BuildTimedOut, ContainerFailed, DaemonUnavailable,
                            EngineError, GpuUnavailable, ImageMissing, PullFailed, PushFailed, TagFailed,
                            classify_failure)

if TYPE_CHECKING:
    import docker
    import requests

DEFAULT_SOCKET = "unix:///var/run/docker.sock"


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
    platform: str | None = None
    """os/arch to build for (linux/arm64); None: the daemon's own."""
    secrets: Mapping[str, Path] = field(default_factory=dict)
    """Build secrets by id (BuildKit's `RUN --mount=type=secret,id=...`); in no layer."""
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
    removed: tuple[str, ...] = ()
    """Images this build made and nobody asked for, removed after it: the earlier stages of a
    multi-stage build, and the image a rebuilt tag pointed at before when no tag is left on it."""


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


class Engine(Protocol):
    """What imagebuilder needs from a container engine."""

    def ping(self) -> None: ...

    def info(self) -> dict[str, Any]: ...

    def build(self, req: BuildRequest,
              on_progress: Callable[[Progress], None] | None = None) -> BuildResult: ...

    def image_exists(self, ref: str) -> bool: ...

    def image_labels(self, ref: str) -> dict[str, str]: ...

    def read_file(self, image: str, path: str) -> bytes | None: ...

    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None: ...

    def os_release(self, image: str) -> str: ...

    def remove_image(self, ref: str, force: bool = True) -> None: ...

    def run(self, image: str, command: Sequence[str] | str, *, timeout: float,
            gpus: bool = False, shm_size: str | None = None,
            environment: Mapping[str, str] | None = None,
            volumes: Mapping[str, str] | None = None, workdir: str | None = None,
            archives: Mapping[str, bytes] | None = None) -> RunResult: ...

    def push(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> str: ...

    def pull(self, ref: str) -> None: ...


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
                raise DaemonUnavailable(base_url=self.base_url, reason=_short(e)) from e
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
            raise DaemonUnavailable(base_url=self.base_url, reason=_short(e)) from e
        except docker.errors.DockerException as e:
            if "Error while fetching server API version" in str(e):
                raise DaemonUnavailable(base_url=self.base_url, reason=_short(e)) from e
            raise

    def ping(self) -> None:
        with self._daemon_errors():
            self._client.ping()

    def info(self) -> dict[str, Any]:
        """The daemon's `docker info` (runtimes, CDI devices, ...)."""
        with self._daemon_errors():
            return dict(self._client.info())

    def keeps_compressed_layers(self) -> bool:
        """True with the containerd image store: an image is the index BuildKit exported,
        blobs as compressed, and `docker push` sends them as they are (its image id is that
        index's digest). The classic store unpacks layers and recompresses them (gzip) on push."""
        return stores_manifests(self.info())

    # -- build

    def build(self, req: BuildRequest,
              on_progress: Callable[[Progress], None] | None = None) -> BuildResult:
        check_request(req)
        if req.export is not None and req.export != Export():
            raise EngineError("the classic builder cannot choose compression, attach provenance or use a "
                              "registry cache; build with --builder buildkit (buildx)")
        if req.secrets:
            raise EngineError("the classic builder cannot take build secrets; build with "
                              "--builder buildkit (a docker CLI with BuildKit or buildx)")
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
                    self._discard(state)
                    if log:
                        log.write("\n[imagebuilder] build interrupted; its containers were removed\n")
                    raise
                except Exception:
                    if not watchdog.fired:
                        raise
            if watchdog.fired:
                self._remove_build_containers(state, wall_started)
                self._discard(state)
                if log:
                    log.write(f"\n[imagebuilder] build stopped after {req.timeout:.0f}s\n")
                raise BuildTimedOut(seconds=req.timeout, step=state.step,
                                    instruction=state.instruction or None, log_path=req.log_path)
        finally:
            self._response_sink.responses = None
            if log:
                log.close()
        if error is not None:
            self._discard(state)
            raise self._build_error(error, state, req)
        if state.image_id is None:
            raise BuildFailed(step=state.step, total=state.total or None,
                              instruction=state.instruction or None,
                              error="the daemon ended the build without an image id",
                              tail=tuple(state.tail), log_path=req.log_path)
        previous = self._tagged_images(req.tags)
        image = self._tag_all(state.image_id, req.tags)
        removed = self._remove_leftovers([*state.stage_images, *previous], keep=image.id)
        return BuildResult(
            image_id=image.id,
            tags=req.tags,
            size=int(image.attrs.get("Size", 0)),
            seconds=time.monotonic() - started,
            steps=state.total,
            cached_steps=state.cached_steps,
            executed_steps=state.total - state.cached_steps - state.from_steps,
            log_path=req.log_path,
            removed=removed,
        )

    def _discard(self, state: _BuildState) -> None:
        """A build that did not finish removes the images its steps made: GBs nobody will
        tag. Best effort: the build's own error is what the caller must see."""
        try:
            self._remove_leftovers(state.images_made(), keep="")
        except Exception:  # noqa: BLE001 - never mask the build's own failure
            pass

    def _tagged_images(self, tags: Sequence[str]) -> list[str]:
        """The images `tags` name now, before a build moves them."""
        import docker

        found = []
        with self._daemon_errors():
            for tag in tags:
                try:
                    found.append(str(self._client.api.inspect_image(tag)["Id"]))
                except docker.errors.APIError:
                    pass  # no such image, or a tag the daemon cannot parse (tagging will say so)
        return found

    def _remove_leftovers(self, candidates: Sequence[str], keep: str) -> tuple[str, ...]:
        """Remove each candidate that is not `keep`, has no tag and no child image: what this
        build left untagged. Anything tagged, in use or built upon stays (the daemon is shared)."""
        import docker

        removed = []
        with self._daemon_errors():
            children = {str(i.get("ParentId", "")) for i in self._client.api.images(all=True)}
            for candidate in dict.fromkeys(candidates):
                try:
                    attrs = self._client.api.inspect_image(candidate)
                except docker.errors.ImageNotFound:
                    continue
                image_id = str(attrs["Id"])
                if image_id == keep or attrs.get("RepoTags") or image_id in children:
                    continue
                try:
                    self._client.api.remove_image(image_id)
                except docker.errors.APIError:
                    continue  # a container uses it, or another build just did: leave it
                removed.append(image_id)
        return tuple(removed)

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
                platform=req.platform,
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
            image = _expand_args(state.base_image(), req.context / req.dockerfile, req.buildargs)
            return BaseImageMissing(image=image, detail=_short_text(error))
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
                    raise TagFailed(image_id=image.id, tag=tag, detail=_short(e)) from e
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
        return dict((self.inspect_image(ref).get("Config") or {}).get("Labels") or {})

    def inspect_image(self, ref: str) -> dict[str, Any]:
        """`docker image inspect` of one image (Id, Size, Architecture, Config, ...)."""
        import docker

        with self._daemon_errors():
            try:
                return dict(self._client.api.inspect_image(ref))
            except docker.errors.ImageNotFound as e:
                raise ImageMissing(ref=ref) from e

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

    def read_file(self, image: str, path: str, *, hops: int = 4) -> bytes | None:
        """A file of `image` (None if absent), read without running anything: a container is
        created, never started, its archive read through the API, and removed. Symlinks
        inside the image are followed (Debian's /etc/os-release is one)."""
        import docker

        with self._daemon_errors():
            try:
                container = self._client.api.create_container(
                    image, command=["/bin/true"], labels={"org.imagebuilder.run": "1"})
            except docker.errors.ImageNotFound as e:
                raise ImageMissing(ref=image) from e
            try:
                for _ in range(hops):
                    try:
                        chunks, _stat = self._client.api.get_archive(container["Id"], path)
                    except docker.errors.NotFound:
                        return None
                    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                        member = tar.next()
                        if member is None:
                            return None
                        if member.issym():
                            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), member.linkname))
                            continue
                        extracted = tar.extractfile(member)
                        return extracted.read() if extracted is not None else None
                return None
            finally:
                self._client.api.remove_container(container["Id"], force=True)

    def os_release(self, image: str) -> str:
        """The image's /etc/os-release text ("" if it has none); pulls a missing image first,
        as its build would."""
        try:
            data = self.read_file(image, "/etc/os-release")
        except ImageMissing:
            try:
                self.pull(image)
            except PullFailed as e:
                raise BaseImageMissing(image=image, detail=e.fields["detail"]) from e
            data = self.read_file(image, "/etc/os-release")
        return (data or b"").decode("utf-8", "replace")

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
            volumes: Mapping[str, str] | None = None, workdir: str | None = None,
            archives: Mapping[str, bytes] | None = None) -> RunResult:
        """Run `command` in a new container; the container is removed in every case.

        `volumes` maps host paths to container paths (mounted read-only): paths on the
        daemon's host, so only for a local daemon. `archives` maps a container directory to a
        tar unpacked there before the container starts (what `docker cp` does): files reach a
        remote daemon too.
        On timeout the container is killed and `timed_out` is True (exit code 137 or -1).
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
                    for directory, tar in (archives or {}).items():
                        if not container.put_archive(directory, tar):
                            raise ContainerFailed(image=image,
                                                  detail=f"the daemon refused files for {directory}")
                    container.start()
                except docker.errors.ImageNotFound as e:
                    raise ImageMissing(ref=image) from e
                except docker.errors.APIError as e:
                    # The daemon's own words, without docker-py's status line and URL.
                    said = _short_text(str(e.explanation or e))
                    if gpus and ("gpu" in said.lower() or "nvidia" in said.lower()):
                        raise GpuUnavailable(image=image, detail=said) from e
                    raise ContainerFailed(image=image, detail=said) from e
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
        return self.push_counted(ref, retries=retries, backoff=backoff).digest

    def push_counted(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> Pushed:
        """Push `ref`: the digest the registry stored and the blobs this push uploaded (the
        others were there already or mounted from another repository)."""
        import docker

        repository, tag = _split_ref(ref)
        attempts = 0
        detail = ""
        uploaded: set[str] = set()
        while attempts < max(1, retries):
            attempts += 1
            try:
                with self._daemon_errors():
                    digest, detail = self._push_once(repository, tag, uploaded)
            except docker.errors.ImageNotFound as e:
                raise ImageMissing(ref=ref) from e
            except docker.errors.APIError as e:
                digest, detail = None, _short(e)
            if digest:
                return Pushed(digest, frozenset(uploaded))
            if _PERMANENT_PUSH_ERROR.search(detail):
                break
            if attempts < retries:
                time.sleep(backoff * 2 ** (attempts - 1))
        raise PushFailed(ref=ref, attempts=attempts, detail=detail)

    def _push_once(self, repository: str, tag: str, uploaded: set[str]) -> tuple[str | None, str]:
        digest: str | None = None
        for event in self._client.api.push(repository, tag=tag, stream=True, decode=True):
            if "errorDetail" in event or "error" in event:
                detail = event.get("errorDetail") or {}
                return None, _short_text(str(detail.get("message") or event.get("error")))
            if event.get("status") == "Pushed" and event.get("id"):
                uploaded.add(str(event["id"]))
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
                        raise PullFailed(ref=ref, detail=_short_text(str(detail.get("message") or event.get("error"))))
            except docker.errors.APIError as e:
                raise PullFailed(ref=ref, detail=_short(e)) from e


def stores_manifests(info: Mapping[str, Any]) -> bool:
    """Whether `docker info` shows the containerd image store (a snapshotter as the driver)."""
    status = dict((str(k), str(v)) for k, v in (info.get("DriverStatus") or []) if k)
    return status.get("driver-type", "").startswith("io.containerd.snapshotter")


_PERMANENT_PUSH_ERROR = re.compile(
    r"denied|unauthorized|authentication required|does not exist locally|invalid reference", re.I
)


_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)\s*$", re.M)
_ARG_USE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _expand_args(text: str, dockerfile: Path, buildargs: Mapping[str, str]) -> str:
    """`${BASE_IMAGE}` in a FROM line as the builder expanded it: build args, else the
    Dockerfile's ARG defaults (the stream shows the line unexpanded)."""
    try:
        defaults = {m[1]: m[2].strip("\"'") for m in _ARG.finditer(dockerfile.read_text(encoding="utf-8"))}
    except OSError:
        defaults = {}
    values = {**defaults, **buildargs}
    return _ARG_USE.sub(lambda m: values.get(m[1] or m[2], m[0]), text)


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
