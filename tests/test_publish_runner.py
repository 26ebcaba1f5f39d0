"""publish's runner over canned engine and registry answers: fast, no Docker, every branch.

The real-engine, real-registry runs are in test_publish.py; these pin down what the runner
decides when a build, a verification, a push or a confirmation goes wrong.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from support.fakes import TickingBuild

from imagebuilder.build.per_platform import Reading, each_platform
from imagebuilder.build.render import RenderedImage
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.engine.api import (NO_ACCESS, BuilderKind, BuildRequest, BuildResult, HostAccess, OnProgress, Pushed,
                                     RunResult)
from imagebuilder.engine.errors import PushFailed
from imagebuilder.engine.errors import BuildFailed
from imagebuilder.estargz.profile import StartProfile
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.selection import Selection
from imagebuilder.publish.estargz import Converted, EstargzPublisher
from imagebuilder.publish.indexes import WRITTEN, MergeIncomplete, plan_indexes, write_indexes
from imagebuilder.publish.ledger import report_document
from imagebuilder.publish.plan import (BUILD, FAILED, NOT_RUN, PUSHED, RETAG, SKIP, SKIPPED, VERIFIED, Outcome, plan,
                                       Remote, RunOptions, Step)
from imagebuilder.publish.report import format_indexes, format_summary, raise_if_failed
from imagebuilder.publish.run import publish
from imagebuilder.registry.manifests import OCI_MANIFEST
from imagebuilder.trust.signing import SIGNATURE_ANNOTATION, SIMPLE_SIGNING
from imagebuilder.verify.preflight import PreflightItem
from imagebuilder.verify.report import VerifyReport
from smoke_tests.result import FAIL, PASS, Result

SMALL = Path(__file__).parent / "data" / "matrix-small.yaml"
M = load_matrix(SMALL)
OPTIONS = RunOptions(matrix_path=SMALL, push_retries=1, push_backoff=0)


def images(variant: str | None = "runtime") -> list[RenderedImage]:
    opts = RenderOptions(repository="127.0.0.1:5999/ml/pytorch")
    selection = Selection(torch="2.6", cuda="12.4", os="ubuntu22.04", variant=variant)
    (selected,) = each_platform(M, selection, opts, ["linux/amd64"], Reading(request=False), read_os_release=None,
                                note=print, host="linux/amd64")
    return list(selected.images)


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

    def read_file(self, image: str, path: str) -> bytes | None:
        return b'{"bomFormat": "CycloneDX"}\n'  # the SBOM whose digest build labels the image with

    def remove_image(self, ref: str, force: bool = True) -> None:
        self.removed.append(ref)  # (build untags the unlabelled image it labelled)

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
class CannedRegistry:
    answers: dict[str, str | None] = field(default_factory=dict)  # what the registry says a ref names
    engine: CannedEngine | None = None
    put: list[tuple[str, str]] = field(default_factory=list)

    def digest(self, ref: str) -> str | None:
        pinned = ref.partition("@")[2]
        if pinned:  # a manifest by digest: there while a tag names it
            named = {*self.answers.values(), *(self.engine.digests.values() if self.engine else ())}
            return pinned if pinned in named else None
        if ref in self.answers:
            return self.answers[ref]
        return self.engine.digests.get(ref) if self.engine else None

    def labels(self, ref: str) -> dict[str, str] | None:
        return None

    def put_tag(self, ref: str, digest: str) -> str:
        self.put.append((ref, digest))
        return self.answers.get(ref, digest) or ""

    def index_for(self, ref: str, children: Sequence[tuple[str, str]]) -> bytes:
        raise AssertionError("these runs publish one platform: no index")

    def put_index(self, ref: str, body: bytes) -> str:
        raise AssertionError("these runs publish one platform: no index")

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        return None

    def blobs(self, ref: str) -> dict[str, tuple[int, str]]:
        return {}

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None:
        if ref.endswith(".sig") and self.digest(ref):  # cosign's signature manifest, one signature layer
            layer = {"mediaType": SIMPLE_SIGNING, "annotations": {SIGNATURE_ANNOTATION: "MEUCIQ..."}}
            return {"schemaVersion": 2, "layers": [layer]}, OCI_MANIFEST
        return None

    def has_blob(self, ref: str, digest: str) -> bool:
        return False

    def mount(self, ref: str, digest: str, source: str) -> bool:
        return False

    def provenance(self, ref: str) -> dict[str, Any] | None:
        return None


def verdict(ok: bool) -> Callable[[Any, Any, str, RunOptions], VerifyReport]:
    def verifier(engine: Any, registry: Any, ref: str, options: RunOptions) -> VerifyReport:
        check = Result("compile", PASS) if ok else Result("compile", FAIL, "no C++ compiler on PATH")
        return VerifyReport(ref, "docker", (PreflightItem("daemon", PASS, "answers"),), (check,))

    return verifier


def run(steps: Sequence[Step], engine: CannedEngine, registry: CannedRegistry, ok: bool = True,
        **options: Any) -> list[Outcome]:
    from dataclasses import replace

    return list(publish(steps, engine=engine, builder=engine, registry=registry,
                                options=replace(OPTIONS, **options), verifier=verdict(ok)))


def test_every_tag_is_pushed_and_confirmed():
    engine = CannedEngine()
    registry = CannedRegistry(engine=engine)
    (image,) = images()
    (outcome,) = run(plan([image], {}), engine, registry)
    assert outcome.status == PUSHED
    assert set(outcome.pushed) == set(image.refs) == set(engine.pushed)


def test_a_failed_verification_pushes_nothing():
    engine = CannedEngine()
    (outcome,) = run(plan(images(), {}), engine, CannedRegistry(engine=engine), ok=False)
    assert outcome.status == FAILED and "no C++ compiler" in outcome.reason
    assert engine.pushed == [] and outcome.pushed == {}


def test_a_push_the_registry_does_not_confirm_is_not_reported_pushed():
    engine = CannedEngine()
    (image,) = images()
    registry = CannedRegistry(answers={image.refs[1]: "sha256:someone-else"}, engine=engine)
    (outcome,) = run(plan([image], {}), engine, registry)
    assert outcome.status == FAILED and "registry answers sha256:someone-else" in outcome.reason
    assert list(outcome.pushed) == [image.refs[0]]  # only what the registry confirmed


def test_a_failed_push_mid_way_keeps_the_confirmed_ones_and_fails():
    (image,) = images()
    engine = CannedEngine(fail_push={image.refs[2]})
    (outcome,) = run(plan([image], {}), engine, CannedRegistry(engine=engine))
    assert outcome.status == FAILED and "push failed" in outcome.reason
    assert list(outcome.pushed) == list(image.refs[:2])


def test_without_keep_going_the_first_failure_stops_the_run_and_its_jupyter_fails():
    steps = plan(images(variant=None), {})
    assert [s.image.spec.variant for s in steps][-2:] == ["jupyter", "devel-jupyter"]
    runtime = next(s.image.ref for s in steps if s.image.spec.variant == "runtime")
    engine = CannedEngine(fail_build={runtime})
    outcomes = run(steps, engine, CannedRegistry(engine=engine), keep_going=True)
    by_variant = {o.step.image.spec.variant: o for o in outcomes}
    assert by_variant["runtime"].status == FAILED and "step 3/9" in by_variant["runtime"].reason
    assert by_variant["jupyter"].status == FAILED and runtime in by_variant["jupyter"].reason
    assert by_variant["devel"].status == PUSHED  # --keep-going: the others ran
    assert by_variant["devel-jupyter"].status == PUSHED  # its devel parent did not fail
    stopped = run(steps, CannedEngine(fail_build={runtime}), CannedRegistry())
    assert [o.status for o in stopped][0] == FAILED
    assert {o.status for o in stopped[1:]} == {NOT_RUN}


def test_a_jupyter_image_is_built_from_the_published_runtime_when_that_was_not_rebuilt():
    runtime, jupyter = images(variant="jupyter")
    published = {runtime.ref: Remote({ref: "sha256:r" for ref in runtime.refs}, runtime.inputs_hash)}
    steps = plan([runtime, jupyter], published)
    assert [s.action for s in steps] == [SKIP, BUILD]
    engine = CannedEngine()
    outcomes = run(steps, engine, CannedRegistry(engine=engine))
    assert engine.pulled == [runtime.ref] and outcomes[-1].status == PUSHED


def test_a_retag_the_registry_does_not_confirm_fails():
    (image,) = images()
    remote = Remote({image.ref: "sha256:r", **{ref: None for ref in image.refs[1:]}}, image.inputs_hash)
    (step,) = plan([image], {image.ref: remote})
    assert step.action == RETAG
    registry = CannedRegistry(answers={image.refs[1]: "sha256:other"})
    (outcome,) = run([step], CannedEngine(), registry)
    assert outcome.status == FAILED and "retag failed" in outcome.reason


def test_no_push_verifies_and_leaves_the_registry_alone():
    engine = CannedEngine()
    (outcome,) = run(plan(images(), {}), engine, CannedRegistry(engine=engine), push=False)
    assert outcome.status == VERIFIED and engine.pushed == []


# --- the containerd image store: what is pushed is the image verify ran --------------------

from imagebuilder.engine.export import Compression, Export  # noqa: E402
from imagebuilder.registry.reference import RegistryTarget  # noqa: E402

ZSTD_EXPORT = Export(Compression("zstd"), provenance=True)
CACHE_REGISTRY = RegistryTarget("127.0.0.1:5999", "ml")


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
class CannedBlobs(CannedRegistry):
    def blobs(self, ref: str) -> dict[str, tuple[int, str]]:
        return {"sha256:" + "a" * 64: (4000, "application/vnd.oci.image.layer.v1.tar+zstd"),
                "sha256:" + "b" * 64: (30, "application/vnd.oci.image.config.v1+json")}


def test_with_the_containerd_store_the_pushed_digest_is_the_verified_image_and_timed() -> None:
    engine = CannedStore()
    (image,) = images()
    cache = f"127.0.0.1:5999/ml/imagebuilder-cache:{image.spec.key}"
    registry = CannedBlobs(answers={cache: "sha256:" + "c" * 64}, engine=engine)
    (outcome,) = run(plan([image], {}), engine, registry, export=ZSTD_EXPORT, cache_registry=CACHE_REGISTRY)
    assert outcome.status == PUSHED
    assert set(outcome.pushed.values()) == {outcome.built.result.image_id}  # type: ignore[union-attr]
    report = outcome.to_json()
    assert report["pushed_bytes"] == 4000  # the layer once; the other tags uploaded nothing
    assert all(isinstance(report[k], float) for k in ("build_s", "verify_s", "push_s"))
    # Every build imports the image's registry cache; the final (labelled) build exports it too.
    first, final = engine.requests
    assert first.export == Export(Compression("zstd"), cache_from=(cache,))
    assert final.export == Export(Compression("zstd"), provenance=True, cache_from=(cache,), cache_to=cache)


def test_an_engine_that_pushes_other_bytes_than_it_verified_fails_the_push() -> None:
    engine = CannedStore(recompress=True)
    (image,) = images()
    (outcome,) = run(plan([image], {}), engine, CannedBlobs(engine=engine), export=ZSTD_EXPORT)
    assert outcome.status == FAILED and "the image verify ran is" in outcome.reason
    assert outcome.pushed == {}


def test_a_cache_the_registry_does_not_have_yet_is_exported_not_imported() -> None:
    engine = CannedStore()
    (image,) = images()
    run(plan([image], {}), engine, CannedBlobs(engine=engine), export=ZSTD_EXPORT, cache_registry=CACHE_REGISTRY)
    cache = f"127.0.0.1:5999/ml/imagebuilder-cache:{image.spec.key}"
    assert [r.export.cache_from for r in engine.requests if r.export] == [(), ()]
    assert engine.requests[-1].export.cache_to == cache  # type: ignore[union-attr]


PUBLISHED = "sha256:" + "d" * 64
LAYERS = ["sha256:" + "1" * 64, "sha256:" + "2" * 64]  # the built image's uncompressed layers
LABELS = {"io.imagebuilder.inputs-hash": "same"}


@dataclass
class CannedCache(CannedBlobs):
    """A registry holding the image's build cache: two of the image's layers and one of an
    older build's; it mounts what it is asked to and records it (before or after a push)."""

    mounted: list[tuple[str, str, str, int]] = field(default_factory=list)

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None:
        if "imagebuilder-cache" not in ref:
            return None
        layers = [{"digest": f"sha256:{n * 64}", "annotations": {"containerd.io/uncompressed": diff_id}}
                  for n, diff_id in (("e", LAYERS[0]), ("f", LAYERS[1]), ("9", "sha256:" + "0" * 64))]
        return {"layers": layers}, "application/vnd.oci.image.manifest.v1+json"

    def mount(self, ref: str, digest: str, source: str) -> bool:
        self.mounted.append((ref, digest, source, len(self.engine.pushed) if self.engine else 0))
        return True


