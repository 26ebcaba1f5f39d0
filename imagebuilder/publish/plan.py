"""Pure: publish's vocabulary and its plan.

plan(): rendered images + what the registry holds under their tags (lookup.py) -> one Step
per image, in build order. An image is skipped when the registry's image under its primary tag
was built from the same rendered inputs (its inputs-hash label, labels.INPUTS_HASH) and every
one of its tags names that image. When the image is there but some alias is missing or names
another image, the alias is pointed at it in the registry (a manifest PUT, no build, no
download): the inputs prove it is the image that alias should name, and it was verified when
it was first pushed.

Beside the moving tags, each image gets an immutable dated tag, `{fully qualified}-{YYYYMMDD}`
of the publishing day: a dated tag is added (to a new image, or pointed at an unchanged one)
when that day has none, and never overwritten.

RunOptions and Outcome are what a run (run.py) is told and what it says of each image.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..build.per_platform import build_order
from ..build.render import RenderedImage
from ..build.run import Built
from ..build.tags import dated_tag, image_ref
from ..engine.export import Export, gzip_ref
from ..registry.reference import RegistryTarget, parse_reference
from ..trust.signing import Signed, Signer
from ..verify import DEFAULT_TIMEOUT, VerifyReport
from .blobs import Layers

if TYPE_CHECKING:
    from .estargz import EstargzPublisher

BUILD, RETAG, SKIP = "build", "retag", "skip"
CACHE = "cache"
"""The event, every 15 s, of a push (or the end of a --no-push step) waiting for the image's registry cache export."""
SCAN = "scan"
"""The event before `--scan` reads an image, between its verify and its push."""

# Outcome statuses.
PUSHED, RETAGGED, SKIPPED, VERIFIED, FAILED, NOT_RUN, INTERRUPTED = (
    "pushed", "retagged", "skipped", "verified", "failed", "not run", "interrupted")


# --------------------------------------------------------------------------- plan (pure)


@dataclass(frozen=True)
class Remote:
    """What the registry holds for one image."""

    digests: Mapping[str, str | None]
    """Each of the image's refs -> the manifest digest that tag names; None: no such tag."""
    inputs_hash: str | None
    """The inputs-hash label of the image under the primary tag; None: absent or unlabelled."""
    signed: bool | None = None
    """The image under the primary tag has a cosign signature; None: not asked (not signing)."""
    security_fixes: str | None = None
    """Its security-fixes label ("" without one); None: not read."""


@dataclass(frozen=True)
class Step:
    image: RenderedImage
    action: str
    """BUILD, RETAG or SKIP."""
    reason: str
    digest: str | None = None
    """The published image (RETAG, SKIP)."""
    retag: tuple[str, ...] = ()
    """RETAG: the refs to point at `digest`."""
    dated: str | None = None
    """BUILD: the dated ref to push besides the image's tags; None when that day already has one."""
    gzip: str | None = None
    """BUILD with --compression gzip+zstd: the gzip image's ref (gzip_ref()), pushed before the tags."""

    @property
    def writes(self) -> tuple[str, ...]:
        """Every ref the run pushes (BUILD) or re-points (RETAG) for this step, in the run's order:
        gzip+zstd's gzip image first, the dated one last."""
        if self.action == BUILD:
            return (*((self.gzip,) if self.gzip else ()), *self.image.refs, *((self.dated,) if self.dated else ()))
        return self.retag

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image.spec.key, "ref": self.image.ref, "action": self.action, "reason": self.reason,
                "push": list(self.writes), "digest": self.digest}


def dated_ref(image: RenderedImage, day: date) -> str:
    # The qualified tag as the image carries it: a platform image's has its -arm64 suffix.
    qualified = next((t for t in image.tags if t.startswith(image.spec.key)), image.spec.key)
    return image_ref(image.repository, dated_tag(qualified, day))


