"""Several platforms: each platform's images are published under their own tags (TAG-amd64,
TAG-arm64), and then every TAG becomes an OCI image index over them, through the registry API.

plan_indexes() only reads; write_indexes() PUTs (and signs) what was planned.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..build.platforms import platform_tags
from ..errors import ImageBuilderError
from ..registry.reference import parse_reference, pinned
from ..trust.signing import Signed, Signer, has_signature
from .plan import FAILED, SKIP, SKIPPED

# Index steps (WRITE, UNCHANGED, SKIP) and their outcomes (WRITTEN, UNCHANGED, SKIPPED, FAILED).
WRITE, UNCHANGED, WRITTEN = "write", "unchanged", "written"


class MergeIncomplete(ImageBuilderError):
    def describe(self) -> str:
        unmerged, total = self.fields["unmerged"], self.fields["total"]
        names = ", ".join(parse_reference(ref).reference for ref, _ in unmerged)
        others = f"; the other {total - len(unmerged)} are indexes" if len(unmerged) < total else ""
        return (f"{len(unmerged)} of {total} tags could not be made indexes (why: the `index` lines above): "
                f"{names}{others}; rerun --merge-only once their platform images are published")


@dataclass(frozen=True)
class IndexChild:
    ref: str
    """The platform's tag (TAG-amd64)."""
    platform: str
    digest: str | None
    """What that tag names in the registry now; None: nothing (yet)."""
    pending: bool = False
    """This run pushes or re-points it before the index is written."""


@dataclass(frozen=True)
class IndexStep:
    """One tag to make an image index over its platforms' images (TAG-amd64, TAG-arm64, ...)."""

    ref: str
    children: tuple[IndexChild, ...]
    action: str
    """WRITE, UNCHANGED (the registry has this very index), SKIP (a platform's image is missing)
    or FAILED (a platform's tag names an image of another platform)."""
    reason: str = ""
    digest: str | None = None
    """The index's digest; None when skipped, or while a child is still to be pushed."""
    body: bytes = b""
    """WRITE, nothing pending: the index document to PUT."""

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "status": self.action, "reason": self.reason, "digest": self.digest,
                "manifests": [{"ref": c.ref, "platform": c.platform, "digest": c.digest} for c in self.children]}


@dataclass(frozen=True)
class IndexOutcome:
    step: IndexStep
    status: str
    """WRITTEN, UNCHANGED, SKIPPED or FAILED."""
    reason: str = ""
    digest: str | None = None
    signed: Signed | None = None

    def to_json(self) -> dict[str, Any]:
        return {**self.step.to_json(), "status": self.status, "reason": self.reason, "digest": self.digest,
                "signed": self.signed.to_json() if self.signed else None}


class IndexRegistry(Protocol):
    """What merging needs of a registry."""

    def digest(self, ref: str) -> str | None: ...

    def index_for(self, ref: str, children: Sequence[tuple[str, str]]) -> bytes: ...

    def put_index(self, ref: str, body: bytes) -> str: ...

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None: ...

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None: ...


def plan_indexes(registry: IndexRegistry, wanted: Mapping[str, Sequence[str]],
                 pending: Collection[str] = frozenset()) -> tuple[IndexStep, ...]:
    """One IndexStep per tag in `wanted` (tag -> the platforms its index joins), asking the
    registry (reads only) what each platform's tag names; `pending`: the platform tags this
    run pushes before merging (a dry run's plan). A tag missing a platform's image is skipped,
    not an error here: every other tag is still merged. A platform's tag whose image config
    says another platform (an amd64 image pushed as TAG-arm64) fails its tag's index: listed
    as that platform's image it would run on no machine of it."""
    steps = []
    for ref, platforms in wanted.items():
        children = []
        for platform in platforms:
            child = platform_tags((ref,), platform)[0]
            waiting = child in pending
            children.append(IndexChild(child, platform, None if waiting else registry.digest(child), waiting))
        found = {c.ref: _platform_of(registry, c.ref, c.digest, c.platform) for c in children if c.digest}
        absent = [c for c in children if not c.pending and found.get(c.ref) is None]
        wrong = [c for c in children if found.get(c.ref) not in (None, c.platform)]
        if wrong:
            reason = "; ".join(f"{parse_reference(c.ref).reference} is a {found[c.ref]} image, not {c.platform}"
                               for c in wrong)
            steps.append(IndexStep(ref, tuple(children), FAILED, f"{reason} (its image config says so); "
                                   "push each platform's own image under its tag"))
        elif absent:
            verb = "is" if len(absent) == 1 else "are"
            reason = (f"{', '.join(parse_reference(c.ref).reference for c in absent)} {verb} not in the registry; publish "
                      f"--platform {','.join(c.platform for c in absent)} first")
            steps.append(IndexStep(ref, tuple(children), SKIP, reason))
        elif any(c.pending for c in children):
            tags = ", ".join(parse_reference(c.ref).reference for c in children if c.pending)
            steps.append(IndexStep(ref, tuple(children), WRITE, f"after this run writes {tags}"))
        else:
            body = registry.index_for(ref, [(c.digest or "", c.platform) for c in children])
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
            if registry.digest(ref) == digest:
                steps.append(IndexStep(ref, tuple(children), UNCHANGED, "the registry has this index", digest))
            else:
                steps.append(IndexStep(ref, tuple(children), WRITE, "", digest, body))
    return tuple(steps)