def test_the_push_mounts_the_image_s_layers_from_its_build_cache_first() -> None:
    """The cache export uploaded the image's blobs (mode=min) to the cache's repository: they
    are mounted into the image's own before `docker push`, which then uploads none of them.
    A layer of the cache that the image does not have stays where it is."""
    engine = CannedStore()
    (image,) = images()
    cache = f"127.0.0.1:5999/ml/imagebuilder-cache:{image.spec.key}"
    registry = CannedCache(answers={cache: "sha256:" + "c" * 64}, engine=engine)
    (outcome,) = run(plan([image], {}), engine, registry, export=ZSTD_EXPORT, cache_registry=CACHE_REGISTRY)
    assert outcome.status == PUSHED
    assert registry.mounted == [(image.ref, f"sha256:{n * 64}", cache, 0) for n in "ef"]


def test_without_a_registry_cache_nothing_is_mounted() -> None:
    engine = CannedStore()
    (image,) = images()
    registry = CannedCache(engine=engine)
    (outcome,) = run(plan([image], {}), engine, registry, export=ZSTD_EXPORT)
    assert outcome.status == PUSHED and registry.mounted == []


@dataclass(frozen=True)
class CannedEstargz(EstargzPublisher):
    """publish's eStargz push with its work canned: it 'puts' `digest` under the refs by
    telling the canned registry, which may answer something else for one of them."""

    digest: str = "sha256:" + "5" * 64
    calls: list[tuple[str, tuple[str, ...], str | None, bool]] = field(default_factory=list)

    def push(self, ref: str, refs: Sequence[str], platform: str | None) -> Converted:
        self.calls.append((ref, tuple(refs), platform, self.start is not None))
        registry = self.registry
        assert isinstance(registry, CannedRegistry)
        for tag in refs:
            registry.answers.setdefault(tag, self.digest)
        profile = StartProfile(("/opt/venv/bin/python3", "/opt/venv/lib/torch/lib/libtorch_cpu.so"),
                               ("python3", "-c", "import torch"), "1000", 12.5)
        return Converted(self.digest, "sha256:" + "6" * 64, 1234, profile, (), {"estargz_s": 3.0})


