"""The squashfs as an OCI artifact in the image's own repository, found from the image's digest.

An OCI image manifest (image-spec 1.1) with `artifactType` ARTIFACT_TYPE, the empty config,
one layer (the squashfs) and `subject` = the image manifest's descriptor: the distribution
spec's referrers API lists it under that digest. A registry without that API (Debian's
docker-registry 2.8, and every registry that does not answer the manifest PUT with
OCI-Subject) gets the spec's tag-schema fallback: the tag `sha256-<hex of the image digest>`
names an OCI index of the referrers, which the pusher reads, extends and writes back. The
reader asks the API first and the fallback tag second, as the spec says clients do.

The documents are pure functions here; push_artifact() and find_artifact() do the I/O through
the registry they are handed.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from ..registry.manifests import OCI_INDEX, OCI_MANIFEST

ARTIFACT_TYPE = "application/vnd.imagebuilder.squashfs.v1"
LAYER_TYPE = "application/vnd.imagebuilder.squashfs.layer.v1"
CHUNKS_TYPE = "application/vnd.imagebuilder.squashfs.chunks.v1+json"
"""The second layer: the sha256 of each 1 MiB chunk of the squashfs (chunks.py), for lazy reads."""
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
EMPTY_DIGEST = "sha256:" + hashlib.sha256(EMPTY).hexdigest()

# The artifact's annotations: what a node (or a person) needs to know before downloading it.
IMAGE_DIGEST = "io.imagebuilder.squashfs.image-digest"
COMPRESSION = "io.imagebuilder.squashfs.compression"
BLOCK_SIZE = "io.imagebuilder.squashfs.block-size"
FLATTENED_BY = "io.imagebuilder.squashfs.flattened-by"
ENROOT_CONFIG = "io.imagebuilder.squashfs.enroot-config"
TITLE = "org.opencontainers.image.title"


class ArtifactRegistry(Protocol):
    """What pushing and finding the artifact needs of a registry (registry.client.HttpRegistry)."""

    def descriptor(self, ref: str) -> dict[str, Any] | None: ...

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None: ...

    def upload_blob(self, ref: str, digest: str, source: IO[bytes], size: int) -> None: ...

    def put_manifest(self, ref: str, body: bytes, media_type: str) -> Mapping[str, str]: ...

    def referrers(self, ref: str, digest: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Pushed:
    ref: str
    """REPOSITORY@DIGEST of the artifact manifest."""
    blob: str
    size: int
    fallback: str | None
    """The fallback tag written (REPOSITORY:sha256-HEX); None: the registry's referrers API took it."""

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "blob": self.blob, "size": self.size, "referrers_tag": self.fallback}


def fallback_tag(digest: str) -> str:
    """The distribution spec's tag for the referrers of `digest` (ALGORITHM-HEX)."""
    algorithm, _, hex_ = digest.partition(":")
    return f"{algorithm}-{hex_}"[:128]


def artifact_manifest(subject: Mapping[str, Any], blob: str, size: int, annotations: Mapping[str, str],
                      chunks: tuple[str, int] | None = None) -> bytes:
    """The artifact's manifest: the squashfs blob as its first layer, referring to `subject`;
    `chunks` (digest, size): its chunk table as the second."""
    table = [{"mediaType": CHUNKS_TYPE, "digest": chunks[0], "size": chunks[1],
              "annotations": {TITLE: "image.sqfs.chunks.json"}}] if chunks else []
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_TYPE, "digest": EMPTY_DIGEST, "size": len(EMPTY),
                   "data": base64.b64encode(EMPTY).decode()},
        "layers": [{"mediaType": LAYER_TYPE, "digest": blob, "size": size,
                    "annotations": {TITLE: "image.sqfs"}}, *table],
        "subject": {key: subject[key] for key in ("mediaType", "digest", "size")},
        "annotations": dict(annotations),
    }
    return json.dumps(document, indent=2, sort_keys=True).encode()