def _platform_of(registry: IndexRegistry, ref: str, digest: str, platform: str) -> str | None:
    """OS/ARCH as the image config of `digest` (of `ref`'s repository) says; of an index, its
    image for `platform` (whose entry the index over platforms takes); None: it is gone."""
    found = registry.image_config(pinned(ref, digest), platform)
    if found is None:
        return None
    config = found[0]
    return f"{config.get('os') or '?'}/{config.get('architecture') or '?'}"


def _gone(registry: IndexRegistry, children: Sequence[IndexChild]) -> str:
    """Which of an index's children the registry does not have now (a HEAD of each by digest,
    just before the PUT), said as a reason; "" when it has them all."""
    missing = [c for c in children if c.digest is None or registry.digest(pinned(c.ref, c.digest)) != c.digest]
    if not missing:
        return ""
    names = ", ".join(f"{parse_reference(c.ref).reference} ({c.digest})" for c in missing)
    return f"{names} {'is' if len(missing) == 1 else 'are'} not in the registry"


def write_indexes(registry: IndexRegistry, steps: Sequence[IndexStep],
                  signer: Signer | None = None) -> tuple[IndexOutcome, ...]:
    """Write every planned index (planned with nothing pending); a tag that cannot be written
    is reported and the rest are still written. A rerun with the same children writes nothing.
    `signer` signs each index written, and an unchanged one that has no signature yet (its
    signing failed before); the platform images carry their own SBOM attestations."""
    outcomes = []
    for step in steps:
        if step.action in (SKIP, FAILED):
            outcomes.append(IndexOutcome(step, SKIPPED if step.action == SKIP else FAILED, step.reason))
            continue
        status, digest = UNCHANGED, step.digest or ""
        if step.action == WRITE:
            assert step.body, f"{step.ref}: plan the indexes again once the platform images are pushed"
            try:
                gone = _gone(registry, step.children)
                if gone:  # an index over a manifest the registry lacks would name an image nobody can pull
                    outcomes.append(IndexOutcome(step, SKIPPED, f"{gone} since the plan; rerun --merge-only "
                                                                 "once it is published again"))
                    continue
                status, digest = WRITTEN, registry.put_index(step.ref, step.body)
            except ImageBuilderError as e:
                outcomes.append(IndexOutcome(step, FAILED, f"the index PUT failed: {e}"))
                continue
        signed = None
        target = pinned(step.ref, digest)
        if signer is not None and (status == WRITTEN or not has_signature(registry, target)):
            gone = _gone(registry, step.children) if status == UNCHANGED else ""  # (a written one was just checked)
            if gone:
                outcomes.append(IndexOutcome(step, FAILED, f"{status} {digest}, but not signed: {gone}", digest))
                continue
            try:
                signed = signer.sign(target, None)
            except ImageBuilderError as e:
                outcomes.append(IndexOutcome(step, FAILED, f"{status} {digest}, but not signed: {e}", digest))
                continue
        outcomes.append(IndexOutcome(step, status, "" if status == WRITTEN else step.reason, digest, signed))
    return tuple(outcomes)


