"""publish's runner over canned engine and registry answers: fast, no Docker, every branch.

The real-engine, real-registry runs are in test_publish.py; these pin down what the runner
decides when a build, a verification, a push or a confirmation goes wrong.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
from support.canned_engine import LABELS, LAYERS, CannedBackground, CannedEngine, CannedStore
from support.canned_publish import OPTIONS, CannedEstargz, NoSaves, images, run, verdict
from support.canned_registry import (CannedBlobs, CannedCache, CannedCacheTimeline, CannedPublished, CannedRegistry,
                                     IndexingRegistry)

from imagebuilder.build.render_options import RenderOptions
from imagebuilder.matrix.load import load_matrix
from imagebuilder.publish.indexes import WRITTEN, MergeIncomplete, plan_indexes, write_indexes
from imagebuilder.publish.ledger import report_document
from imagebuilder.publish.plan import (BUILD, FAILED, NOT_RUN, PUSHED, RETAG, SKIP, SKIPPED, VERIFIED, Outcome, plan,
                                       Remote, RunOptions, Step)
from imagebuilder.publish.report import format_indexes, format_summary, raise_if_failed
from imagebuilder.publish.run import publish
from imagebuilder.registry.manifests import OCI_MANIFEST
from imagebuilder.verify.report import VerifyReport


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


def test_with_the_containerd_store_the_pushed_digest_is_the_verified_image_and_timed() -> None:
    engine = CannedStore()
    (image,) = images()
    cache = f"127.0.0.1:5999/ml/imagebuilder-cache:{image.spec.key}"
    registry = CannedBlobs(answers={cache: "sha256:" + "c" * 64}, engine=engine)
    (outcome,) = run(plan([image], {}), engine, registry, export=ZSTD_EXPORT, cache_registry=CACHE_REGISTRY)
    assert outcome.status == PUSHED and outcome.built is not None
    assert set(outcome.pushed.values()) == {outcome.built.result.image_id}
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
    last = engine.requests[-1].export
    assert last is not None and last.cache_to == cache


PUBLISHED = "sha256:" + "d" * 64


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


def _estargz(registry: CannedRegistry) -> CannedEstargz:
    return CannedEstargz(engine=NoSaves(), registry=registry)


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
    log = engine.started[1].log_path
    assert log is not None and log.name.endswith("-cache-2.log")


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
    assert outcome.status == PUSHED and outcome.built is not None, outcome.reason
    assert engine.pushed == list(image.refs)
    assert set(outcome.pushed.values()) == {outcome.built.result.image_id}


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
    (outcome,) = run(plan([image], {}), engine, registry, export=Export(Compression("zstd"), provenance=True),
                     gzip_too=True, platform="linux/amd64")
    assert outcome.status == PUSHED, outcome.reason
    first, labelled, gzip = engine.requests
    assert first.export is not None and first.export.compression == Compression("zstd")
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
    options = replace(OPTIONS, export=Export(Compression("zstd"), provenance=True), gzip_too=True,
                      platform="linux/amd64", push=asked.get("push", True))
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


def test_the_start_profile_runs_under_start_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """--start-timeout (PublishRequest.start_timeout) is the limit the start profile runs under."""
    import imagebuilder.publish.estargz as estargz

    seen: list[tuple[str, tuple[str, ...], float]] = []

    def profiled(ref: str, command: tuple[str, ...], *, timeout: float) -> object:
        seen.append((ref, command, timeout))
        return object()

    monkeypatch.setattr(estargz, "start_profile", profiled)
    publisher = estargz.EstargzPublisher(cast(Any, None), cast(Any, None), start=("python", "-c", "pass"),
                                         start_timeout=42.0)
    publisher._profile("img:1")
    assert seen == [("img:1", ("python", "-c", "pass"), 42.0)]
    assert estargz.EstargzPublisher(cast(Any, None), cast(Any, None)).start_timeout == 600.0
