"""A published project image re-made on a republished base without rebuilding its layers
(`imagebuilder project --rebase OLD`): in the registry alone, as a new manifest of the new
base's layers and the project's own, and a config of the new base's with the project's
settings. Nothing is uploaded but that config: every layer is mounted.

Sound only where the project's layers do not depend on what changed: no OS packages of the
project's (its dpkg status would hide the new base's), the same venv in both bases (their lock
label and Python), the project's own lock unchanged, every layer in one registry. `plan_rebase`
says why not otherwise, and the command rebuilds instead.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from ..errors import ImageBuilderError
from ..registry.manifests import INDEXES, pick_manifest
from ..registry.reference import parse_reference
from ..trust import labels as L
from .render import PROJECT_APT, PROJECT_BASE_DIGEST, PROJECT_BASE_NAME, PROJECT_LOCK


class MountRefused(ImageBuilderError):
    template = "rebase: the registry would not mount {digest} from {source} into {tag}; rebuild without --rebase"


class Registry(Protocol):
    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None: ...

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None: ...

    def mount(self, ref: str, digest: str, source: str) -> bool: ...

    def has_blob(self, ref: str, digest: str) -> bool: ...

    def upload_blob(self, ref: str, digest: str, source: Any, size: int) -> None: ...

    def put_manifest(self, ref: str, body: bytes, media_type: str) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Image:
    ref: str
    manifest: dict[str, Any]
    media_type: str
    config: dict[str, Any]


@dataclass(frozen=True)
class RebasePlan:
    old: Image
    new_base: Image
    own_layers: tuple[dict[str, Any], ...]
    own_diff_ids: tuple[str, ...]
    own_history: tuple[dict[str, Any], ...]


def read_image(registry: Registry, ref: str) -> Image | None:
    found = registry.manifest(ref)
    if found is None:
        return None
    document, media_type = found
    if media_type in INDEXES or document.get("mediaType") in INDEXES:
        child = f"{parse_reference(ref).name}@{pick_manifest(document)}"
        found = registry.manifest(child)
        if found is None:
            return None
        document, media_type = found
    config = registry.image_config(ref)
    if config is None:
        return None
    return Image(ref, document, media_type, config[0])


def _labels(image: Image) -> dict[str, str]:
    return dict((image.config.get("config") or {}).get("Labels") or {})


def plan_rebase(registry: Registry, old_ref: str, new_base_ref: str, lock_digest: str) -> RebasePlan | str:
    """The rebase, or why it would not be sound (one line: the command then rebuilds)."""
    old = read_image(registry, old_ref)
    if old is None:
        return f"{old_ref} is not in its registry"
    labels = _labels(old)
    if PROJECT_BASE_DIGEST not in labels:
        return f"{old_ref} is not a project image (no {PROJECT_BASE_DIGEST} label)"
    if labels.get(PROJECT_APT):
        return f"{old_ref} installed OS packages ({labels[PROJECT_APT]}): their dpkg status would hide the new base's"
    if labels.get(PROJECT_LOCK) != lock_digest:
        return "the project's lock changed since that image: its dependency layer must be built anew"
    new_base = read_image(registry, new_base_ref)
    if new_base is None:
        return f"{new_base_ref} is not in its registry"
    base_labels = _labels(new_base)
    for label in (L.LOCK, L.PYTHON):
        if not base_labels.get(label) or base_labels.get(label) != labels.get(label):
            return (f"the new base's {label} ({base_labels.get(label) or 'none'}) is not the old one's "
                    f"({labels.get(label) or 'none'}): another venv under the project's packages")
    old_base_name = parse_reference(labels.get(PROJECT_BASE_NAME, "")).name if labels.get(PROJECT_BASE_NAME) else ""
    old_base = read_image(registry, f"{old_base_name}@{labels[PROJECT_BASE_DIGEST]}") if old_base_name else None
    if old_base is None:
        return f"the old base ({labels.get(PROJECT_BASE_NAME)}@{labels[PROJECT_BASE_DIGEST]}) is not in its registry"
    if parse_reference(old_ref).host != parse_reference(new_base_ref).host:
        return "the project image and the new base are in different registries: their layers cannot be mounted"
    count = len(old_base.manifest.get("layers") or [])
    layers = list(old.manifest.get("layers") or [])
    if [x["digest"] for x in layers[:count]] != [x["digest"] for x in old_base.manifest.get("layers") or []]:
        return f"{old_ref}'s layers do not start with its base's"
    diff_ids = list((old.config.get("rootfs") or {}).get("diff_ids") or [])
    history = list(old.config.get("history") or [])
    base_history = len(old_base.config.get("history") or [])
    return RebasePlan(old, new_base, tuple(layers[count:]), tuple(diff_ids[count:]), tuple(history[base_history:]))


def rebased(plan: RebasePlan, new_base_ref: str, new_base_digest: str) -> tuple[bytes, bytes]:
    """(config, manifest) of the project's layers on the new base: pure."""
    config = copy.deepcopy(plan.new_base.config)
    settings = config.setdefault("config", {})
    old_settings = plan.old.config.get("config") or {}
    for key in ("Cmd", "User", "WorkingDir"):
        if key in old_settings:
            settings[key] = old_settings[key]
    project_labels = {k: v for k, v in (old_settings.get("Labels") or {}).items() if k.startswith(f"{L.PREFIX}.project")}
    settings["Labels"] = {**(settings.get("Labels") or {}), **project_labels, PROJECT_BASE_NAME: new_base_ref,
                          PROJECT_BASE_DIGEST: new_base_digest}
    config["rootfs"] = {"type": "layers", "diff_ids": [*(config.get("rootfs") or {}).get("diff_ids", []),
                                                       *plan.own_diff_ids]}
    config["history"] = [*(config.get("history") or []), *plan.own_history]
    config["created"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = copy.deepcopy(plan.new_base.manifest)
    manifest.pop("annotations", None)
    manifest["config"] = {**manifest["config"], "digest": "sha256:" + hashlib.sha256(config_bytes).hexdigest(),
                          "size": len(config_bytes)}
    manifest["layers"] = [*manifest.get("layers", []), *plan.own_layers]
    return config_bytes, json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def push_rebased(registry: Registry, plan: RebasePlan, tag: str, config: bytes, manifest: bytes) -> tuple[str, int]:
    """Mount every layer into `tag`'s repository, upload the config, PUT the manifest by its
    digest (untagged: the caller tags it once it is proven). (digest, blobs uploaded)."""
    uploaded = 0
    for layer, source in [*((x, plan.new_base.ref) for x in plan.new_base.manifest.get("layers") or []),
                          *((x, plan.old.ref) for x in plan.own_layers)]:
        digest = str(layer["digest"])
        if not registry.has_blob(tag, digest) and not registry.mount(tag, digest, source):
            raise MountRefused(digest=digest, source=source, tag=tag)
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    if not registry.has_blob(tag, config_digest):
        registry.upload_blob(tag, config_digest, io.BytesIO(config), len(config))
        uploaded += 1
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    registry.put_manifest(f"{parse_reference(tag).name}@{digest}", manifest, plan.new_base.media_type)
    return digest, uploaded
