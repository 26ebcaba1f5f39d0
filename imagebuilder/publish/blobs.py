"""Each image's layers for --report: digest, size (compressed bytes) and media type as the
registry's manifest lists them, per platform manifest, and whether the image's repository had
the blob before this publish put anything there.

A pushed image is asked about before it is pushed: check_before() HEADs, in the image's
repository, the layer blobs of the manifests the new image most likely shares blobs with (its
build cache's, the image under its tag now, its base image's), before publish mounts or pushes
anything; pushed_layers() then reads the manifest the registry confirmed and answers each layer
from those HEADs. A layer none of them listed (docker push compressed it, so its digest was
known only after the push) is reported as not checked, never guessed. An image that was not
pushed again (skipped, re-pointed, or kept because the registry had this very image) had every
blob there: a registry takes a manifest only once it has the blobs it lists.

Reading layers never fails a publish: where the registry cannot answer, `layers` is None and
the reason says why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..engine.progress import human_size
from ..errors import ImageBuilderError
from ..registry.manifests import INDEXES
from ..registry.reference import pinned
from ..trust.signing import ATTESTATION_MANIFEST


class LayerRegistry(Protocol):
    """What listing layers needs of a registry (registry.client.HttpRegistry)."""

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None: ...

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None: ...

    def has_blob(self, ref: str, digest: str) -> bool: ...


class ManifestMissing(ImageBuilderError):
    template = "the registry has no manifest {ref}"


@dataclass(frozen=True)
class Layer:
    platform: str
    """OS/ARCH[/VARIANT] of the manifest that lists it."""
    manifest: str
    """That manifest's digest."""
    digest: str
    size: int
    """Compressed bytes, as the manifest says."""
    media_type: str
    in_registry_before: bool | None
    """Whether the image's repository had the blob before this publish mounted or pushed
    anything there; None: not checked."""
    mounted_from: str | None = None
    """The repository (the build cache's) publish mounted the blob from, so the push did not upload it."""

    def to_json(self) -> dict[str, Any]:
        return {"platform": self.platform, "manifest": self.manifest, "digest": self.digest, "size": self.size,
                "media_type": self.media_type, "in_registry_before": self.in_registry_before,
                "mounted_from": self.mounted_from}


@dataclass(frozen=True)
class Layers:
    """An image's layers as this publish found them, or why they are not listed."""

    layers: tuple[Layer, ...] | None
    reason: str | None = None
    """Why `layers` is None, or why some layer's `in_registry_before` is None."""

    def to_json(self) -> dict[str, Any]:
        return {"layers": None if self.layers is None else [layer.to_json() for layer in self.layers],
                "layers_reason": self.reason}

    def summary(self) -> str:
        """`3 new (205.1 MB; 2 mounted from the build cache), 9 already in the registry (4.1 GB)`."""
        if self.layers is None:
            return f"not listed: {self.reason}"
        new = [layer for layer in self.layers if layer.in_registry_before is False]
        there = [layer for layer in self.layers if layer.in_registry_before]
        unknown = [layer for layer in self.layers if layer.in_registry_before is None]
        mounted = sum(layer.mounted_from is not None for layer in new)
        from_cache = f"; {mounted} mounted from the build cache" if mounted else ""
        parts = [f"{len(new)} new ({_size(new)}{from_cache})", f"{len(there)} already in the registry ({_size(there)})"]
        if unknown:
            parts.append(f"{len(unknown)} not checked ({_size(unknown)})")
        return ", ".join(parts)


def _size(layers: Iterable[Layer]) -> str:
    return human_size(sum(layer.size for layer in layers))


@dataclass(frozen=True)
class Before:
    """What the image's repository held before publish mounted or pushed anything into it."""

    had: Mapping[str, bool] = field(default_factory=dict)
    """Each layer digest asked (a HEAD) -> whether the repository had that blob."""
    problem: str | None = None
    """Why the registry could not be asked; then nothing is known."""


