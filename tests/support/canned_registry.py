"""publish's registry, canned: what a registry says a ref names, and a record of what was put.

CannedRegistry is imagebuilder.registry.api's Registry over `answers` (else what the canned engine
pushed); each subclass adds what a few tests need: blobs, a build cache to mount from, a published
image's config, image indexes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from imagebuilder.registry.manifests import OCI_MANIFEST
from imagebuilder.trust.signing import SIGNATURE_ANNOTATION, SIMPLE_SIGNING

from .canned_engine import LABELS, LAYERS, CannedBackground, CannedEngine

if TYPE_CHECKING:
    from imagebuilder.registry.api import Registry


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

    # publish/estargz.py's EstargzRegistry: the canned eStargz publisher (canned_publish) pushes nothing itself.
    def upload_blob(self, ref: str, digest: str, source: Any, size: int) -> None:
        raise AssertionError("the canned eStargz push uploads no blob")

    def put_manifest(self, ref: str, body: bytes, media_type: str) -> Mapping[str, str]:
        raise AssertionError("the canned eStargz push puts no manifest")


@dataclass
class CannedBlobs(CannedRegistry):
    def blobs(self, ref: str) -> dict[str, tuple[int, str]]:
        return {"sha256:" + "a" * 64: (4000, "application/vnd.oci.image.layer.v1.tar+zstd"),
                "sha256:" + "b" * 64: (30, "application/vnd.oci.image.config.v1+json")}


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


@dataclass
class CannedCacheTimeline(CannedCache):
    def mount(self, ref: str, digest: str, source: str) -> bool:
        assert isinstance(self.engine, CannedBackground)
        self.engine.timeline.append("mount")
        return super().mount(ref, digest, source)


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


if TYPE_CHECKING:  # mypy's proof that each fake is what it stands in for
    _registry: Registry = CannedRegistry()
    _indexing: Registry = IndexingRegistry()
