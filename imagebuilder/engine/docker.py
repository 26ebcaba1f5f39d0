"""The Docker Engine through the Docker SDK (docker-py): images, containers, pushes and pulls.

`DockerEngine` is the adapter behind the `ImageStore`, `Runner` and `Pusher` protocols
(api.py); the classic builder (classic.py) drives the same client. `docker` is imported
lazily: `imagebuilder --help` must work on a machine without the SDK's dependencies loaded.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .api import NO_ACCESS, HostAccess, Pushed, RunResult
from .docker_client import DEFAULT_SOCKET, connect, short, short_text, ssh_errors
from .errors import (ContainerFailed, DaemonUnavailable, GpuUnavailable, ImageMissing, PullFailed, PushFailed,
                     base_image_missing, push_cause, refuses_gpus)

if TYPE_CHECKING:
    import docker


def _follow(container: Any, on_output: Callable[[str], None]) -> threading.Thread:
    """A thread telling `on_output` each line of the container's logs as it is printed. The
    complete logs are read again after the container ends: a line lost here is only not shown live."""
    import docker
    import requests

    def follow() -> None:
        pending = b""
        try:
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    on_output(line.decode("utf-8", "replace"))
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return  # the daemon or the container went away: the run's own handling reports it

    thread = threading.Thread(target=follow, name="container-logs", daemon=True)
    thread.start()
    return thread


class DockerEngine:
    """The Docker Engine through docker-py."""

    def __init__(self, base_url: str | None = None, *, api_timeout: float = 120) -> None:
        self.base_url = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
        self._explicit_url = base_url
        self._api_timeout = api_timeout
        self._client_obj: docker.DockerClient | None = None

    # -- plumbing

    @property
    def client(self) -> docker.DockerClient:
        """The SDK's client, made on first use (for the classic builder, which drives it)."""
        if self._client_obj is None:
            self._client_obj = connect(self.base_url, self._explicit_url, self._api_timeout)
        return self._client_obj

    @contextmanager
    def daemon_errors(self) -> Iterator[None]:
        """A daemon that does not answer (or dies mid-stream) as DaemonUnavailable."""
        import docker
        import requests

        import urllib3

        # Also a daemon that dies mid-stream: the streamed response breaks off.
        gone: tuple[type[Exception], ...] = (requests.exceptions.ConnectionError,
                                             requests.exceptions.ChunkedEncodingError,
                                             urllib3.exceptions.ProtocolError, *ssh_errors(self.base_url))
        try:
            yield
        except gone as e:
            raise DaemonUnavailable(base_url=self.base_url, reason=short(e)) from e
        except docker.errors.DockerException as e:
            if "Error while fetching server API version" in str(e):
                raise DaemonUnavailable(base_url=self.base_url, reason=short(e)) from e
            raise

    def ping(self) -> None:
        with self.daemon_errors():
            self.client.ping()

    def info(self) -> dict[str, Any]:
        """The daemon's `docker info` (runtimes, CDI devices, ...); {} when the daemon answers
        but will not say."""
        import docker

        with self.daemon_errors():
            try:
                return dict(self.client.info())
            except docker.errors.DockerException:
                return {}

    def keeps_compressed_layers(self) -> bool:
        """True with the containerd image store: an image is the index BuildKit exported,
        blobs as compressed, and `docker push` sends them as they are (its image id is that
        index's digest). The classic store unpacks layers and recompresses them (gzip) on push."""
        return stores_manifests(self.info())


    def _inspect(self, ref: str) -> dict[str, Any]:
        # types-docker leaves APIClient.inspect_image untyped; it answers the Engine API's JSON.
        return dict(self.client.api.inspect_image(ref))  # type: ignore[no-untyped-call]

    def image_exists(self, ref: str) -> bool:
        import docker

        with self.daemon_errors():
            try:
                self._inspect(ref)
            except docker.errors.ImageNotFound:
                return False
            return True

    def image_labels(self, ref: str) -> dict[str, str]:
        return dict((self.inspect_image(ref).get("Config") or {}).get("Labels") or {})

    def inspect_image(self, ref: str) -> dict[str, Any]:
        """`docker image inspect` of one image (Id, Size, Architecture, Config, ...)."""
        import docker

        with self.daemon_errors():
            try:
                return self._inspect(ref)
            except docker.errors.ImageNotFound as e:
                raise ImageMissing(ref=ref) from e

    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        """(image id, RepoDigests) of a local image, None when the engine has no such image:
        what a lock pins a local base image by."""
        import docker

        with self.daemon_errors():
            try:
                attrs = self._inspect(ref)
            except docker.errors.ImageNotFound:
                return None
        return str(attrs["Id"]), tuple(attrs.get("RepoDigests") or ())

    def save_image(self, ref: str) -> Iterator[bytes]:
        """`docker save` of one image: its OCI layout as a tar stream, blobs as the store keeps
        them (with the containerd store, as BuildKit exported them)."""
        import docker

        with self.daemon_errors():
            try:
                chunks = self.client.api.get_image(ref, chunk_size=1 << 20)
            except docker.errors.ImageNotFound as e:
                raise ImageMissing(ref=ref) from e
            yield from chunks

    def read_file(self, image: str, path: str, *, hops: int = 4, platform: str | None = None) -> bytes | None:
        """A file of `image` (None if absent), read without running anything: a container is
        created, never started, its archive read through the API, and removed. Symlinks
        inside the image are followed (Debian's /etc/os-release is one). `platform`: that variant of
        a multi-platform tag (None: the host's)."""
        import docker

        with self.daemon_errors():
            try:
                container = self.client.api.create_container(
                    image, command=["/bin/true"], labels={"org.imagebuilder.run": "1"}, platform=platform)
            except docker.errors.ImageNotFound as e:
                raise ImageMissing(ref=image) from e
            try:
                for _ in range(hops):
                    try:
                        chunks, _stat = self.client.api.get_archive(container["Id"], path)
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
                self.client.api.remove_container(container["Id"], force=True)

    def os_release(self, image: str) -> str:
        """The image's /etc/os-release text ("" if it has none); pulls a missing image first,
        as its build would."""
        try:
            data = self.read_file(image, "/etc/os-release")
        except ImageMissing:
            try:
                self.pull(image)
            except PullFailed as e:
                raise base_image_missing(image, e.fields["detail"]) from e
            data = self.read_file(image, "/etc/os-release")
        return (data or b"").decode("utf-8", "replace")

    def remove_image(self, ref: str, force: bool = True) -> None:
        import docker

        with self.daemon_errors():
            try:
                self.client.api.remove_image(ref, force=force)
            except docker.errors.ImageNotFound:
                pass

    # -- containers

    def run(self, image: str, command: Sequence[str] | str, *, timeout: float,
            gpus: bool = False, shm_size: str | None = None,
            environment: Mapping[str, str] | None = None,
            volumes: Mapping[str, str] | None = None, workdir: str | None = None,
            archives: Mapping[str, bytes] | None = None,
            on_output: Callable[[str], None] | None = None, access: HostAccess = NO_ACCESS) -> RunResult:
        """Run `command` in a new container; the container is removed in every case.
        `on_output` is told each line it prints as it comes (the logs, followed).

        `volumes` maps host paths to container paths (mounted read-only): paths on the
        daemon's host, so only for a local daemon. `archives` maps a container directory to a
        tar unpacked there before the container starts (what `docker cp` does): files reach a
        remote daemon too. `access`'s devices, ulimits and capabilities are the daemon host's,
        as `docker run --device/--ulimit/--cap-add` gives them.
        On timeout the container is killed and `timed_out` is True (exit code 137 or -1).
        """
        import docker
        import requests

        client = self.client
        device_requests = (
            [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None
        )
        binds = {host: {"bind": inside, "mode": "ro"} for host, inside in (volumes or {}).items()}
        started = time.monotonic()
        container = None
        follower: threading.Thread | None = None
        try:
            with self.daemon_errors():
                try:
                    container = client.containers.create(
                        image, command if isinstance(command, str) else list(command), environment=dict(environment or {}), shm_size=shm_size,
                        device_requests=device_requests, volumes=binds or None,
                        working_dir=workdir, labels={"org.imagebuilder.run": "1"},
                        devices=[f"{path}:{path}:rwm" for path in access.devices] or None,
                        ulimits=[docker.types.Ulimit(name=name, soft=value, hard=value)
                                 for name, value in access.ulimits] or None,
                        cap_add=list(access.capabilities) or None,
                    )
                    for directory, tar in (archives or {}).items():
                        if not container.put_archive(directory, tar):
                            raise ContainerFailed(image=image,
                                                  detail=f"the daemon refused files for {directory}")
                    container.start()
                    if on_output is not None:
                        follower = _follow(container, on_output)
                except docker.errors.ImageNotFound as e:
                    raise ImageMissing(ref=image) from e
                except docker.errors.APIError as e:
                    # The daemon's own words, without docker-py's status line and URL.
                    said = short_text(str(e.explanation or e))
                    if gpus and refuses_gpus(said):
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
                if follower is not None:
                    follower.join(timeout=10)  # the stream ends with the container
                output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
                return RunResult(exit_code, output, timed_out, time.monotonic() - started)
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass

    # -- registry

    def tag_image(self, source: str, ref: str) -> None:
        """Name the local image `source` also `ref` (REPOSITORY:TAG)."""
        repository, tag = split_ref(ref)
        with self.daemon_errors():
            self.client.api.tag(source, repository, tag=tag, force=True)

    def push(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> str:
        """Push `ref`; the manifest digest the registry stored. Retries transient errors."""
        return self.push_counted(ref, retries=retries, backoff=backoff).digest

    def push_counted(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> Pushed:
        """Push `ref`: the digest the registry stored and the blobs this push uploaded (the
        others were there already or mounted from another repository)."""
        import docker

        repository, tag = split_ref(ref)
        attempts = 0
        detail = ""
        uploaded: set[str] = set()
        while attempts < max(1, retries):
            attempts += 1
            try:
                with self.daemon_errors():
                    digest, detail = self._push_once(repository, tag, uploaded)
            except docker.errors.ImageNotFound as e:
                raise ImageMissing(ref=ref) from e
            except docker.errors.APIError as e:
                digest, detail = None, push_cause(str(e) or type(e).__name__)
            if digest:
                return Pushed(digest, frozenset(uploaded))
            if _PERMANENT_PUSH_ERROR.search(detail):
                break
            if attempts < retries:
                time.sleep(backoff * 2 ** (attempts - 1))
        raise PushFailed(ref=ref, attempts=attempts, detail=detail)

    def _push_once(self, repository: str, tag: str, uploaded: set[str]) -> tuple[str | None, str]:
        digest: str | None = None
        for event in self.client.api.push(repository, tag=tag, stream=True, decode=True):
            if "errorDetail" in event or "error" in event:
                detail = event.get("errorDetail") or {}
                return None, push_cause(str(detail.get("message") or event.get("error")))
            if event.get("status") == "Pushed" and event.get("id"):
                uploaded.add(str(event["id"]))
            aux = event.get("aux")
            if isinstance(aux, dict) and aux.get("Digest"):
                digest = str(aux["Digest"])
            # Docker 26 with the containerd image store sends no aux record: only the line
            # `TAG: digest: sha256:... size: N` names what the registry stored.
            said = _PUSHED_DIGEST.match(str(event.get("status") or ""))
            if digest is None and said is not None and said["tag"] == tag:
                digest = said["digest"]
        return (digest, "") if digest else (None, "the daemon reported no digest")

    def pull(self, ref: str) -> None:
        import docker

        with self.daemon_errors():
            try:
                # docker-py splits "repo:tag" and "repo@sha256:..." itself when tag is None.
                for event in self.client.api.pull(ref, stream=True, decode=True):
                    if "errorDetail" in event or "error" in event:
                        detail = event.get("errorDetail") or {}
                        raise PullFailed(ref=ref, detail=short_text(str(detail.get("message") or event.get("error"))))
            except docker.errors.APIError as e:
                # The daemon's own words: docker-py's status line and URL come first and took the
                # whole line, so the cause (pull access denied, manifest unknown) was cut off.
                raise PullFailed(ref=ref, detail=short_text(str(e.explanation or e))) from e



def stores_manifests(info: Mapping[str, Any]) -> bool:
    """Whether `docker info` shows the containerd image store (a snapshotter as the driver)."""
    status = dict((str(k), str(v)) for k, v in (info.get("DriverStatus") or []) if k)
    return status.get("driver-type", "").startswith("io.containerd.snapshotter")


def answering_engine() -> DockerEngine | None:
    """The local engine when its daemon answers (to read base images), else None."""
    engine = DockerEngine()
    try:
        engine.ping()
    except DaemonUnavailable:
        return None
    return engine


_PUSHED_DIGEST = re.compile(r"^(?P<tag>[^:\s]+): digest: (?P<digest>sha256:[0-9a-f]{64}) size: \d+$")
_PERMANENT_PUSH_ERROR = re.compile(
    r"denied|unauthorized|authentication required|does not exist locally|invalid reference", re.I
)



def split_ref(ref: str) -> tuple[str, str]:
    """("host:5000/repo", "tag") from "host:5000/repo:tag"; the tag defaults to latest."""
    # "host:5000/repo" has a port, not a tag; "repo@sha256:..." is a digest reference.
    if "@" not in ref and ":" in ref.rsplit("/", 1)[-1]:
        repository, _, tag = ref.rpartition(":")
        return repository, tag
    return ref, "latest"