def check_before(registry: LayerRegistry, ref: str, sources: Iterable[str | None]) -> Before:
    """HEAD, in `ref`'s repository, every layer blob of the images `sources` name now (refs in
    the same registry; None, and a source that is not there, add nothing)."""
    try:
        digests: dict[str, None] = {}
        for source in sources:
            for _, _, document in _image_manifests(registry, source) if source else ():
                digests |= dict.fromkeys(str(layer["digest"]) for layer in _layers(document))
        return Before({digest: registry.has_blob(ref, digest) for digest in digests})
    except (ImageBuilderError, ValueError) as e:
        return Before(problem=str(e))


def pushed_layers(registry: LayerRegistry, ref: str, before: Before, mounted: Mapping[str, str]) -> Layers:
    """The layers of the image just pushed, `ref` (REPOSITORY@DIGEST), each answered from
    `before`; `mounted`: blob digest -> the repository publish mounted it from."""
    found = _read(registry, ref, lambda digest: (before.had.get(digest), mounted.get(digest)))
    if found.layers is None or all(layer.in_registry_before is not None for layer in found.layers):
        return found
    if before.problem is not None:
        return Layers(found.layers, f"the registry could not be asked before the push: {before.problem}")
    unchecked = sum(layer.in_registry_before is None for layer in found.layers)
    return Layers(found.layers, f"{unchecked} of {len(found.layers)} layers not checked: no manifest asked before "
                                "the push (the build cache's, the image's under its tag, its base image's) listed them")


def published_layers(registry: LayerRegistry, ref: str) -> Layers:
    """The layers of `ref` (REPOSITORY@DIGEST), an image the registry had before this publish
    wrote anything: every blob was there."""
    return _read(registry, ref, lambda digest: (True, None))


def _read(registry: LayerRegistry, ref: str, answer: Callable[[str], tuple[bool | None, str | None]]) -> Layers:
    try:
        manifests = _image_manifests(registry, ref)
        if not manifests:
            raise ManifestMissing(ref=ref)
        layers = []
        for digest, platform, document in manifests:
            where = _platform(registry, pinned(ref, digest), platform)
            for layer in _layers(document):
                had, source = answer(str(layer["digest"]))
                layers.append(Layer(where, digest, str(layer["digest"]), int(layer.get("size") or 0),
                                    str(layer.get("mediaType") or ""), had, source))
    except (ImageBuilderError, ValueError) as e:
        return Layers(None, f"could not read {ref} from the registry: {e}")
    return Layers(tuple(layers))


Manifests = list[tuple[str, Mapping[str, Any] | None, Mapping[str, Any]]]


def _image_manifests(registry: LayerRegistry, ref: str) -> Manifests:
    """(digest, its index entry's platform, document) of each image manifest `ref` names: itself,
    or the images of its index (attestations left out); [] when `ref` is not there. Of a tag,
    the top manifest's digest is ''."""
    found: Manifests = []
    pending: list[tuple[str, str, Mapping[str, Any] | None]] = [(ref, ref.partition("@")[2], None)]
    while pending:
        target, digest, platform = pending.pop(0)
        got = registry.manifest(target)
        if got is None:
            if target == ref:
                return []
            raise ManifestMissing(ref=target)  # an index listing a manifest the registry lost
        document, media_type = got
        if media_type in INDEXES or document.get("mediaType") in INDEXES:
            pending += [(pinned(ref, str(entry["digest"])), str(entry["digest"]), entry.get("platform"))
                        for entry in document.get("manifests") or []
                        if (entry.get("annotations") or {}).get("vnd.docker.reference.type") != ATTESTATION_MANIFEST]
        else:
            found.append((digest, platform, document))
    return found


def _layers(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    layers = [layer for layer in document.get("layers") or [] if isinstance(layer, Mapping)]
    if not all(layer.get("digest") for layer in layers):
        raise ValueError("a layer of the manifest has no digest")
    return layers


def _platform(registry: LayerRegistry, ref: str, platform: Mapping[str, Any] | None) -> str:
    """OS/ARCH[/VARIANT] as the index entry says, else as the image config of `ref` does."""
    if platform is None:
        found = registry.image_config(ref)
        platform = found[0] if found is not None else {}
    parts = (platform.get("os") or "?", platform.get("architecture") or "?", platform.get("variant"))
    return "/".join(str(part) for part in parts if part)