def _estargz(registry: CannedRegistry) -> CannedEstargz:
    return CannedEstargz(engine=None, registry=registry)  # type: ignore[arg-type]


def test_estargz_pushes_through_the_publisher_not_docker_push_and_reports_its_profile() -> None:
    """--compression estargz: the verified zstd image goes up as ordered eStargz through the
    registry API; no `docker push`, no mount of the cache's zstd blobs; every tag confirmed."""
    engine = CannedStore()
    (image,) = images()
    cache = f"127.0.0.1:5999/ml/imagebuilder-cache:{image.spec.key}"
    registry = CannedCache(answers={cache: "sha256:" + "c" * 64}, engine=engine)
    publisher = _estargz(registry)
    (outcome,) = run(plan([image], {}), engine, registry, export=ZSTD_EXPORT, cache_registry=CACHE_REGISTRY,
                     estargz=publisher)
    assert outcome.status == PUSHED, outcome.reason
    assert publisher.calls == [(image.ref, tuple(image.refs), None, True)]
    assert engine.pushed == [] and registry.mounted == []
    assert outcome.pushed == {ref: publisher.digest for ref in image.refs}
    report = outcome.to_json()
    assert report["pushed_bytes"] == 1234
    assert report["estargz"]["profile"]["files"][1].endswith("libtorch_cpu.so")
    assert report["estargz"]["profile"]["command"] == ["python3", "-c", "import torch"]