def plan(images: Iterable[RenderedImage], remotes: Mapping[str, Remote], *,
         force: bool = False, day: date | None = None, dual: bool = False) -> tuple[Step, ...]:
    """One Step per image, runtime images before the jupyter images built FROM them.
    `remotes` is keyed by each image's primary ref; a missing entry means nothing is there.
    `day` (None: no dated tags) names the dated tag each image gets; `dual` (--compression
    gzip+zstd): each image built pushes its gzip image under gzip_ref() too (push.push_dual)."""
    steps: list[Step] = []
    rebuilt: set[str] = set()
    for image in build_order(images):
        step = _decide(image, remotes.get(image.ref), force, rebuilt)
        if day is not None:
            step = _with_dated(step, dated_ref(image, day), remotes.get(image.ref))
        if step.action == BUILD:
            rebuilt.add(image.ref)
            if dual:
                step = replace(step, gzip=gzip_ref(image.ref))
        steps.append(step)
    return tuple(steps)


def _decide(image: RenderedImage, remote: Remote | None, force: bool, rebuilt: set[str]) -> Step:
    if force:
        return Step(image, BUILD, "--force")
    if image.depends_on in rebuilt:
        # Its Dockerfile names the runtime by tag: same inputs, yet a different image under it.
        return Step(image, BUILD, f"its base image {image.depends_on} is rebuilt")
    digest = remote.digests.get(image.ref) if remote else None
    if remote is None or digest is None:
        return Step(image, BUILD, "not in the registry")
    if remote.inputs_hash is None:
        return Step(image, BUILD, "the registry's image has no inputs-hash label")
    if remote.inputs_hash != image.inputs_hash:
        return Step(image, BUILD, f"inputs changed (registry {short(remote.inputs_hash)}, "
                                  f"rendered {short(image.inputs_hash)}){_new_fixes(image, remote)}")
    if remote.signed is False:
        return Step(image, BUILD, "unchanged, but the registry's image is not signed")
    stale = tuple(ref for ref in image.refs if remote.digests.get(ref) != digest)
    if stale:
        names = ", ".join(parse_reference(ref).reference for ref in stale)
        return Step(image, RETAG, f"unchanged; tags missing or naming another image: {names}", digest, stale)
    return Step(image, SKIP, f"unchanged, published as {short(digest)}", digest)


def _new_fixes(image: RenderedImage, remote: Remote) -> str:
    """"; security fixes: NAME VERSION, ..." for the fixes the registry's image lacks (its label's)."""
    if remote.security_fixes is None:
        return ""
    had = set(remote.security_fixes.split())
    new = [fix.replace("=", " ", 1) for fix in image.security_fixes.split() if fix not in had]
    return f"; security fixes: {', '.join(new)}" if new else ""


def _with_dated(step: Step, dated: str, remote: Remote | None) -> Step:
    """Add the day's dated tag where that day has none; an existing one is never moved."""
    if remote is not None and remote.digests.get(dated) is not None:
        return step
    if step.action == BUILD:
        return replace(step, dated=dated)
    tag = parse_reference(dated).reference
    if step.action == SKIP:
        return Step(step.image, RETAG, f"unchanged; adding the dated tag {tag}", step.digest, (dated,))
    return replace(step, retag=(*step.retag, dated), reason=f"{step.reason}; dated tag {tag}")


def short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


# --------------------------------------------------------------------------- a run's vocabulary


