"""The classic builder: the Engine API's /build as docker-py drives it, and its stream's parser.

`BuildState` (classic_stream.py) is pure: fed the stream one chunk at a time, it is tested on
canned output. `ClassicBuilder` moves bytes between the daemon and it: streamed, so the progress of every
`Step n/m` reaches the caller and every line reaches the log file; on a timeout or Ctrl-C
it closes the connection (dockerd then cancels the build) and removes what the build left.
"""

from __future__ import annotations

import functools
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .api import BuilderKind, BuildRequest, BuildResult, OnProgress, check_request
from .classic_stream import BuildState
from .export import Export
from .docker import DockerEngine, split_ref
from .docker_client import short, short_text
from .errors import BuildFailed, BuildTimedOut, EngineError, TagFailed, base_image_missing, classify_failure

if TYPE_CHECKING:
    import requests


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



class ClassicBuilder:
    """The Engine API's classic builder (no secrets, no cache mounts, the daemon's platform)."""

    kind: BuilderKind = "classic"

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine
        # The build running in this thread collects its HTTP response here (see build()).
        self._response_sink = threading.local()
        self._hooked = False

    def describe(self) -> str:
        return "the classic builder (Docker Engine API)"

    @property
    def _client(self) -> Any:
        client = self.engine.client
        if not self._hooked:
            # Keep the streamed build's HTTP response reachable, so an interrupt or a
            # timeout can close its connection: that is what makes dockerd cancel the build.
            client.api.hooks["response"].append(self._collect_response)
            self._hooked = True
        return client

    def _collect_response(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        sink: list[requests.Response] | None = getattr(self._response_sink, "responses", None)
        if sink is not None and "/build" in (response.url or ""):
            sink.append(response)

    def build(self, req: BuildRequest, on_progress: OnProgress | None = None) -> BuildResult:
        check_request(req)
        if req.export is not None and req.export != Export():
            raise EngineError("the classic builder cannot choose compression, attach provenance or use a "
                              "registry cache; build with --builder buildkit (buildx)")
        if req.secrets or req.contexts:
            raise EngineError("the classic builder cannot take build secrets or named contexts; build with "
                              "--builder buildkit (a docker CLI with BuildKit or buildx)")
        self.engine.ping()
        started = time.monotonic()
        wall_started = time.time()
        state = BuildState(started, on_progress)
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

    def _discard(self, state: BuildState) -> None:
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
        with self.engine.daemon_errors():
            for tag in tags:
                try:
                    found.append(str(self._client.api.inspect_image(tag)["Id"]))
                except docker.errors.APIError:
                    pass  # no such image, or a tag the daemon cannot parse (tagging will say so)
        return found

    def _remove_leftovers(self, candidates: Sequence[str], keep: str) -> tuple[str, ...]:
        """Remove each candidate that is not `keep`, has no tag and no child image: what this
        build left untagged; then, the same way, the step images under each one removed (the
        containerd image store keeps a removed image's untagged parents). Anything tagged, in
        use or built upon stays (the daemon is shared)."""
        import docker

        removed: list[str] = []
        with self.engine.daemon_errors():
            children: dict[str, set[str]] = {}
            for listed in self._listed_images():
                children.setdefault(str(listed.get("ParentId", "")), set()).add(str(listed["Id"]))
            pending = list(dict.fromkeys(candidates))
            while pending:
                try:
                    attrs = self._client.api.inspect_image(pending.pop(0))
                except docker.errors.ImageNotFound:
                    continue
                image_id, parent = str(attrs["Id"]), str(attrs.get("Parent") or "")
                if image_id == keep or image_id in removed or attrs.get("RepoTags") or children.get(image_id):
                    continue
                try:
                    self._client.api.remove_image(image_id)
                except docker.errors.APIError:
                    continue  # a container uses it, or another build just did: leave it
                removed.append(image_id)
                if parent:
                    children.get(parent, set()).discard(image_id)
                    pending.append(parent)
        return tuple(removed)

    def _listed_images(self) -> list[dict[str, Any]]:
        """Every image, step images too. The containerd image store answers the listing with a
        404 when an image it is listing is removed meanwhile (another build's clean-up on the
        shared daemon): list again, a few times, before calling that a fault."""
        import docker

        for attempt in range(4):
            try:
                return list(self._client.api.images(all=True))
            except docker.errors.NotFound:
                time.sleep(0.2 * (attempt + 1))
        return list(self._client.api.images(all=True))  # a fifth 404 is a fault

    def _stream_build(self, req: BuildRequest, state: BuildState, log: IO[str] | None) -> str | None:
        """Feed the build's stream to `state` and the log; the daemon's error, if any."""
        with self.engine.daemon_errors():
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

    def _build_error(self, error: str, state: BuildState, req: BuildRequest) -> EngineError:
        if state.in_from_step:
            image = _expand_args(state.base_image(), req.context / req.dockerfile, req.buildargs)
            return base_image_missing(image, short_text(error))
        tail = tuple(state.tail)
        return BuildFailed(step=state.step, total=state.total, instruction=state.instruction,
                           error=short_text(error), tail=tail, log_path=req.log_path,
                           cause=classify_failure(error, tail))

    def _remove_build_containers(self, state: BuildState, since: float, settle: float = 10) -> None:
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
    def _is_build_container(container: Mapping[str, Any], state: BuildState, since: float) -> bool:
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

        with self.engine.daemon_errors():
            image = self._client.images.get(image_id)
            applied: list[str] = []
            for tag in tags:
                repository, name = split_ref(tag)
                try:
                    if not image.tag(repository, name):
                        raise docker.errors.APIError(f"the daemon refused tag {tag}")
                except docker.errors.APIError as e:
                    for done in applied:
                        self._client.api.remove_image(done, noprune=True)
                    raise TagFailed(image_id=image.id, tag=tag, detail=short(e)) from e
                applied.append(tag)
            image.reload()
            return image

    # -- images


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


