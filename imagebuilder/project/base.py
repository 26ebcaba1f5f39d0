"""The base a project image is built FROM: an image imagebuilder built or published, found in the
local engine (a registry reference is pulled first), pinned to its digest, its labels read.

An image without imagebuilder's labels is refused in one line: its torch was never proven here,
and nothing would say which torch a project may not replace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..trust import labels as L
from ..engine.api import ImageInspector, ImageStore
from ..errors import BadRequest
from ..build.image_contents import VENV
from ..registry.reference import names_domain, parse_reference
from .render import BaseFacts


class NotOurs(BadRequest):
    template = ("{ref} was not built by imagebuilder (no {label} label); build the base with `imagebuilder build` "
                "or name one it published")


class BaseMissing(BadRequest):
    template = "base image {ref} is not in the local engine and could not be pulled: {detail}"


class Pulls(Protocol):
    def pull(self, ref: str) -> None: ...


class Engine(ImageStore, ImageInspector, Pulls, Protocol):
    pass


def find_base(engine: Engine, ref: str, say: Any = None) -> tuple[BaseFacts, Mapping[str, str]]:
    """The base's facts and labels; pulls a registry reference the engine does not have."""
    reference = parse_reference(ref, "--base")
    if not engine.image_exists(ref):
        if say is not None:
            say(f"base: pulling {ref}")
        try:
            engine.pull(ref)
        except Exception as e:  # noqa: BLE001 (the engine's errors say the cause; one line)
            raise BaseMissing(ref=ref, detail=str(e)) from e
    labels = engine.image_labels(ref)
    for label in (L.INPUTS_HASH, L.TORCH, L.PYTHON):
        if not labels.get(label):
            raise NotOurs(ref=ref, label=label)
    attrs = engine.inspect_image(ref)
    image_id = str(attrs["Id"])
    repo_digests = tuple(attrs.get("RepoDigests") or ())
    repository = reference.name
    digest = next((d.partition("@")[2] for d in repo_digests if d.partition("@")[0] == repository), None)
    if digest is None and reference.digest:
        digest = reference.digest
    # A registry image FROM its repository@digest (what a push stores). BuildKit resolves a
    # digest reference at the registry only, so an image that exists only here is built FROM a
    # name of this run's own that the command points at exactly this image id (BaseFacts.local).
    published = digest is not None and "/" in repository and names_domain(repository.split("/", 1)[0])
    from_ref = f"{repository}@{digest}" if published else ""
    config = attrs.get("Config") or {}
    user = str(config.get("User") or "")
    return BaseFacts(name=ref, from_ref=from_ref, digest=digest or image_id, image_id=image_id, user=user,
                     python=labels[L.PYTHON], venv=VENV, venv_owner=user or "0", local=not published), labels
