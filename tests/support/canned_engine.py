"""publish's engine, canned: dockerd's answers without dockerd, and a record of what was asked.

CannedEngine is the classic builder and the whole engine (imagebuilder.engine.api's Builder and
Engine); CannedStore answers as dockerd with the containerd image store does; CannedBackground is
BuildKit through buildx, whose registry cache goes up as a background build (a BackgroundBuilder).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from imagebuilder.engine.api import (NO_ACCESS, BuilderKind, BuildRequest, BuildResult, HostAccess, OnProgress, Pushed,
                                     RunResult)
from imagebuilder.engine.errors import BuildFailed, PushFailed

from .fakes import TickingBuild

if TYPE_CHECKING:
    from imagebuilder.engine.api import BackgroundBuilder, Builder, Engine

LAYERS = ["sha256:" + "1" * 64, "sha256:" + "2" * 64]  # the built image's uncompressed layers
LABELS = {"io.imagebuilder.inputs-hash": "same"}


@dataclass
class CannedEngine:
    """Answers as dockerd would, from canned values; records what was asked of it."""

    fail_build: set[str] = field(default_factory=set)
    fail_push: set[str] = field(default_factory=set)
    digests: dict[str, str] = field(default_factory=dict)
    contents: dict[str, str] = field(default_factory=dict)  # tag -> the id of the image it names
    built: list[str] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)
    pulled: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    kind: BuilderKind = "classic"  # it is the builder too

    def describe(self) -> str:
        return "canned builds"

    def ping(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {}

    def image_exists(self, ref: str) -> bool:
        return False

    def image_labels(self, ref: str) -> dict[str, str]:
        return {}

    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        return None

    def run(self, image: str, command: Sequence[str] | str, *, timeout: float, gpus: bool = False,
            shm_size: str | None = None, environment: Mapping[str, str] | None = None,
            volumes: Mapping[str, str] | None = None, workdir: str | None = None,
            archives: Mapping[str, bytes] | None = None, on_output: Callable[[str], None] | None = None,
            access: HostAccess = NO_ACCESS) -> RunResult:
        raise AssertionError("the runner starts no container itself: its verifier does")

    def build(self, req: BuildRequest, on_progress: OnProgress | None = None) -> BuildResult:
        ref = req.tags[0]
        if ref in self.fail_build:
            raise BuildFailed(step=3, total=9, instruction="RUN uv pip install torch", error="exit code: 1",
                              tail=("boom",), log_path=None)
        self.built.append(ref)
        image_id = f"sha256:{len(self.built):064x}"
        self.contents.update(dict.fromkeys(req.tags, image_id))
        return BuildResult(image_id, req.tags, 1, 1.0, 9, 0, 9, None)

    def read_file(self, image: str, path: str, *, platform: str | None = None) -> bytes | None:
        return b'{"bomFormat": "CycloneDX"}\n'  # the SBOM whose digest build labels the image with

    def remove_image(self, ref: str, force: bool = True) -> None:
        self.removed.append(ref)  # (build untags the unlabelled image it labelled)

    def tag_image(self, source: str, ref: str) -> None:
        self.contents[ref] = self.contents.get(source, source)

    def push(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> str:
        if ref in self.fail_push:
            raise PushFailed(ref=ref, attempts=retries, detail="connection refused")
        self.pushed.append(ref)
        # As a registry answers: the digest of what the tag names, one for every tag of one image
        # (a tag this engine did not build names content of its own).
        content = self.contents.get(ref, ref)
        return self.digests.setdefault(ref, "sha256:" + hashlib.sha256(content.encode()).hexdigest())

    def push_counted(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> Pushed:
        return Pushed(self.push(ref, retries=retries, backoff=backoff), frozenset())

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return {}

    def pull(self, ref: str) -> None:
        self.pulled.append(ref)


@dataclass
class CannedStore(CannedEngine):
    """dockerd with the containerd store: the image id is the digest of the index pushed,
    unless `recompress` (an engine that changed the image after the check)."""

    recompress: bool = False
    requests: list[BuildRequest] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return {"Id": self.ids.get(ref), "RootFS": {"Type": "layers", "Layers": LAYERS},
                "Config": {"Hostname": "", "Env": ["PATH=/opt/venv/bin"], "Cmd": None, "Labels": LABELS}}

    def build(self, req: BuildRequest, on_progress: OnProgress | None = None) -> BuildResult:
        self.requests.append(req)
        result = super().build(req, on_progress)
        for tag in req.tags:
            self.ids[tag] = result.image_id
        return result

    def push_counted(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> Pushed:
        if ref in self.fail_push:
            raise PushFailed(ref=ref, attempts=retries, detail="connection refused")
        self.pushed.append(ref)
        digest = "sha256:" + "f" * 64 if self.recompress else self.ids[ref]
        self.digests[ref] = digest
        # The first tag uploads the layer; the next ones find it there.
        first = len(self.pushed) == 1
        return Pushed(digest, frozenset({"a" * 12}) if first else frozenset())


@dataclass
class CannedBackground(CannedStore):
    """BuildKit through buildx: the registry cache's export starts as a background build."""

    kind: BuilderKind = "buildkit"
    busy: int = 2
    rc: int = 0
    timeline: list[str] = field(default_factory=list)
    started: list[BuildRequest] = field(default_factory=list)
    running: list[TickingBuild] = field(default_factory=list)
    contexts_then: list[bool] = field(default_factory=list)

    def can_start(self) -> bool:
        return True

    def start(self, req: BuildRequest) -> TickingBuild:
        self.started.append(req)
        self.contexts_then.append((req.context / req.dockerfile).is_file())
        self.timeline.append("cache export started")
        self.running.append(TickingBuild(self.busy, self.rc, self.timeline))
        return self.running[-1]


if TYPE_CHECKING:  # mypy's proof that each fake is what it stands in for
    _engine: Engine = CannedEngine()
    _builder: Builder = CannedStore()
    _background: BackgroundBuilder = CannedBackground()
