"""The layers publish's --report lists (publish/blobs.py), over a registry of canned manifests:
per platform manifest of an index, attestations left out, of a bare manifest by its config, and
a registry that lost a manifest named in the report's reason, not in a failed publish."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from imagebuilder.publish.blobs import Before, check_before, Layer, Layers, published_layers, pushed_layers
from imagebuilder.registry.manifests import DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST

REPOSITORY = "127.0.0.1:5999/ml/pytorch"
GZIP, ZSTD = "application/vnd.docker.image.rootfs.diff.tar.gzip", "application/vnd.oci.image.layer.v1.tar+zstd"


def digest_of(document: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def blob(name: str) -> str:
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


@dataclass
class Manifests:
    """Manifests by REPOSITORY@DIGEST (or tag), image configs by the same refs, blobs by repository."""

    documents: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    blobs: set[tuple[str, str]] = field(default_factory=set)

    def put(self, document: dict[str, Any], media_type: str, tag: str | None = None) -> str:
        digest = digest_of(document)
        for ref in (f"{REPOSITORY}@{digest}", *((f"{REPOSITORY}:{tag}",) if tag else ())):
            self.documents[ref] = (document, media_type)
        return digest

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None:
        return self.documents.get(ref)

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        return (self.configs[ref], ()) if ref in self.configs else None

    def has_blob(self, ref: str, digest: str) -> bool:
        return (ref.rsplit(":", 1)[0], digest) in self.blobs


def image(media_type: str, *layers: tuple[str, int]) -> dict[str, Any]:
    return {"schemaVersion": 2, "mediaType": media_type, "config": {"digest": blob(f"config{layers}")},
            "layers": [{"mediaType": ZSTD, "digest": blob(name), "size": size} for name, size in layers]}


def two_platforms(registry: Manifests) -> tuple[str, str, str]:
    """An index as `publish --platform linux/amd64,linux/arm64` merges it: each platform's image
    with its attestation; (the index's, amd64's, arm64's digest)."""
    amd64 = registry.put(image(OCI_MANIFEST, ("apt-amd64", 30), ("torch", 700)), OCI_MANIFEST)
    arm64 = registry.put(image(OCI_MANIFEST, ("apt-arm64", 31), ("torch-arm", 650)), OCI_MANIFEST)
    entries: list[dict[str, Any]] = []
    platforms = ((amd64, {"architecture": "amd64"}), (arm64, {"architecture": "arm64", "variant": "v8"}))
    for digest, platform in platforms:
        entries.append({"mediaType": OCI_MANIFEST, "digest": digest, "size": 1,
                        "platform": {"os": "linux", **platform}})
        provenance = {"mediaType": "application/vnd.in-toto+json", "digest": blob(f"provenance-{digest}"), "size": 9}
        attestation = registry.put({"mediaType": OCI_MANIFEST, "layers": [provenance]}, OCI_MANIFEST)
        entries.append({"mediaType": OCI_MANIFEST, "digest": attestation, "size": 1,
                        "platform": {"os": "unknown", "architecture": "unknown"},
                        "annotations": {"vnd.docker.reference.type": "attestation-manifest",
                                        "vnd.docker.reference.digest": digest}})
    index = registry.put({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, OCI_INDEX, tag="2.6")
    return index, amd64, arm64


def test_an_index_s_layers_are_listed_per_platform_manifest_without_its_attestations() -> None:
    registry = Manifests()
    index, amd64, arm64 = two_platforms(registry)
    found = published_layers(registry, f"{REPOSITORY}@{index}")
    assert found.reason is None and found.layers is not None
    assert [(layer.platform, layer.manifest, layer.digest, layer.size, layer.in_registry_before)
            for layer in found.layers] == [
        ("linux/amd64", amd64, blob("apt-amd64"), 30, True), ("linux/amd64", amd64, blob("torch"), 700, True),
        ("linux/arm64/v8", arm64, blob("apt-arm64"), 31, True), ("linux/arm64/v8", arm64, blob("torch-arm"), 650, True)]


def test_a_bare_manifest_s_platform_is_its_image_config_s() -> None:
    """docker push of the classic image store: one Docker v2 manifest, no index."""
    registry = Manifests()
    digest = registry.put(image(DOCKER_MANIFEST, ("base", 28_000_000)), DOCKER_MANIFEST)
    registry.configs[f"{REPOSITORY}@{digest}"] = {"os": "linux", "architecture": "amd64"}
    (layer,) = published_layers(registry, f"{REPOSITORY}@{digest}").layers or ()
    assert layer == Layer("linux/amd64", digest, blob("base"), 28_000_000, ZSTD, True)


def test_check_before_heads_every_layer_of_its_sources_in_the_image_s_repository() -> None:
    """Its sources may live in other repositories (the build cache's); the question is always
    whether the image's own repository has the blob. A source that is not there adds nothing."""
    registry = Manifests(blobs={(REPOSITORY, blob("torch"))})
    index, _, _ = two_platforms(registry)
    before = check_before(registry, f"{REPOSITORY}:2.6-runtime", (f"{REPOSITORY}:2.6", None, f"{REPOSITORY}:gone"))
    assert before == Before({blob("apt-amd64"): False, blob("torch"): True, blob("apt-arm64"): False,
                             blob("torch-arm"): False})


def test_an_index_naming_a_manifest_the_registry_lost_lists_no_layers_and_says_which() -> None:
    registry = Manifests()
    index, amd64, _ = two_platforms(registry)
    del registry.documents[f"{REPOSITORY}@{amd64}"]
    found = published_layers(registry, f"{REPOSITORY}@{index}")
    assert found == Layers(None, f"could not read {REPOSITORY}@{index} from the registry: "
                                 f"the registry has no manifest {REPOSITORY}@{amd64}")
    assert found.to_json() == {"layers": None, "layers_reason": found.reason}
    # Before a push it is no failure either: nothing is known, and the report says why.
    assert check_before(registry, f"{REPOSITORY}:x", (f"{REPOSITORY}:2.6",)).problem == (
        f"the registry has no manifest {REPOSITORY}@{amd64}")


@pytest.mark.parametrize("had, mounted, summary", [
    ({}, {}, "0 new (0 B), 0 already in the registry (0 B), 2 not checked (730 B)"),
    ({blob("torch"): True, blob("apt-amd64"): False}, {}, "1 new (30 B), 1 already in the registry (700 B)"),
    ({blob("torch"): False, blob("apt-amd64"): False}, {blob("torch"): "127.0.0.1:5999/ml/imagebuilder-cache"},
     "2 new (730 B; 1 mounted from the build cache), 0 already in the registry (0 B)"),
], ids=["nothing-asked", "one-there", "one-mounted"])
def test_the_summary_line_counts_layers_and_bytes(had: dict[str, bool], mounted: dict[str, str], summary: str) -> None:
    registry = Manifests()
    digest = registry.put(image(OCI_MANIFEST, ("apt-amd64", 30), ("torch", 700)), OCI_MANIFEST)
    registry.configs[f"{REPOSITORY}@{digest}"] = {"os": "linux", "architecture": "amd64"}
    found = pushed_layers(registry, f"{REPOSITORY}@{digest}", Before(had), mounted)
    assert found.summary() == summary
    assert (found.reason is None) == bool(had)
