"""Pure: image manifests and indexes as the registry serves them: the media types (and the
Accept header that asks for any of them), an index's image for a platform, and the image
index over one image per platform that publish writes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..platforms import DEFAULT_PLATFORM

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ACCEPT = ", ".join((DOCKER_MANIFEST, OCI_MANIFEST, DOCKER_LIST, OCI_INDEX))
INDEXES = (DOCKER_LIST, OCI_INDEX)
REFERENCE_DIGEST = "vnd.docker.reference.digest"  # an attestation manifest's image, in an index
# containers/image's mark on an index entry whose layers are zstd: Podman and CRI-O prefer such an
# entry of their platform; engines that do not read it take the first entry of their platform.
ZSTD_ANNOTATION = "io.github.containers.compression.zstd"


def pick_manifest(index: Mapping[str, Any], platform: str = DEFAULT_PLATFORM) -> str:
    """The digest of an index's image for `platform` (OS/ARCH), else of its first entry."""
    entries = index.get("manifests") or []
    if not entries:
        raise ValueError("the manifest list is empty")
    os_name, _, architecture = platform.partition("/")
    for entry in entries:
        found = entry.get("platform") or {}
        if found.get("os") == os_name and found.get("architecture") == architecture:
            return str(entry["digest"])
    return str(entries[0]["digest"])


def platform_entries(platform: str, media_type: str, size: int, digest: str,
                     document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What one platform's image adds to an index over platforms: its descriptor; or, where it is
    an index already (the containerd image store and BuildKit push an image with its provenance
    as one), that index's entries for the platform and their attestations, so the index over
    platforms is one level deep, as `docker buildx build --platform a,b` writes it."""
    os_name, _, architecture = platform.partition("/")
    if media_type not in INDEXES:
        return [{"mediaType": media_type, "size": size, "digest": digest,
                 "platform": {"os": os_name, "architecture": architecture}}]
    entries = [dict(entry) for entry in document.get("manifests") or []]
    images = [e for e in entries if (e.get("platform") or {}).get("os") == os_name
              and (e.get("platform") or {}).get("architecture") == architecture]
    if not images:
        raise ValueError(f"the index {digest} has no {platform} image")
    ours = {e["digest"] for e in images}
    attestations = [e for e in entries if (e.get("annotations") or {}).get(REFERENCE_DIGEST) in ours]
    return [*images, *attestations]


def index_document(manifests: Sequence[Mapping[str, Any]]) -> bytes:
    """An OCI image index over these descriptors (platform_entries of each platform's image).

    Canonical JSON (sorted keys, no spaces): the same children always give the same digest,
    so a rerun that changes nothing writes the same index. Entries marked zstd (ZSTD_ANNOTATION)
    go last, in their order, as containers/image writes an index: every platform's first entry
    is then one an engine without zstd can pull."""
    ordered = sorted(manifests, key=lambda m: (m.get("annotations") or {}).get(ZSTD_ANNOTATION) == "true")
    document = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": ordered}
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