def with_referrer(index: Mapping[str, Any] | None, descriptor: Mapping[str, Any]) -> bytes:
    """The fallback tag's index with `descriptor` added (an entry of the same digest replaced)."""
    entries = [dict(entry) for entry in (index or {}).get("manifests") or []
               if entry.get("digest") != descriptor["digest"]]
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*entries, dict(descriptor)]},
                      indent=2, sort_keys=True).encode()


def pick(entries: Sequence[Mapping[str, Any]], image_digest: str) -> Mapping[str, Any] | None:
    """The squashfs artifact among an image's referrers: the last one listed (the newest push)."""
    found = [entry for entry in entries if entry.get("artifactType") == ARTIFACT_TYPE
             and (entry.get("annotations") or {}).get(IMAGE_DIGEST, image_digest) == image_digest]
    return found[-1] if found else None


def push_artifact(registry: ArtifactRegistry, image: str, squashfs: IO[bytes], blob: str, size: int,
                  annotations: Mapping[str, str], chunk_table: bytes | None = None) -> Pushed:
    """Push the squashfs (`blob`, `size`) as the artifact of `image` (REPOSITORY@DIGEST), with
    its chunk table (chunks.py) as a second blob."""
    repository, _, image_digest = image.partition("@")
    subject = registry.descriptor(image)
    if subject is None:
        raise LookupError(f"the registry has no image {image}")
    registry.upload_blob(image, EMPTY_DIGEST, io.BytesIO(EMPTY), len(EMPTY))
    registry.upload_blob(image, blob, squashfs, size)
    chunks = None
    if chunk_table is not None:
        chunks = ("sha256:" + hashlib.sha256(chunk_table).hexdigest(), len(chunk_table))
        registry.upload_blob(image, chunks[0], io.BytesIO(chunk_table), chunks[1])
    body = artifact_manifest(subject, blob, size, {**annotations, IMAGE_DIGEST: image_digest}, chunks)
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    headers = registry.put_manifest(f"{repository}@{digest}", body, OCI_MANIFEST)
    if any(key.lower() == "oci-subject" for key in headers):
        return Pushed(f"{repository}@{digest}", blob, size, None)
    tag = f"{repository}:{fallback_tag(image_digest)}"
    current = registry.manifest(tag)
    descriptor = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(body), "artifactType": ARTIFACT_TYPE,
                  "annotations": {**annotations, IMAGE_DIGEST: image_digest}}
    registry.put_manifest(tag, with_referrer(current[0] if current else None, descriptor), OCI_INDEX)
    return Pushed(f"{repository}@{digest}", blob, size, tag)


def find_artifact(registry: ArtifactRegistry, image: str) -> tuple[str, Mapping[str, Any]] | None:
    """(REPOSITORY@DIGEST of the artifact manifest, its squashfs layer's descriptor) for
    `image` (REPOSITORY@DIGEST); None where none was published for that digest."""
    repository, _, image_digest = image.partition("@")
    index = registry.referrers(image, image_digest)
    if index is None:
        found = registry.manifest(f"{repository}:{fallback_tag(image_digest)}")
        index = found[0] if found else None
    entry = pick((index or {}).get("manifests") or [], image_digest)
    if entry is None:
        return None
    ref = f"{repository}@{entry['digest']}"
    manifest = registry.manifest(ref)
    layers = [layer for layer in (manifest[0].get("layers") or []) if layer.get("mediaType") == LAYER_TYPE] \
        if manifest else []
    if manifest is None or manifest[0].get("subject", {}).get("digest") != image_digest or len(layers) != 1:
        return None
    return ref, layers[0]



def chunk_layer(registry: ArtifactRegistry, artifact: str) -> Mapping[str, Any] | None:
    """The chunk table's descriptor in artifact manifest `artifact` (REPOSITORY@DIGEST); None
    for an artifact published before the table was (its squashfs is read whole)."""
    manifest = registry.manifest(artifact)
    tables = [layer for layer in (manifest[0].get("layers") or []) if layer.get("mediaType") == CHUNKS_TYPE] \
        if manifest else []
    return tables[0] if len(tables) == 1 else None