@dataclass(frozen=True)
class RunOptions:
    matrix_path: Path
    push: bool = True
    keep_going: bool = False
    allow_no_gpu: bool = False
    verify_timeout: float = DEFAULT_TIMEOUT
    nocache: bool = False
    pull: bool = False
    push_retries: int = 3
    push_backoff: float = 2.0
    platform: str | None = None
    """The platform to build for; None: the daemon's."""
    verify: bool = True
    """False for a platform this host only emulates: its smoke tests are left to a native host."""
    export: Export | None = None
    """BuildKit: the image's compression, provenance and registry caches (export.Export).
    With a compression the image store keeps the exported blobs, the pushed digest must be
    the image id verify ran, and the image's registry cache is exported beside it."""
    gzip_too: bool = False
    """--compression gzip+zstd (export_decision.ExportDecision.gzip_too): each image built goes up
    as gzip too, under gzip_ref(), in one index with the zstd image (push.push_dual)."""
    cache_registry: RegistryTarget | None = None
    """The registry and namespace whose imagebuilder-cache repository holds the build caches."""
    signer: Signer | None = None
    """Signs every pushed digest (signing.KeySigner); None: nothing is signed."""
    squashfs: Callable[[Outcome, str], Outcome] | None = None
    """`--squashfs`: a published image's outcome (and its platform) -> the same with its squashfs
    artifact, or failed for it (squashfs.with_squashfs); None: no squashfs."""
    scan: Callable[[str], tuple[bool, str]] | None = None
    """`--scan`: an image's ref -> (push it?, the line its outcome carries), after verify and before
    push (scan.ScanGate); None: no scan."""
    estargz: EstargzPublisher | None = None
    """`--compression estargz`: pushes the verified (zstd) image as eStargz ordered by its start
    (estargz.py); None: `docker push` sends the blobs the store keeps."""


@dataclass(frozen=True)
class Outcome:
    step: Step
    status: str
    reason: str
    built: Built | None = None
    verify: VerifyReport | None = None
    pushed: Mapping[str, str] = field(default_factory=dict)
    """Refs the registry confirmed, with their digests."""
    signed: tuple[Signed, ...] = ()
    """The pushed digests signed, with their SBOM attestations."""
    seconds: float = 0.0
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds of each phase that ran: build_s, verify_s, push_s, sign_s; cache_export_s: the
    registry cache's export, which ran beside verify (push_s includes any wait for it)."""
    pushed_bytes: int | None = None
    """Blob bytes this push uploaded (0: the registry had every blob); None: not pushed/unknown."""
    squashfs: Mapping[str, Any] | None = None
    """`--squashfs`: its squashfs artifact (squashfs.SquashfsOutcome.to_json()); None: none asked."""
    estargz: Mapping[str, Any] | None = None
    """`--compression estargz`: its start profile and eStargz layers (estargz.Converted.to_json())."""
    layers: Layers | None = None
    """The image's layers as published (pushed, kept, re-pointed or skipped) and which of them the
    registry had before; None: it was not published (failed, not run, --no-push)."""

    @property
    def failed(self) -> bool:
        return self.status in (FAILED, NOT_RUN, INTERRUPTED)

    def to_json(self) -> dict[str, Any]:
        image = self.step.image
        return {
            "image": image.spec.key,
            "ref": image.ref,
            "tags": list(image.refs),
            "inputs_hash": image.inputs_hash,
            "action": self.step.action,
            "plan_reason": self.step.reason,
            "status": self.status,
            "reason": self.reason,
            "built": self.built is not None,
            "verified": None if self.verify is None else self.verify.ok,
            "pushed": dict(self.pushed),
            "signed": [s.to_json() for s in self.signed],
            # The digest the image's tags name (gzip+zstd pushes TAG-gzip, the gzip image, first).
            "digest": self.pushed.get(image.ref) or next(iter(self.pushed.values()), self.step.digest),
            "seconds": round(self.seconds, 2),
            **{phase: round(self.timings[phase], 2) if phase in self.timings else None
               for phase in ("build_s", "verify_s", "push_s", "sign_s", "cache_export_s")},
            "pushed_bytes": self.pushed_bytes,
            "squashfs": dict(self.squashfs) if self.squashfs is not None else None,
            "estargz": dict(self.estargz) if self.estargz is not None else None,
            **(self.layers or Layers(None, f"not read: the image is {self.status}, not published")).to_json(),
            "build": self.built.to_json() if self.built else None,
            "verify": self.verify.to_json() if self.verify else None,
        }
