"""Base images: how one is pinned (a registry digest, or a local image's id), and finding that pin.

`locks/base-images.json` records the pin of every base image (lockfile.LockSet reads it): the
image is built FROM name@digest, or, for a local image without a registry digest, its image id
is checked before the build starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..errors import ImageBuilderError


@dataclass(frozen=True)
class BasePin:
    """How a base image is pinned: a registry digest (FROM name@digest), or for a local
    image without one, its image id (which the build checks before it starts)."""

    image: str
    digest: str | None = None
    image_id: str | None = None

    @property
    def from_ref(self) -> str:
        if self.digest is None:
            return self.image
        return f"{self.image.split('@')[0]}@{self.digest}"

    @property
    def identity(self) -> str:
        return self.digest or self.image_id or ""

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in (("digest", self.digest), ("image_id", self.image_id)) if v}


class ImageInspector(Protocol):
    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        """(image id, repo digests) of a local image; None when there is no such image."""
        ...


class DigestSource(Protocol):
    def digest(self, ref: str) -> str | None: ...


def pin_base(image: str, engine: ImageInspector | None, registry: DigestSource | None) -> BasePin | None:
    """The base image's digest: from the local engine when it has the image (its
    RepoDigest, else its image id), else from the registry; None when neither knows it."""
    name = image.split("@")[0]
    if engine is not None:
        found = engine.image_identity(image)
        if found is not None:
            image_id, repo_digests = found
            repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
            for repo_digest in repo_digests:
                r, _, local = repo_digest.partition("@")
                if r == repo or r.endswith("/" + repo):
                    return BasePin(image, digest=local)
            return BasePin(image, image_id=image_id)
    if registry is not None:
        try:
            remote = registry.digest(name)
        except ImageBuilderError:  # unreachable or refusing: the base stays unpinned, with a note
            remote = None
        if remote:
            return BasePin(image, digest=remote)
    return None
