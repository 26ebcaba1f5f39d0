"""Pure: an image as a node pulls it (its linux/amd64 manifest and config), and the one-layer
variant of an image with wheel-group layers (bench_coldstart.py).

The one-layer variant is the image with its wheel-group layers replaced, in their place, by one
layer holding the whole venv; every other layer, and the config but for its layers and history,
stay the image's own. So the two differ in the venv's layering alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from imagebuilder.build.image_contents import USER_ID, VENV
from imagebuilder.build.install_steps import LAYERS_MOUNT
from imagebuilder.build.layers import GROUPS

_GROUP_LOCK = re.compile(rf"{re.escape(LAYERS_MOUNT)}/([\w.-]+)\.lock")
_BUILD_ARGS = re.compile(r"^RUN \|\d+( \S+=\S*)* ")  # BuildKit's record of a RUN's build args
_SPLICED = "# the wheel groups' layers as one (bench_coldstart)"  # the venv layer's history entry ends so


@dataclass(frozen=True)
class Image:
    ref: str
    manifest: Mapping[str, Any]
    """The linux/amd64 image manifest."""
    config: Mapping[str, Any]

    @property
    def blobs(self) -> dict[str, int]:
        """What a node pulls: the config and the layers, digest -> size."""
        return {str(blob["digest"]): int(blob["size"]) for blob in [self.manifest["config"], *self.manifest["layers"]]}

    @property
    def bytes(self) -> int:
        return sum(self.blobs.values())

    def describe(self) -> str:
        return f"{self.ref}: {len(self.manifest['layers'])} layers, {self.bytes:,} registry bytes"


def added_bytes(image: Image, beside: Image) -> int:
    """The bytes of `image`'s blobs that `beside` does not have: what it adds to a registry or
    a node that holds `beside`."""
    return sum(size for digest, size in image.blobs.items() if digest not in beside.blobs)


def _made_layers(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The history entries that made a layer, in the layers' order."""
    return [entry for entry in config.get("history") or [] if not entry.get("empty_layer")]


def _group(entry: Mapping[str, Any]) -> str | None:
    """The wheel group whose lock the entry's RUN installs, if it installs exactly one."""
    found = set(_GROUP_LOCK.findall(str(entry.get("created_by") or ""))) & {name for name, _ in GROUPS}
    return found.pop() if len(found) == 1 else None


def wheel_group_layers(config: Mapping[str, Any]) -> list[int]:
    """The indices of the layers the wheel-group RUNs wrote (LAYERS_MOUNT/NAME.lock in their
    history entries)."""
    return [index for index, entry in enumerate(_made_layers(config)) if _group(entry)]


def layer_labels(config: Mapping[str, Any]) -> list[str]:
    """A short name for each layer: its wheel group, the venv of a one-layer variant, else the
    start of what made it."""
    labels = []
    for entry in _made_layers(config):
        if str(entry.get("created_by") or "").endswith(_SPLICED):
            labels.append("venv, one layer")
            continue
        text = _BUILD_ARGS.sub("RUN ", str(entry.get("created_by") or entry.get("comment") or "?"))
        text = text.replace("/bin/bash -o pipefail -c ", "").replace("/bin/sh -c ", "").removesuffix(" # buildkit")
        labels.append(_group(entry) or (text if len(text) <= 40 else text[:37] + "..."))
    return labels


def _json(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def splice_venv_layer(image: Image, venv: Image) -> tuple[bytes, bytes]:
    """The manifest and config (as bytes; the manifest names the config by digest) of `image`
    with its wheel-group layers replaced by the one layer of `venv`, in their place."""
    layers, diff_ids = list(image.manifest["layers"]), list(image.config["rootfs"]["diff_ids"])
    made = _made_layers(image.config)
    if not len(layers) == len(diff_ids) == len(made):
        raise ValueError(f"{image.ref}: {len(layers)} layers, {len(diff_ids)} diff ids and {len(made)} history "
                         "entries that made a layer: they must be as many")
    groups = wheel_group_layers(image.config)
    if not groups or groups != list(range(groups[0], groups[-1] + 1)):
        raise ValueError(f"{image.ref}: the wheel-group layers are not one run of layers: {groups}")
    first, end = groups[0], groups[-1] + 1
    if len(venv.manifest["layers"]) != 1 or len(venv.config["rootfs"]["diff_ids"]) != 1:
        raise ValueError(f"{venv.ref} has {len(venv.manifest['layers'])} layers; it must have one")
    layer = dict(venv.manifest["layers"][0])
    if layer["mediaType"] != layers[first]["mediaType"]:
        raise ValueError(f"{venv.ref}'s layer is {layer['mediaType']}, {image.ref}'s {layers[first]['mediaType']}")
    history, index = [], 0
    for entry in image.config.get("history") or []:
        if entry.get("empty_layer"):
            history.append(dict(entry))
            continue
        if index == first:
            history.append({**({"created": entry["created"]} if "created" in entry else {}),
                            "created_by": f"COPY --chown={USER_ID}:{USER_ID} {VENV} {VENV} {_SPLICED}"})
        elif not first < index < end:
            history.append(dict(entry))
        index += 1
    rootfs = {**image.config["rootfs"],
              "diff_ids": [*diff_ids[:first], venv.config["rootfs"]["diff_ids"][0], *diff_ids[end:]]}
    config = _json({**image.config, "history": history, "rootfs": rootfs})
    descriptor = {**image.manifest["config"], "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                  "size": len(config)}
    return _json({**image.manifest, "config": descriptor, "layers": [*layers[:first], layer, *layers[end:]]}), config
