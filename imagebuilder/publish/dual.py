"""--compression gzip+zstd: one platform's image as an OCI index over two manifests, the gzip
one first and the zstd one after it, marked as containers/image marks it (ZSTD_ANNOTATION).

Docker before 23 and enroot before 4.0 pull no zstd layer; they take the first entry of their
platform in an index, so they get the gzip manifest. containers/image (Podman, CRI-O, skopeo)
reads the mark and prefers the zstd entry of its platform; containerd and Docker 23+ take the
first entry too (gzip): the mark costs them nothing but zstd's faster unpacking.

Both images are pushed by `docker push` first (the gzip one under gzip_ref(), the zstd one under
the tag), so the registry holds their blobs and manifests; the index then goes up under the tag
through the registry API, as the indexes over platforms do (indexes.py). Over several platforms
those indexes flatten into one (manifests.platform_entries keeps every entry and its mark).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from ..registry.manifests import ZSTD_ANNOTATION, index_document
from .indexes import IndexRegistry


def marked_zstd(body: bytes, zstd: Collection[str]) -> bytes:
    """The index `body` with each entry whose digest is in `zstd` marked zstd (and so last)."""
    entries: list[dict[str, Any]] = []
    for entry in json.loads(body).get("manifests") or []:
        if entry.get("digest") in zstd:
            entry = {**entry, "annotations": {**(entry.get("annotations") or {}), ZSTD_ANNOTATION: "true"}}
        entries.append(entry)
    return index_document(entries)


def images_of(body: bytes, platform: str) -> tuple[str, ...]:
    """The digests of the image manifests of `platform` (OS/ARCH) in the index `body`: not the
    attestations, whose platform is unknown/unknown."""
    os_name, _, architecture = platform.partition("/")
    return tuple(str(e["digest"]) for e in json.loads(body).get("manifests") or []
                 if (e.get("platform") or {}).get("os") == os_name
                 and (e.get("platform") or {}).get("architecture") == architecture)


def dual_index(registry: IndexRegistry, ref: str, gzip: str, zstd: str, platform: str) -> tuple[bytes, tuple[str, ...]]:
    """The index over the gzip image `gzip` and the zstd image `zstd` (digests in `ref`'s
    repository, each a manifest or BuildKit's index of one with its provenance), and the
    digests of the image manifests it lists (what signing signs beside the index)."""
    zstd_images = images_of(registry.index_for(ref, [(zstd, platform)]), platform)
    body = marked_zstd(registry.index_for(ref, [(gzip, platform), (zstd, platform)]), zstd_images)
    return body, images_of(body, platform)