def test_an_emulated_platform_s_estargz_goes_up_unordered_without_running_its_start() -> None:
    engine = CannedStore()
    (image,) = images()
    registry = CannedBlobs(engine=engine)
    said: list[str] = []
    publisher = replace(_estargz(registry), say=said.append)
    (outcome,) = run(plan([image], {}), engine, registry, export=ZSTD_EXPORT, estargz=publisher,
                     platform="linux/riscv64", verify=False)
    assert outcome.status == PUSHED, outcome.reason
    assert publisher.calls == [(image.ref, tuple(image.refs), "linux/riscv64", False)]
    assert said and "linux/riscv64 is emulated here" in said[0]


def test_an_estargz_tag_the_registry_does_not_confirm_fails_the_push() -> None:
    engine = CannedStore()
    (image,) = images()
    registry = CannedBlobs(answers={image.refs[1]: "sha256:someone-else"}, engine=engine)
    (outcome,) = run(plan([image], {}), engine, registry, export=ZSTD_EXPORT, estargz=_estargz(registry))
    assert outcome.status == FAILED and "registry answers sha256:someone-else" in outcome.reason
    assert list(outcome.pushed) == [image.refs[0]]


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


@dataclass
class CannedCacheTimeline(CannedCache):
    def mount(self, ref: str, digest: str, source: str) -> bool:
        assert isinstance(self.engine, CannedBackground)
        self.engine.timeline.append("mount")
        return super().mount(ref, digest, source)


def _publish_beside(engine: CannedBackground, ok: bool = True) -> tuple[Outcome, list[str], str]:
    (image,) = images()
    cache = f"127.0.0.1:5999/ml/imagebuilder-cache:{image.spec.key}"
    registry = CannedCacheTimeline(answers={cache: "sha256:" + "c" * 64}, engine=engine)
    events: list[str] = []

    def verifier(*args: Any) -> VerifyReport:
        engine.timeline.append("verify")
        return verdict(ok)(*args)

    from dataclasses import replace
    (outcome,) = publish(plan([image], {}), engine=engine, builder=engine, registry=registry,
                                 options=replace(OPTIONS, export=ZSTD_EXPORT, cache_registry=CACHE_REGISTRY),
                                 verifier=verifier, on_event=lambda phase, step: events.append(phase))
    return outcome, events, cache


def test_the_registry_cache_goes_up_beside_verify_and_the_push_mounts_after_it() -> None:
    """The image's builds export the image alone; the cache-only build of the same labelled
    Dockerfile starts after them, runs while verify does, and the push waits for it (a line every
    15 s) before mounting the image's layers from it."""
    engine = CannedBackground()
    outcome, events, cache = _publish_beside(engine)
    assert outcome.status == PUSHED and "failed" not in outcome.reason
    first, final = engine.requests
    assert first.export == Export(Compression("zstd"), cache_from=(cache,))
    assert final.export == Export(Compression("zstd"), provenance=True, cache_from=(cache,))  # no cache_to
    (started,) = engine.started
    assert started.export == Export(Compression("zstd"), cache_from=(cache,), cache_to=cache, image=False)
    assert started.dockerfile == final.dockerfile and started.log_path is not None
    assert started.log_path.name.endswith("-cache.log")
    assert engine.timeline == ["cache export started", "verify", "cache exported", "mount", "mount"]
    assert events == ["build", "verify", "push", "cache", "cache"]  # two waits of 15 s, each said
    assert isinstance(outcome.to_json()["cache_export_s"], float)
    # The context it built from was there while it ran, and is gone now it has ended.
    assert engine.contexts_then == [True] and not started.context.exists()


def test_a_failed_cache_export_leaves_the_layers_to_the_push_and_says_so() -> None:
    engine = CannedBackground(busy=0, rc=1)
    outcome, _, _ = _publish_beside(engine)
    assert outcome.status == PUSHED
    assert "registry cache" in outcome.reason and "failed (exit 1" in outcome.reason
    assert "the push uploaded the layers itself" in outcome.reason
    assert len(engine.started) == 2  # run once more before giving up, logged beside the first
    assert engine.started[1].log_path.name.endswith("-cache-2.log")  # type: ignore[union-attr]


def test_a_failed_verification_stops_the_cache_export() -> None:
    engine = CannedBackground(busy=5)
    outcome, _, _ = _publish_beside(engine, ok=False)
    assert outcome.status == FAILED and engine.pushed == []
    (running,) = engine.running
    assert running.stopped and not engine.started[0].context.exists()
    assert "cache exported" not in engine.timeline


def test_a_no_push_run_waits_for_the_cache_export() -> None:
    engine = CannedBackground(busy=1)
    (image,) = images()
    from dataclasses import replace
    (outcome,) = publish(plan([image], {}), engine=engine, builder=engine,
                                 registry=CannedBlobs(engine=engine), verifier=verdict(True),
                                 options=replace(OPTIONS, export=ZSTD_EXPORT, cache_registry=CACHE_REGISTRY,
                                                 push=False))
    assert outcome.status == VERIFIED and engine.timeline[-1] == "cache exported"
    assert not engine.running[0].stopped


