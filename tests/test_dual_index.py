"""--compression gzip+zstd without an engine: the compression's names and what BuildKit exports,
the index over a gzip and a zstd image (gzip first, zstd marked and after it, as containers/image
writes it), the pushes and tags of push_dual() over canned answers, and verify's
"what to pull instead". The real engines (Docker 20.10, Podman) are in test_dual_compression.py."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from support.real_images import imagebuilder
from support.canned_publish import images

from imagebuilder.engine.api import Pushed
from imagebuilder.engine.export import Compression, Export, gzip_ref, output_args
from imagebuilder.engine.export_decision import CompressionUnavailable, decide_export
from imagebuilder.errors import BadRequest
from imagebuilder.publish.dual import dual_index, images_of, marked_zstd
from imagebuilder.publish.plan import PUSHED, Outcome, RunOptions, plan
from imagebuilder.publish.push import Pushing, push_dual
from imagebuilder.publish.report import format_plan
from imagebuilder.registry.manifests import OCI_INDEX, ZSTD_ANNOTATION, index_document, platform_entries
from imagebuilder.verify.facts import gzip_instead, registry_compression

DUAL = Compression("gzip+zstd")
ZSTD = DUAL.exported  # what BuildKit exports into the store for it (export_decision)
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
REPO = "127.0.0.1:5999/ml/pytorch"


def _d(name: str) -> str:
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def test_gzip_zstd_exports_zstd_into_the_store_and_gzip_second() -> None:
    assert DUAL.exported == Compression("zstd") and DUAL.also == Compression("gzip")
    assert DUAL.media_suffix == "+zstd"
    assert Compression("gzip").also is None and Compression("zstd").exported == Compression("zstd")
    assert output_args(Export(DUAL))[:2] == ["--output", "type=image,compression=zstd,force-compression=true,"
                                                         "oci-mediatypes=true"]
    assert gzip_ref(f"{REPO}:2.6-runtime") == f"{REPO}:2.6-runtime-gzip"


def test_gzip_zstd_takes_no_level_and_needs_the_containerd_store() -> None:
    with pytest.raises(BadRequest, match="gzip\\+zstd exports each at BuildKit's default"):
        Compression("gzip+zstd", 3)
    with pytest.raises(CompressionUnavailable, match="--compression gzip\\+zstd"):
        decide_export(DUAL, command="publish", buildkit=True, image_store=False)
    decision = decide_export(DUAL, command="publish", buildkit=True, image_store=True)
    # One decision: zstd exported into the store (what verify runs), and gzip too, after it.
    assert decision.export == Export(Compression("zstd"), provenance=True) and decision.gzip_too
    assert decision.describe() == "gzip+zstd, exported by BuildKit and pushed as verified; SLSA provenance (mode=max)"
    build = decide_export(DUAL, command="build", buildkit=True, image_store=True)
    assert build.export == Export(Compression("zstd")) and build.gzip_too


def _entry(name: str, platform: str | None = "linux/amd64", **annotations: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"mediaType": MANIFEST, "digest": _d(name), "size": 100}
    if platform:
        os_name, _, arch = platform.partition("/")
        entry["platform"] = {"os": os_name, "architecture": arch}
    if annotations:
        entry["annotations"] = annotations
    return entry


def test_the_zstd_entries_are_marked_and_go_last_in_order() -> None:
    body = index_document([_entry("gz-amd64"), _entry("zs-amd64"), _entry("gz-arm64", "linux/arm64"),
                           _entry("zs-arm64", "linux/arm64")])
    marked = json.loads(marked_zstd(body, {_d("zs-amd64"), _d("zs-arm64")}))
    assert [e["digest"] for e in marked["manifests"]] == [_d(n) for n in ("gz-amd64", "gz-arm64", "zs-amd64", "zs-arm64")]
    assert [(e.get("annotations") or {}).get(ZSTD_ANNOTATION) for e in marked["manifests"]] == [None, None, "true", "true"]
    assert marked["mediaType"] == OCI_INDEX
    # Every platform's first entry is a gzip one: what Docker < 23 takes.
    assert images_of(json.dumps(marked).encode(), "linux/arm64") == (_d("gz-arm64"), _d("zs-arm64"))


def test_an_index_over_platforms_keeps_each_dual_index_s_mark() -> None:
    """A platform tag that is a gzip+zstd index joins the index over platforms with both entries,
    the zstd one still marked (and after every gzip one)."""
    amd64 = {"manifests": [_entry("gz-amd64"), _entry("zs-amd64", **{ZSTD_ANNOTATION: "true"})]}
    arm64 = {"manifests": [_entry("gz-arm64", "linux/arm64"), _entry("zs-arm64", "linux/arm64", **{ZSTD_ANNOTATION: "true"})]}
    entries = [*platform_entries("linux/amd64", OCI_INDEX, 1, _d("a"), amd64),
               *platform_entries("linux/arm64", OCI_INDEX, 1, _d("b"), arm64)]
    order = [e["digest"] for e in json.loads(index_document(entries))["manifests"]]
    assert order == [_d(n) for n in ("gz-amd64", "gz-arm64", "zs-amd64", "zs-arm64")]


@dataclass
class DualRegistry:
    """Canned answers: what each tag names, each image's document (BuildKit's index of the
    image and its provenance), and the index PUTs."""

    tags: dict[str, str] = field(default_factory=dict)
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    put: list[tuple[str, str]] = field(default_factory=list)

    def digest(self, ref: str) -> str | None:
        return self.tags.get(ref)

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None:
        digest = ref.partition("@")[2] or self.tags.get(ref)
        document = self.documents.get(digest or "")
        return (document, OCI_INDEX) if document is not None else None

    def index_for(self, ref: str, children: Sequence[tuple[str, str]]) -> bytes:
        entries = []
        for digest, platform in children:
            entries += platform_entries(platform, OCI_INDEX, 1, digest, self.documents[digest])
        return index_document(entries)

    def put_index(self, ref: str, body: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self.tags[ref] = digest
        self.put.append((ref, digest))
        return digest

    def put_tag(self, ref: str, digest: str) -> str:
        self.tags[ref] = digest
        return digest

    def blobs(self, ref: str) -> dict[str, tuple[int, str]]:
        return {}

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        return None


def _buildkit_index(image: str) -> dict[str, Any]:
    return {"manifests": [_entry(image), _entry(f"{image}-provenance", "unknown/unknown",
                                                **{"vnd.docker.reference.digest": _d(image)})]}


@dataclass
class PushingEngine:
    registry: DualRegistry
    pushed: list[str] = field(default_factory=list)

    def push_counted(self, ref: str, *, retries: int = 3, backoff: float = 2.0) -> Pushed:
        self.pushed.append(ref)
        digest = _d("gzip-index" if ref.endswith("-gzip") else "zstd-index")
        self.registry.tags[ref] = digest
        return Pushed(digest, frozenset())


def test_push_dual_pushes_gzip_then_zstd_then_the_index_under_every_tag() -> None:
    registry = DualRegistry(documents={_d("gzip-index"): _buildkit_index("gzip"), _d("zstd-index"): _buildkit_index("zstd")})
    engine = PushingEngine(registry)
    options = RunOptions(matrix_path=Path("matrix.yaml"), export=Export(ZSTD), gzip_too=True, platform="linux/amd64")
    done = Pushing()
    refs = (f"{REPO}:2.6-runtime", f"{REPO}:2.6-cuda12.4-runtime")
    index = push_dual(refs, _d("zstd-index"), _d("gzip-index"), engine, registry, options, done)  # type: ignore[arg-type]
    assert engine.pushed == [gzip_ref(refs[0]), refs[0]]
    assert registry.put == [(refs[0], index)]
    assert done.pushed == {gzip_ref(refs[0]): _d("gzip-index"), refs[0]: index, refs[1]: index}
    assert done.instances == (_d("gzip"), _d("zstd"))  # signed beside the index
    body, _ = dual_index(registry, refs[0], _d("gzip-index"), _d("zstd-index"), "linux/amd64")
    document = json.loads(body)
    assert "sha256:" + hashlib.sha256(body).hexdigest() == index
    # The marked zstd image last (after the provenance entries, whose platform is unknown/unknown).
    assert [e["digest"] for e in document["manifests"]] == [_d("gzip"), _d("gzip-provenance"), _d("zstd-provenance"),
                                                            _d("zstd")]
    assert document["manifests"][3]["annotations"] == {ZSTD_ANNOTATION: "true"}


def test_a_push_of_other_bytes_than_the_gzip_image_built_fails() -> None:
    from imagebuilder.publish.push import PushedOtherContent

    registry = DualRegistry(documents={_d("gzip-index"): _buildkit_index("gzip"), _d("zstd-index"): _buildkit_index("zstd")})
    options = RunOptions(matrix_path=Path("matrix.yaml"), export=Export(ZSTD), gzip_too=True, platform="linux/amd64")
    with pytest.raises(PushedOtherContent):
        push_dual((f"{REPO}:x",), _d("zstd-index"), _d("another"), PushingEngine(registry), registry,  # type: ignore[arg-type]
                  options, Pushing())
    assert registry.put == []


@dataclass
class VerifyRegistry:
    configs: dict[str, tuple[str, ...]]
    tags: dict[str, str]

    def blobs(self, ref: str) -> dict[str, tuple[int, str]]:
        raise AssertionError("verify reads the image the daemon would take, not every blob")

    def provenance(self, ref: str) -> dict[str, Any] | None:
        return None

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        return ({}, self.configs[ref]) if ref in self.configs else None

    def digest(self, ref: str) -> str | None:
        return self.tags.get(ref)


def test_verify_judges_the_entry_a_daemon_takes_and_names_the_gzip_image() -> None:
    gz, zs = ("application/vnd.oci.image.layer.v1.tar+gzip",), ("application/vnd.oci.image.layer.v1.tar+zstd",)
    registry = VerifyRegistry({f"{REPO}:dual": gz, f"{REPO}:old": zs, f"{REPO}:new": zs}, {f"{REPO}:old-gzip": _d("g")})
    assert registry_compression(registry, f"{REPO}:dual") == "gzip"  # the index's first entry
    assert registry_compression(registry, f"{REPO}:old") == "zstd"
    assert gzip_instead(registry, f"{REPO}:old") == f"{REPO}:old-gzip"
    assert gzip_instead(registry, f"{REPO}:new") is None
    assert gzip_instead(registry, f"{REPO}@{_d('x')}") is None


def test_the_plan_of_gzip_zstd_lists_the_pushes_the_run_makes_in_its_order() -> None:
    """The dry run is the run's plan: TAG-gzip, then the tags, then the dated tag."""
    (step,) = plan(images(), {}, day=date(2026, 12, 4), dual=True)
    assert step.gzip == gzip_ref(step.image.ref)
    registry = DualRegistry(documents={_d("gzip-index"): _buildkit_index("gzip"), _d("zstd-index"): _buildkit_index("zstd")})
    done = Pushing()
    options = RunOptions(matrix_path=Path("matrix.yaml"), export=Export(ZSTD), gzip_too=True, platform="linux/amd64")
    push_dual(step.image.refs, _d("zstd-index"), _d("gzip-index"), PushingEngine(registry), registry,  # type: ignore[arg-type]
              options, done)
    assert step.dated is not None and list(step.writes) == [*done.pushed, step.dated]
    # The report's digest is the index the tags name, not the gzip image pushed first (round five).
    assert Outcome(step, PUSHED, "pushed", pushed=done.pushed).to_json()["digest"] == done.pushed[step.image.ref]
    assert done.pushed[step.image.ref] != done.pushed[step.gzip]
    assert step.to_json()["push"] == list(step.writes)
    listed = format_plan((step,)).splitlines()[-2]
    assert listed.startswith(f"  {step.image.tags[0]}: push {step.image.tags[0]}-gzip, "), listed
    # zstd alone, or an image not built, pushes no gzip image.
    assert plan(images(), {}, dual=False)[0].writes == step.image.refs


@pytest.mark.registry
def test_publish_dry_run_with_gzip_zstd_lists_the_gzip_push(registry: str, tmp_path: Path) -> None:
    report = tmp_path / "plan.json"
    done = imagebuilder("publish", "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--os", "debian12",
                        "--variant", "runtime", "--builder", "buildkit", "--compression", "gzip+zstd", "--dry-run",
                        "--registry", f"{registry}/ns", "--report", str(report), timeout=300)
    assert done.returncode == 0, done.stderr
    (planned,) = json.loads(report.read_text())["planned"]
    first = planned["ref"]
    assert planned["push"][:2] == [gzip_ref(first), first], planned
    assert f"push {first.rsplit(':', 1)[1]}-gzip, " in done.stdout, done.stdout