@dataclass
class CannedPublished(CannedBlobs):
    """A registry whose tag names a published image: its config and layers' media type."""

    config: dict[str, Any] = field(default_factory=lambda: {
        "rootfs": {"type": "layers", "diff_ids": LAYERS}, "config": {"Env": ["PATH=/opt/venv/bin"], "Labels": LABELS}})
    layers: str = "application/vnd.oci.image.layer.v1.tar+zstd"

    def digest(self, ref: str) -> str | None:  # what a push put there, else what was published
        return (self.engine.digests.get(ref) if self.engine else None) or self.answers.get(ref)

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        return (self.config, (self.layers,) * len(LAYERS)) if self.digest(ref) else None


def test_a_republish_of_the_image_the_registry_has_uploads_nothing_and_keeps_its_digest() -> None:
    """The same layers and settings are the same image (BuildKit's new index differs only in its
    provenance's timestamps): no push, the published digest stays under every tag, a missing tag
    points at it."""
    engine = CannedStore()
    (image,) = images()
    registry = CannedPublished(answers={image.ref: PUBLISHED}, engine=engine)
    (outcome,) = run([Step(image, BUILD, "--force")], engine, registry, export=ZSTD_EXPORT)
    assert outcome.status == PUSHED and engine.pushed == []
    assert outcome.pushed == {ref: PUBLISHED for ref in image.refs} and outcome.pushed_bytes == 0
    assert registry.put == [(ref, PUBLISHED) for ref in image.refs[1:]]
    assert "the registry had this image (dddddddddddd): kept, nothing uploaded" in outcome.reason


@pytest.mark.parametrize("published", [
    CannedPublished(config={"rootfs": {"diff_ids": LAYERS[:1]}, "config": {"Env": ["PATH=/opt/venv/bin"], "Labels": LABELS}}),
    CannedPublished(config={"rootfs": {"diff_ids": LAYERS}, "config": {"Env": ["PATH=/opt/venv/bin"], "Labels": {**LABELS, "x": "y"}}}),
    CannedPublished(layers="application/vnd.oci.image.layer.v1.tar+gzip"),  # zstd was asked for
], ids=["other-layers", "other-labels", "other-compression"])
def test_a_registry_image_that_differs_in_config_or_compression_is_pushed_over(published: CannedPublished) -> None:
    engine = CannedStore()
    (image,) = images()
    published.engine, published.answers = engine, {image.ref: PUBLISHED}
    (outcome,) = run([Step(image, BUILD, "--force")], engine, published, export=ZSTD_EXPORT)
    assert outcome.status == PUSHED, outcome.reason
    assert engine.pushed == list(image.refs)
    assert set(outcome.pushed.values()) == {outcome.built.result.image_id}  # type: ignore[union-attr]


def test_a_registry_that_fails_the_published_image_check_fails_the_push_not_the_run() -> None:
    """The check before the push reads the registry: its failure is the image's push failure."""
    from imagebuilder.registry.api import RegistryUnavailable

    class Down(CannedPublished):
        def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
            raise RegistryUnavailable(url="http://127.0.0.1:5999/v2/", detail="connection refused")

    engine = CannedStore()
    (image,) = images()
    (outcome,) = run([Step(image, BUILD, "--force")], engine, Down(engine=engine), export=ZSTD_EXPORT)
    assert outcome.status == FAILED and outcome.reason.startswith("push failed: the registry at")
    assert engine.pushed == [] and outcome.pushed == {}


# --------------------------------------------------------------------------- the report's layers

from imagebuilder.registry.api import RegistryUnavailable  # noqa: E402
from imagebuilder.registry.manifests import OCI_INDEX  # noqa: E402

ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
CACHED, SHARED, UNCACHED = ("sha256:" + n * 64 for n in ("f", "e", "7"))  # CannedCache lists e and f
PLATFORM_MANIFEST, ATTESTATION = "sha256:" + "c1" * 32, "sha256:" + "a7" * 32
INDEX = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
    {"mediaType": OCI_MANIFEST, "digest": PLATFORM_MANIFEST, "size": 900,
     "platform": {"os": "linux", "architecture": "amd64"}},
    {"mediaType": OCI_MANIFEST, "digest": ATTESTATION, "size": 500,
     "platform": {"os": "unknown", "architecture": "unknown"},
     "annotations": {"vnd.docker.reference.type": "attestation-manifest",
                     "vnd.docker.reference.digest": PLATFORM_MANIFEST}}]}


@dataclass
class LayeredRegistry(CannedCache):
    """CannedCache whose image repository holds blobs (`held`; a mount adds one, as a registry
    does) and whose images are what BuildKit pushes: an index over a linux/amd64 manifest that
    lists `image_layers`, and that manifest's attestation (which is never asked for)."""

    held: set[str] = field(default_factory=set)
    image_layers: tuple[tuple[str, int], ...] = ((SHARED, 4000), (CACHED, 3000), (UNCACHED, 2000))
    indexes: set[str] = field(default_factory=set)
    """Digests naming that index besides what the engine pushed (a published image)."""
    heads: list[tuple[str, str, int]] = field(default_factory=list)
    """(ref, digest, pushes so far) of each has_blob."""
    down: bool = False
    """has_blob and the image repository's manifests answer RegistryUnavailable."""

    def has_blob(self, ref: str, digest: str) -> bool:
        if self.down:
            raise RegistryUnavailable(url="http://127.0.0.1:5999/v2/", detail="connection refused")
        self.heads.append((ref, digest, len(self.engine.pushed) if self.engine else 0))
        return digest in self.held

    def mount(self, ref: str, digest: str, source: str) -> bool:
        self.held.add(digest)
        return super().mount(ref, digest, source)

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None:
        if "imagebuilder-cache" in ref:
            return super().manifest(ref)
        if self.down:
            raise RegistryUnavailable(url="http://127.0.0.1:5999/v2/", detail="connection refused")
        digest = ref.partition("@")[2]
        if digest in self.indexes or digest in (self.engine.digests.values() if self.engine else ()):
            return INDEX, OCI_INDEX
        if digest == PLATFORM_MANIFEST:
            layers = [{"mediaType": ZSTD_LAYER, "digest": d, "size": size} for d, size in self.image_layers]
            config = {"digest": "sha256:" + "b" * 64}
            return {"mediaType": OCI_MANIFEST, "config": config, "layers": layers}, OCI_MANIFEST
        return None


def _layers(outcome: Outcome) -> list[tuple[str, int, bool | None, str | None]]:
    listed = outcome.to_json()["layers"]
    assert {(layer["platform"], layer["manifest"], layer["media_type"]) for layer in listed} == {
        ("linux/amd64", PLATFORM_MANIFEST, ZSTD_LAYER)}
    return [(layer["digest"], layer["size"], layer["in_registry_before"], layer["mounted_from"]) for layer in listed]


def test_the_report_lists_each_pushed_layer_and_whether_the_repository_had_it_before_the_push() -> None:
    """Its repository had one layer (the runtime image's, say): that one is not mounted and is
    reported there before; the one mounted from the build cache was not; one that no manifest
    asked before the push listed (the cache exported another compression) is not checked,
    and the report says so rather than guess."""
    engine = CannedStore()
    (image,) = images()
    cache = f"127.0.0.1:5999/ml/imagebuilder-cache:{image.spec.key}"
    registry = LayeredRegistry(answers={cache: "sha256:" + "c" * 64}, engine=engine, held={SHARED})
    (outcome,) = run(plan([image], {}), engine, registry, export=ZSTD_EXPORT, cache_registry=CACHE_REGISTRY)
    assert outcome.status == PUSHED
    # Every layer the cache lists was asked about in the image's repository, before any push.
    assert sorted(registry.heads) == sorted((image.ref, d, 0) for d in (SHARED, CACHED, "sha256:" + "9" * 64))
    assert registry.mounted == [(image.ref, CACHED, cache, 0)]
    assert _layers(outcome) == [(SHARED, 4000, True, None),
                                (CACHED, 3000, False, "127.0.0.1:5999/ml/imagebuilder-cache"),
                                (UNCACHED, 2000, None, None)]
    assert outcome.to_json()["layers_reason"].startswith("1 of 3 layers not checked: no manifest asked before the push")
    summary = format_summary([outcome]).splitlines()[-1]
    assert summary == (f"{image.tags[0]} layers: 1 new (3.0 KB; 1 mounted from the build cache), "
                       "1 already in the registry (4.0 KB), 1 not checked (2.0 KB)")
    document = report_document("127.0.0.1:5999/ml", True, False, [outcome.step], [outcome], ())
    assert [layer["digest"] for layer in document["images"][0]["layers"]] == [SHARED, CACHED, UNCACHED]


def test_a_skipped_image_lists_its_layers_from_the_registry_all_there_before() -> None:
    (image,) = images()
    published = "sha256:" + "d" * 64
    registry = LayeredRegistry(indexes={published})
    remote = Remote({ref: published for ref in image.refs}, image.inputs_hash)
    steps = plan([image], {image.ref: remote})
    (outcome,) = run(steps, CannedEngine(), registry)
    assert outcome.status == SKIPPED and registry.heads == []  # its manifest says they are there
    assert _layers(outcome) == [(SHARED, 4000, True, None), (CACHED, 3000, True, None), (UNCACHED, 2000, True, None)]
    assert outcome.to_json()["layers_reason"] is None
    assert format_summary([outcome]).splitlines()[-1] == (
        f"{image.tags[0]} layers: 0 new (0 B), 3 already in the registry (9.0 KB)")


@dataclass
class KeptRegistry(LayeredRegistry, CannedPublished):
    """The registry has this very image (CannedPublished) under PUBLISHED, listing LayeredRegistry's layers."""


def test_a_republish_the_registry_keeps_lists_every_layer_as_there_before() -> None:
    engine = CannedStore()
    (image,) = images()
    registry = KeptRegistry(answers={image.ref: PUBLISHED}, engine=engine, indexes={PUBLISHED})
    (outcome,) = run([Step(image, BUILD, "--force")], engine, registry, export=ZSTD_EXPORT)
    assert outcome.status == PUSHED and "kept, nothing uploaded" in outcome.reason
    assert [had for _, _, had, _ in _layers(outcome)] == [True, True, True]


def test_a_registry_that_cannot_list_the_layers_fails_no_publish_and_the_report_says_why() -> None:
    """Down before the push (the HEADs) and after it (the manifest): the image is pushed, and no
    layer is reported as there or as new."""
    engine = CannedStore()
    (image,) = images()
    registry = LayeredRegistry(engine=engine, down=True)
    (outcome,) = run(plan([image], {}), engine, registry, export=ZSTD_EXPORT)
    assert outcome.status == PUSHED, outcome.reason
    report = outcome.to_json()
    assert report["layers"] is None
    assert report["layers_reason"].startswith(f"could not read {image.repository}@")
    assert "did not answer" in report["layers_reason"]
    summary = format_summary([outcome]).splitlines()[-1]
    assert summary.startswith(f"{image.tags[0]} layers: not listed: could not read")

    # Up again after the push: every layer listed, none claimed, and why.
    class DownBeforeThePush(LayeredRegistry):
        def has_blob(self, ref: str, digest: str) -> bool:
            raise RegistryUnavailable(url="http://127.0.0.1:5999/v2/", detail="connection refused")

    engine = CannedStore()
    (outcome,) = run(plan([image], {}), engine, DownBeforeThePush(engine=engine), export=ZSTD_EXPORT,
                     cache_registry=CACHE_REGISTRY)
    assert outcome.status == PUSHED
    assert [had for _, _, had, _ in _layers(outcome)] == [None, None, None]
    reason = outcome.to_json()["layers_reason"]
    assert reason.startswith("the registry could not be asked before the push: the registry at")


def test_an_image_not_published_lists_no_layers() -> None:
    engine = CannedEngine()
    (outcome,) = run(plan(images(), {}), engine, LayeredRegistry(engine=engine), push=False)
    assert outcome.status == VERIFIED
    assert (outcome.to_json()["layers"], outcome.to_json()["layers_reason"]) == (
        None, "not read: the image is verified, not published")
    assert "layers:" not in format_summary([outcome])


# --------------------------------------------------------------------------- indexes over platforms


@dataclass
class IndexingRegistry(CannedRegistry):
    """A canned registry that writes image indexes (an index's digest: the sha256 of its document),
    whose images are of the platform they are asked for unless `platforms` (digest -> OS/ARCH of
    its image config) says otherwise."""

    platforms: dict[str, str] = field(default_factory=dict)
    configs_read: list[tuple[str, str | None]] = field(default_factory=list)

    def index_for(self, ref: str, children: Sequence[tuple[str, str]]) -> bytes:
        return json.dumps([ref, *children]).encode()

    def put_index(self, ref: str, body: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self.answers[ref] = digest
        self.put.append((ref, digest))
        return digest

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        self.configs_read.append((ref, platform))
        digest = ref.partition("@")[2]
        if digest not in self.answers.values():
            return None
        os_name, _, architecture = self.platforms.get(digest, platform or "linux/amd64").partition("/")
        return {"os": os_name, "architecture": architecture, "config": {}}, ()


INDEXED = "127.0.0.1:5999/ml/pytorch:2.11-runtime"
AMD64, ARM64 = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def _two_platforms(*refs: str, **platforms: str) -> IndexingRegistry:
    """Each ref's TAG-amd64 and TAG-arm64 pushed; `platforms`: what an image's config says instead."""
    answers: dict[str, str | None] = {}
    for n, ref in enumerate(refs):
        answers |= {f"{ref}-amd64": AMD64[:-1] + str(n), f"{ref}-arm64": ARM64[:-1] + str(n)}
    return IndexingRegistry(answers=answers, platforms={answers[f"{refs[0]}-{arch}"] or "": platform
                                                        for arch, platform in platforms.items()})


def test_an_index_is_written_over_the_images_whose_configs_say_their_platforms() -> None:
    registry = _two_platforms(INDEXED)
    wanted = {INDEXED: ["linux/amd64", "linux/arm64"]}
    (outcome,) = write_indexes(registry, plan_indexes(registry, wanted))
    assert outcome.status == WRITTEN and registry.put == [(INDEXED, outcome.digest)]
    # Each child's config is read by its digest (what the index lists), for its platform.
    assert registry.configs_read == [(f"127.0.0.1:5999/ml/pytorch@{AMD64[:-1]}0", "linux/amd64"),
                                     (f"127.0.0.1:5999/ml/pytorch@{ARM64[:-1]}0", "linux/arm64")]


def test_an_amd64_image_under_the_arm64_tag_fails_its_index_and_nothing_is_written_for_it() -> None:
    """A runner that pushed its amd64 build as TAG-arm64: listed as linux/arm64, it would be what
    every arm64 node pulls, and fails there with `exec format error`."""
    other = "127.0.0.1:5999/ml/pytorch:2.11-devel"
    registry = _two_platforms(INDEXED, other, arm64="linux/amd64")
    wanted = {INDEXED: ["linux/amd64", "linux/arm64"], other: ["linux/amd64", "linux/arm64"]}
    steps = plan_indexes(registry, wanted)
    expected = ("2.11-runtime-arm64 is a linux/amd64 image, not linux/arm64 (its image config says so); "
                "push each platform's own image under its tag")
    # The dry run says so, and writes nothing ...
    assert format_indexes(steps).splitlines()[0] == f"index {INDEXED}: would fail: {expected}"
    failed, written = write_indexes(registry, steps)
    # ... the run fails that index, writes the other, and exits 1 naming the tag.
    assert (failed.status, failed.reason, failed.digest) == (FAILED, expected, None)
    assert written.status == WRITTEN and registry.put == [(other, written.digest)]
    assert INDEXED not in registry.answers
    with pytest.raises(MergeIncomplete) as caught:
        raise_if_failed((), (failed, written))
    assert "1 of 2 tags could not be made indexes" in str(caught.value) and "\n" not in str(caught.value)


def test_merge_only_refuses_an_index_over_an_image_of_another_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """`publish --merge-only` end to end over the canned registry: exit 1, one error line, the
    failed index named with why, and nothing PUT for it."""
    from click.testing import CliRunner

    import imagebuilder.registry.client
    from imagebuilder.build.per_platform import render_spec as render
    from imagebuilder.cli import cli
    from imagebuilder.matrix.resolve import Request, resolve
    from imagebuilder.resources import default_matrix_path

    matrix = load_matrix(default_matrix_path())  # (the small matrix has no arm64 wheels)
    request = Request("2.11", "13.0", python="3.11", os="debian12", variant="runtime")
    refs = render(resolve(matrix, request), matrix, RenderOptions(repository="127.0.0.1:5999/ml/pytorch")).refs
    registry = _two_platforms(*refs, arm64="linux/amd64")
    monkeypatch.setattr(imagebuilder.registry.client, "HttpRegistry", lambda **kwargs: registry)
    result = CliRunner().invoke(cli, ["publish", "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--os",
                                      "debian12", "--variant", "runtime", "--registry", "127.0.0.1:5999/ml",
                                      "--platform", "linux/amd64,linux/arm64", "--merge-only"])
    assert result.exit_code == 1, result.output
    tag = refs[0].rpartition(":")[2]
    assert f"index {refs[0]}: failed: {tag}-arm64 is a linux/amd64 image, not linux/arm64" in result.stdout
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"1 of {len(refs)} tags could not be made indexes" in error and tag in error
    assert refs[0] not in dict(registry.put) and all(ref in dict(registry.put) for ref in refs[1:])


@dataclass
class DualBlobs(CannedBlobs):
    """Takes the index of a gzip+zstd publish: each pushed digest is an image manifest."""

    indexes: list[tuple[str, bytes]] = field(default_factory=list)
    signed: list[str] = field(default_factory=list)

    def index_for(self, ref: str, children: Sequence[tuple[str, str]]) -> bytes:
        from imagebuilder.registry.manifests import index_document, platform_entries

        return index_document([e for digest, platform in children
                               for e in platform_entries(platform, "application/vnd.oci.image.manifest.v1+json", 9,
                                                         digest, {})])

    def put_index(self, ref: str, body: bytes) -> str:
        self.indexes.append((ref, body))
        return "sha256:" + hashlib.sha256(body).hexdigest()


def test_gzip_zstd_exports_gzip_after_the_verified_zstd_image_and_pushes_one_index_over_both() -> None:
    from imagebuilder.engine.export import gzip_ref
    from imagebuilder.registry.manifests import ZSTD_ANNOTATION

    engine = CannedStore()
    (image,) = images()
    registry = DualBlobs(engine=engine)
    (outcome,) = run(plan([image], {}), engine, registry,
                     export=Export(Compression("gzip+zstd"), provenance=True), platform="linux/amd64")
    assert outcome.status == PUSHED, outcome.reason
    first, labelled, gzip = engine.requests
    assert first.export is not None and first.export.compression == Compression("gzip+zstd")  # BuildKit: zstd
    assert labelled.tags == image.refs
    assert gzip.tags == (gzip_ref(image.ref),) and gzip.export == Export(Compression("gzip"), provenance=True)
    # The gzip image first, then the zstd one under the tag, then the index over both.
    assert engine.pushed == [gzip_ref(image.ref), image.ref]
    ((ref, body),) = registry.indexes
    entries = json.loads(body)["manifests"]
    assert ref == image.ref and [e["digest"] for e in entries] == [engine.ids[gzip_ref(image.ref)],
                                                                    engine.ids[image.ref]]
    assert ZSTD_ANNOTATION not in entries[0].get("annotations", {}) and entries[1]["annotations"][ZSTD_ANNOTATION] == "true"
    index = "sha256:" + hashlib.sha256(body).hexdigest()
    assert {outcome.pushed[r] for r in image.refs} == {index}
    assert outcome.pushed[gzip_ref(image.ref)] == engine.ids[gzip_ref(image.ref)]


def _interrupted_verify(engine: Any, registry: Any, ref: str, options: RunOptions) -> VerifyReport:
    raise KeyboardInterrupt


GZIP_ENDINGS: dict[str, tuple[dict[str, Any], bool | None, str | None]] = {
    "pushed": ({}, True, PUSHED),
    "verification failed": ({}, False, FAILED),
    "push failed": ({"fail_push": "zstd"}, True, FAILED),
    "--no-push": ({"push": False}, True, VERIFIED),
    "Ctrl-C during verify": ({}, None, None),
}


@pytest.mark.parametrize("ending", list(GZIP_ENDINGS))
def test_the_local_gzip_image_of_gzip_zstd_is_removed_however_the_image_s_phases_end(ending: str) -> None:
    """TAG-gzip is the run's own, for the push alone: left behind it doubles the image's disk."""
    from dataclasses import replace

    from imagebuilder.engine.export import gzip_ref

    asked, ok, status = GZIP_ENDINGS[ending]
    engine = CannedStore()
    (image,) = images()
    if asked.get("fail_push"):
        engine.fail_push.add(image.ref)
    registry = DualBlobs(engine=engine)
    options = replace(OPTIONS, export=Export(Compression("gzip+zstd"), provenance=True), platform="linux/amd64",
                      push=asked.get("push", True))
    steps = plan([image], {})
    outcomes = publish(steps, engine=engine, builder=engine, registry=registry, options=options,
                               verifier=_interrupted_verify if ok is None else verdict(ok))
    if status is None:
        with pytest.raises(KeyboardInterrupt):
            list(outcomes)
    else:
        (outcome,) = outcomes
        assert outcome.status == status, outcome.reason
    assert engine.requests[-1].tags == (gzip_ref(image.ref),)  # it was made
    assert [ref for ref in engine.removed if ref.endswith("-gzip")] == [gzip_ref(image.ref)]
    assert image.ref not in engine.removed  # the verified image stays
