"""Plan -> build -> verify -> push for many images.

- lookup(): what the registry holds under each image's tags (digests, the inputs-hash label);
- plan(): pure: rendered images + those lookups -> one Step per image, in build order;
- publish(): runs the steps over an Engine and a Registry, yielding one Outcome per image.

An image is skipped when the registry's image under its primary tag was built from the same
rendered inputs (its inputs-hash label, labels.INPUTS_HASH) and every one of its tags names
that image. When the image is there but some alias is missing or names another image, the
alias is pointed at it in the registry (a manifest PUT, no build, no download): the inputs
prove it is the image that alias should name, and it was verified when it was first pushed.

Beside the moving tags, each image gets an immutable dated tag, `{fully qualified}-{YYYYMMDD}`
of the publishing day: a dated tag is added (to a new image, or pointed at an unchanged one)
when that day has none, and never overwritten.

A tag counts as pushed only once the registry itself answers with the digest the push
reported: a registry that goes away mid-run never leaves an image reported as published.

Signing (`--sign-key`): after an image's tags are pushed and confirmed, its digest gets its SBOM
as a signed attestation and a signature (signing.py); a failed signing fails that image, and
it is reported as pushed but not signed. An unchanged image whose registry digest has no
signature is rebuilt, verified, pushed and signed, so a signing that failed half way is finished
by the next run, and images published before signing was turned on get signed.

Several platforms: each platform's images are published under their own tags (TAG-amd64,
TAG-arm64), planned, skipped and verified per platform (an emulated platform is not run:
`import torch` under QEMU hangs), and then write_indexes() makes every TAG an OCI image
index over them, through the registry API.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .build import Built, ProgressPrinter, build_image, build_order
from .errors import ImageBuilderError
from .engine.export import Export, cache_ref
from .labels import INPUTS_HASH, SBOM_DIGEST
from .reference import parse_reference
from .registry import Registry
from .render import SBOM_PATH, RenderedImage
from .signing import SbomNotTheImages, pinned, signature_tag
from .table import format_table
from .tags import dated_tag, image_ref

if TYPE_CHECKING:
    from .engine.api import Builder, Engine, OnProgress, Progress
    from .signing import Signed, Signer
    from .verify import VerifyReport

BUILD, RETAG, SKIP = "build", "retag", "skip"

# Outcome statuses.
PUSHED, RETAGGED, SKIPPED, VERIFIED, FAILED, NOT_RUN = (
    "pushed", "retagged", "skipped", "verified", "failed", "not run")


class PushNotConfirmed(ImageBuilderError):
    template = ("the push of {ref} reported {pushed} but the registry answers {registry_has}; "
                "another job may push the same tag, or the registry lost the upload: rerun")


class PushedOtherContent(ImageBuilderError):
    template = ("the push of {ref} stored {pushed}, but the image verify ran is {verified}: the engine "
                "changed the image after the check (recompressed it?); nothing pushed counts as published: "
                "rerun on an engine with the containerd image store, or with --compression gzip")


class PublishFailed(ImageBuilderError):
    def describe(self) -> str:
        failures = self.fields["failures"]
        what = "; ".join(f"{ref}: {reason}" for ref, reason in failures)
        return (f"{len(failures)} of {self.fields['total']} images failed: {what}; the images the summary "
                "shows as pushed are in the registry, rerun after fixing the rest (published images are skipped)")


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

    @property
    def writes(self) -> tuple[str, ...]:
        """Every ref the run pushes (BUILD) or re-points (RETAG) for this step, the dated one included."""
        if self.action == BUILD:
            return (*self.image.refs, *((self.dated,) if self.dated else ()))
        return self.retag

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image.spec.key, "ref": self.image.ref, "action": self.action, "reason": self.reason,
                "push": list(self.writes), "digest": self.digest}


def dated_ref(image: RenderedImage, day: date) -> str:
    # The qualified tag as the image carries it: a platform image's has its -arm64 suffix.
    qualified = next((t for t in image.tags if t.startswith(image.spec.key)), image.spec.key)
    return image_ref(image.repository, dated_tag(qualified, day))


def plan(images: Iterable[RenderedImage], remotes: Mapping[str, Remote], *,
         force: bool = False, day: date | None = None) -> tuple[Step, ...]:
    """One Step per image, runtime images before the jupyter images built FROM them.
    `remotes` is keyed by each image's primary ref; a missing entry means nothing is there.
    `day` (None: no dated tags) names the dated tag each image gets."""
    steps: list[Step] = []
    rebuilt: set[str] = set()
    for image in build_order(images):
        step = _decide(image, remotes.get(image.ref), force, rebuilt)
        if day is not None:
            step = _with_dated(step, dated_ref(image, day), remotes.get(image.ref))
        if step.action == BUILD:
            rebuilt.add(image.ref)
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
        return Step(image, BUILD, f"inputs changed (registry {_short(remote.inputs_hash)}, "
                                  f"rendered {_short(image.inputs_hash)})")
    if remote.signed is False:
        return Step(image, BUILD, "unchanged, but the registry's image is not signed")
    stale = tuple(ref for ref in image.refs if remote.digests.get(ref) != digest)
    if stale:
        names = ", ".join(parse_reference(ref).reference for ref in stale)
        return Step(image, RETAG, f"unchanged; tags missing or naming another image: {names}", digest, stale)
    return Step(image, SKIP, f"unchanged, published as {_short(digest)}", digest)


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


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


# --------------------------------------------------------------------------- lookup (I/O)


def lookup(registry: Registry, images: Iterable[RenderedImage], day: date | None = None,
           signing: bool = False) -> dict[str, Remote]:
    """Ask the registry about every tag of every image, the day's dated one included (HEADs,
    and one config blob each); `signing`: also whether the primary tag's image is signed."""
    remotes: dict[str, Remote] = {}
    for image in images:
        refs = image.refs + ((dated_ref(image, day),) if day is not None else ())
        digests = {ref: registry.digest(ref) for ref in refs}
        primary = digests[image.ref]
        labels = signed = None
        if primary is not None:
            # By digest: the labels of exactly the image whose digest we compare.
            labels = registry.labels(pinned(image.ref, primary))
            if signing:
                signed = registry.digest(signature_tag(pinned(image.ref, primary))) is not None
        remotes[image.ref] = Remote(digests, (labels or {}).get(INPUTS_HASH), signed)
    return remotes


# --------------------------------------------------------------------------- run (I/O)


@dataclass(frozen=True)
class RunOptions:
    matrix_path: Path
    push: bool = True
    keep_going: bool = False
    allow_no_gpu: bool = False
    verify_timeout: float = 1800.0
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
    cache_base: str | None = None
    """HOST[:PORT]/NAMESPACE whose imagebuilder-cache repository holds the build caches."""
    signer: Signer | None = None
    """Signs every pushed digest (signing.KeySigner); None: nothing is signed."""


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
    """Seconds of each phase that ran: build_s, verify_s, push_s, sign_s."""
    pushed_bytes: int | None = None
    """Blob bytes this push uploaded (0: the registry had every blob); None: not pushed/unknown."""

    @property
    def failed(self) -> bool:
        return self.status in (FAILED, NOT_RUN)

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
            "digest": next(iter(self.pushed.values()), self.step.digest),
            "seconds": round(self.seconds, 2),
            **{phase: round(self.timings[phase], 2) if phase in self.timings else None
               for phase in ("build_s", "verify_s", "push_s", "sign_s")},
            "pushed_bytes": self.pushed_bytes,
            "build": self.built.to_json() if self.built else None,
            "verify": self.verify.to_json() if self.verify else None,
        }


Event = Callable[[str, Step], None]
"""Called with "build", "verify", "push" or "retag" before that phase of a step starts."""
Verifier = Callable[["Engine", Registry, str, RunOptions], "VerifyReport"]


def smoke_test(engine: Engine, registry: Registry, ref: str, options: RunOptions) -> VerifyReport:
    """The default verifier: the image's smoke tests in a container (verify.verify_image)."""
    from .verify import verify_image

    # The current smoke tests, lent to the image: editing them rebuilds no image (they are
    # not in the inputs hash) and every image is still checked with today's checks.
    # Not yet pushed: the registry's provenance under this tag is of the image it replaces.
    return verify_image(engine, ref, registry=registry, allow_no_gpu=options.allow_no_gpu, timeout=options.verify_timeout,
                        mount_smoke_tests=True, read_provenance=False)


def publish(steps: Sequence[Step], *, engine: Engine, builder: Builder, registry: Registry, options: RunOptions,
            on_event: Event | None = None, on_progress: OnProgress | None = None,
            verifier: Verifier = smoke_test) -> Iterator[Outcome]:
    """Run the plan, one Outcome per step as it finishes. Without keep_going the first failure
    stops the run (the rest are NOT_RUN); a jupyter image whose runtime failed fails too."""
    failed: dict[str, str] = {}
    local: set[str] = set()  # refs built in this run: a jupyter build uses them as they are
    stopped_by: str | None = None
    for step in steps:
        image = step.image
        if stopped_by is not None:
            yield Outcome(step, NOT_RUN, f"not run: {stopped_by} failed (--keep-going runs the rest)")
            continue
        if image.depends_on in failed:
            outcome = Outcome(step, FAILED, f"its base image {image.depends_on} failed")
        else:
            started = time.monotonic()
            outcome = _run(step, engine, builder, registry, options, local, on_event or _quiet, on_progress, verifier)
            outcome = replace(outcome, seconds=time.monotonic() - started)
        if outcome.built is not None:
            local.add(image.ref)
        if outcome.status == FAILED:
            failed[image.ref] = outcome.reason
            if not options.keep_going:
                stopped_by = image.ref
        yield outcome


def _quiet(phase: str, step: Step) -> None:
    pass


def _run(step: Step, engine: Engine, builder: Builder, registry: Registry, options: RunOptions, local: set[str],
         on_event: Event, on_progress: OnProgress | None, verifier: Verifier) -> Outcome:
    if step.action == SKIP:
        return Outcome(step, SKIPPED, step.reason)
    if step.action == RETAG:
        return _retag(step, registry, options, on_event)
    return _build_verify_push(step, engine, builder, registry, options, local, on_event, on_progress, verifier)


def _retag(step: Step, registry: Registry, options: RunOptions, on_event: Event) -> Outcome:
    assert step.digest is not None
    if not options.push:
        return Outcome(step, SKIPPED, f"{step.reason} (--no-push: left as they are)")
    on_event(RETAG, step)
    pushed = {ref: step.digest for ref in step.image.refs if ref not in step.retag}
    try:
        for ref in step.retag:
            pushed[ref] = _put_tag(registry, ref, step.digest)
    except ImageBuilderError as e:
        return Outcome(step, FAILED, f"retag failed: {e}", pushed=pushed)
    return Outcome(step, RETAGGED, step.reason, pushed=pushed)


def _put_tag(registry: Registry, ref: str, digest: str) -> str:
    """Point tag `ref` at `digest` (a manifest PUT) and confirm the registry took it."""
    now = registry.put_tag(ref, digest)
    if now != digest:
        raise PushNotConfirmed(ref=ref, pushed=digest, registry_has=now or "no such tag")
    return now


def export_for(image: RenderedImage, options: RunOptions, registry: Registry) -> Export | None:
    """The image's export: options.export with this image's registry cache, imported where
    the registry has it (BuildKit fails a build whose cache is not there) and exported."""
    export = options.export
    if export is None or options.cache_base is None:
        return export
    ref = cache_ref(options.cache_base, image.spec.key)
    found = (ref,) if registry.digest(ref) is not None else ()
    return replace(export, cache_from=(*export.cache_from, *found), cache_to=ref)


def _build_verify_push(step: Step, engine: Engine, builder: Builder, registry: Registry, options: RunOptions,
                       local: set[str], on_event: Event,
                       on_progress: OnProgress | None, verifier: Verifier) -> Outcome:
    image = step.image
    timings: dict[str, float] = {}
    on_event(BUILD, step)
    started = time.monotonic()
    try:
        if image.depends_on and image.depends_on not in local:
            # Build FROM the runtime image as published, not whatever this host has under its tag.
            engine.pull(image.depends_on)
        export = export_for(image, options, registry)
        built = build_image(engine, image, matrix_path=options.matrix_path, nocache=options.nocache,
                            pull=options.pull, on_progress=on_progress, builder=builder,
                            platform=options.platform, export=export)
    except ImageBuilderError as e:
        return Outcome(step, FAILED, f"build failed: {e}")
    timings["build_s"] = time.monotonic() - started
    report = None
    if options.verify:
        on_event("verify", step)
        started = time.monotonic()
        report = verifier(engine, registry, image.ref, options)
        timings["verify_s"] = time.monotonic() - started
    if report is not None and not report.ok:
        why = "; ".join(f"{name}: {reason}" for name, reason in report.failures)
        return Outcome(step, FAILED, f"verification failed: {why}", built=built, verify=report, timings=timings)
    if not options.push:
        return Outcome(step, VERIFIED, "--no-push", built=built, verify=report, timings=timings)
    on_event("push", step)
    started = time.monotonic()
    pushed: dict[str, str] = {}
    uploaded = 0
    # With the containerd image store the image id is the digest of the index BuildKit
    # exported: the push must store exactly that, or it is not the image verify ran.
    same_bytes = options.export is not None and options.export.compression is not None
    published: str | None = None
    try:
        published = _published_as_built(image, engine, registry, options)
        if published is not None:
            # The registry has this very image (BuildKit's new index would differ only in its
            # provenance's timestamps): nothing goes up, and a tag that names another is moved.
            for ref in image.refs:
                pushed[ref] = published if registry.digest(ref) == published else _put_tag(registry, ref, published)
        else:
            if export is not None and export.cache_to is not None:
                _mount_from_cache(image.ref, engine, registry, export.cache_to)
            for ref in image.refs:
                result = engine.push_counted(ref, retries=options.push_retries, backoff=options.push_backoff)
                digest = result.digest
                uploaded += result.uploaded_bytes(registry.blobs(f"{ref.rsplit(':', 1)[0]}@{digest}"))
                if same_bytes and digest != built.result.image_id:
                    raise PushedOtherContent(ref=ref, pushed=digest, verified=built.result.image_id)
                confirmed = registry.digest(ref)
                if confirmed != digest:
                    raise PushNotConfirmed(ref=ref, pushed=digest, registry_has=confirmed or "no such tag")
                pushed[ref] = digest
        if step.dated and registry.digest(step.dated) is None:  # (asked again: --force plans blind)
            # A manifest PUT of the image just pushed: the dated tag needs no local tag.
            pushed[step.dated] = _put_tag(registry, step.dated, pushed[image.ref])
    except ImageBuilderError as e:
        timings["push_s"] = time.monotonic() - started
        return Outcome(step, FAILED, f"push failed: {e}", built=built, verify=report, pushed=pushed,
                       timings=timings)
    timings["push_s"] = time.monotonic() - started
    signed: tuple[Signed, ...] = ()
    if options.signer is not None:
        on_event("sign", step)
        started = time.monotonic()
        try:
            signed = _sign(engine, image, pushed, options.signer)
        except ImageBuilderError as e:
            return Outcome(step, FAILED, f"pushed, but not signed (the next run rebuilds and signs it): {e}",
                           built=built, verify=report, pushed=pushed, timings=timings, pushed_bytes=uploaded)
        finally:
            timings["sign_s"] = time.monotonic() - started
    reason = step.reason if options.verify else f"{step.reason}; not verified: {options.platform} is emulated here"
    if published is not None:
        reason += f"; the registry had this image ({_short(published)}): kept, nothing uploaded"
    return Outcome(step, PUSHED, reason, built=built, verify=report, pushed=pushed, timings=timings,
                   pushed_bytes=uploaded, signed=signed)


def _mount_from_cache(ref: str, engine: Engine, registry: Registry, cache: str) -> None:
    """Mount the image's layers from its build cache `cache` into its repository before the push.
    The build's cache export (mode=min) uploaded the image's own blobs there, and `docker push`
    asks to mount a blob only from repositories it pulled or pushed it to itself, so without
    this the push uploads every layer a second time. Only the cache's layers this image has (by
    uncompressed digest) are mounted; one the registry will not mount is left to the push, and a
    registry that cannot say fails nothing here (the push says what fails)."""
    try:
        found = registry.manifest(cache)
        ours = set((engine.inspect_image(ref).get("RootFS") or {}).get("Layers") or ())
        for layer in (found[0].get("layers") or []) if found else []:
            if (layer.get("annotations") or {}).get("containerd.io/uncompressed") in ours:
                registry.mount(ref, str(layer["digest"]), cache)
    except ImageBuilderError:
        pass


# What makes two images the same image to a container: their layers' content and these settings.
_RUNTIME_CONFIG = ("Env", "Cmd", "Entrypoint", "User", "WorkingDir", "Labels", "ExposedPorts", "Volumes")


def _published_as_built(image: RenderedImage, engine: Engine, registry: Registry, options: RunOptions) -> str | None:
    """The digest `image.ref` names in the registry where that is the image just built and
    verified: the same layers (uncompressed digests), compressed as asked, and the same
    runtime settings and labels. None where it is not, or where the registry cannot tell."""
    compression = options.export.compression if options.export is not None else None
    if compression is None:
        return None
    found = registry.image_config(image.ref, options.platform)
    if found is None or not all(m.endswith(f"+{compression.kind}") for m in found[1]):
        return None
    theirs, local = found[0], engine.inspect_image(image.ref)

    def settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
        return {key: (config or {}).get(key) or None for key in _RUNTIME_CONFIG}

    if ((theirs.get("rootfs") or {}).get("diff_ids") != (local.get("RootFS") or {}).get("Layers")
            or settings(theirs.get("config")) != settings(local.get("Config"))):
        return None
    digest = registry.digest(image.ref)
    return str(digest) if digest else None


def _sign(engine: Engine, image: RenderedImage, pushed: Mapping[str, str], signer: Signer) -> tuple[Signed, ...]:
    """Sign each digest the registry confirmed (one, unless a tag's push went astray), with the
    SBOM the pushed image carries attested; that SBOM must be the one its label names."""
    sbom = engine.read_file(image.ref, SBOM_PATH) or b""
    found, labelled = "sha256:" + hashlib.sha256(sbom).hexdigest(), engine.image_labels(image.ref).get(SBOM_DIGEST)
    if found != labelled:
        raise SbomNotTheImages(target=image.ref, path=SBOM_PATH, found=found if sbom else "missing",
                               label=SBOM_DIGEST, labelled=labelled or "missing")
    return tuple(signer.sign(pinned(image.ref, digest), sbom) for digest in dict.fromkeys(pushed.values()))


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
    """WRITE, UNCHANGED (the registry has this very index) or SKIP (a platform's image is missing)."""
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


def plan_indexes(registry: IndexRegistry, wanted: Mapping[str, Sequence[str]],
                 pending: Collection[str] = frozenset()) -> tuple[IndexStep, ...]:
    """One IndexStep per tag in `wanted` (tag -> the platforms its index joins), asking the
    registry (reads only) what each platform's tag names; `pending`: the platform tags this
    run pushes before merging (a dry run's plan). A tag missing a platform's image is skipped,
    not an error here: every other tag is still merged."""
    from .platforms import platform_tags

    steps = []
    for ref, platforms in wanted.items():
        children = []
        for platform in platforms:
            child = platform_tags((ref,), platform)[0]
            waiting = child in pending
            children.append(IndexChild(child, platform, None if waiting else registry.digest(child), waiting))
        absent = [c for c in children if c.digest is None and not c.pending]
        if absent:
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


def write_indexes(registry: IndexRegistry, steps: Sequence[IndexStep],
                  signer: Signer | None = None) -> tuple[IndexOutcome, ...]:
    """Write every planned index (planned with nothing pending); a tag that cannot be written
    is reported and the rest are still written. A rerun with the same children writes nothing.
    `signer` signs each index written, and an unchanged one that has no signature yet (its
    signing failed before); the platform images carry their own SBOM attestations."""
    outcomes = []
    for step in steps:
        if step.action == SKIP:
            outcomes.append(IndexOutcome(step, SKIPPED, step.reason))
            continue
        status, digest = UNCHANGED, step.digest or ""
        if step.action == WRITE:
            assert step.body, f"{step.ref}: plan the indexes again once the platform images are pushed"
            try:
                status, digest = WRITTEN, registry.put_index(step.ref, step.body)
            except ImageBuilderError as e:
                outcomes.append(IndexOutcome(step, FAILED, f"the index PUT failed: {e}"))
                continue
        signed = None
        target = pinned(step.ref, digest)
        if signer is not None and (status == WRITTEN or registry.digest(signature_tag(target)) is None):
            try:
                signed = signer.sign(target, None)
            except ImageBuilderError as e:
                outcomes.append(IndexOutcome(step, FAILED, f"{status} {digest}, but not signed: {e}", digest))
                continue
        outcomes.append(IndexOutcome(step, status, "" if status == WRITTEN else step.reason, digest, signed))
    return tuple(outcomes)


def publish_all(plans: Sequence[tuple[str, Sequence[Step]]], *, engine: Engine, builder: Builder,
                registry: Registry, options: RunOptions, multi: bool, merge: bool,
                index_platforms: Mapping[str, Sequence[str]], on_event: Event | None = None,
                on_progress: OnProgress | None = None) -> Iterator[Outcome | IndexOutcome]:
    """Every platform's plan in turn (`options.platform` set per platform with `multi`; the
    smoke tests run where the platform is the host's), then, with `multi` and `merge`, when
    everything was pushed, the image indexes: each Outcome and IndexOutcome as it is done."""
    from .platforms import host_platform

    outcomes: list[Outcome] = []
    for platform, steps in plans:
        per_platform = replace(options, platform=platform if multi else None, verify=platform == host_platform())
        for outcome in publish(steps, engine=engine, builder=builder, registry=registry, options=per_platform,
                               on_event=on_event, on_progress=on_progress):
            outcomes.append(outcome)
            yield outcome
    if multi and merge and options.push and outcomes and not any(o.failed for o in outcomes):
        yield from write_indexes(registry, plan_indexes(registry, index_platforms), options.signer)


def run_and_report(plans: Sequence[tuple[str, Sequence[Step]]], *, engine: Engine, builder: Builder,
                   registry: Registry, options: RunOptions, multi: bool, merge: bool,
                   index_platforms: Mapping[str, Sequence[str]], base: str, report: Path | None,
                   events: EventPrinter, echo: Callable[[str], None]) -> None:
    """`publish`: publish_all() with a line per outcome and index on `events`, the summary on
    `echo` and the --report written however the run ends; raises when any image failed, or
    any tag could not be made an index."""
    from .atomic import write_json

    outcomes: list[Outcome] = []
    indexes: list[IndexOutcome] = []
    try:
        for done in publish_all(plans, engine=engine, builder=builder, registry=registry, options=options,
                                multi=multi, merge=merge, index_platforms=index_platforms,
                                on_event=events.on_event, on_progress=events.on_progress):
            if isinstance(done, IndexOutcome):
                indexes.append(done)
                events.line(format_indexes([done]))
            else:
                outcomes.append(done)
                events.line(f"{done.status} {done.step.image.ref}: {done.reason}")
    finally:
        events.close()
        if outcomes:
            echo(format_summary(outcomes, signing=options.signer is not None))
        if report is not None:
            planned = [step for _, steps in plans for step in steps]
            write_json(report, report_document(base, options.push, False, planned, outcomes, indexes))
    raise_if_failed(outcomes, indexes)


def report_indexes(indexes: Sequence[IndexStep | IndexOutcome], planned: Sequence[Step], *, base: str, push: bool,
                   dry_run: bool, report: Path | None, echo: Callable[[str], None]) -> None:
    """A publish that builds nothing (the dry run, --merge-only): the indexes it planned or
    wrote on `echo`, the --report, then a failure naming each tag left without an index."""
    from .atomic import write_json

    if indexes:
        echo(format_indexes(indexes))
    if report is not None:
        write_json(report, report_document(base, push, dry_run, planned, (), indexes))
    raise_if_failed((), indexes)


# --------------------------------------------------------------------------- presenting


class EventPrinter:
    """A line per phase of each image on `stream`, and a build's progress while it builds."""

    def __init__(self, stream: Any, quiet: bool = False) -> None:
        self.stream, self.quiet = stream, quiet
        self._printer: ProgressPrinter | None = None

    def on_event(self, phase: str, step: Step) -> None:
        self.close()
        self.line(f"{phase} {step.image.ref}")
        if phase == BUILD and not self.quiet:
            self._printer = ProgressPrinter(step.image.spec.variant, stream=self.stream)

    def on_progress(self, progress: Progress) -> None:
        if self._printer is not None:
            self._printer(progress)

    def line(self, text: str) -> None:
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._printer is not None:
            self._printer.close()
            self._printer = None



def format_plan(steps: Sequence[Step], push: bool = True) -> str:
    """The plan, under it every tag each step pushes or re-points (the dated one too), or with
    --no-push what stays local, and the count of each action."""
    rows = [(str(n), step.action, step.image.ref, step.reason) for n, step in enumerate(steps, 1)]
    lines = [format_table(("#", "ACTION", "IMAGE", "WHY"), rows)]
    for step in steps:
        tags = ", ".join(parse_reference(ref).reference for ref in step.writes)
        if step.action == BUILD:
            lines.append(f"  {step.image.tags[0]}: " + (f"push {tags}" if push else "build and verify; push nothing (--no-push)"))
        elif step.action == RETAG:
            lines.append(f"  {step.image.tags[0]}: " + (f"point {tags} at {_short(step.digest or '')}" if push
                                                         else "point nothing (--no-push)"))
    counts = {action: sum(step.action == action for step in steps) for action in (BUILD, RETAG, SKIP)}
    lines.append(f"plan: {counts[BUILD]} to build, {counts[RETAG]} to re-point, {counts[SKIP]} to skip")
    return "\n".join(lines)


def format_indexes(indexes: Sequence[IndexStep | IndexOutcome]) -> str:
    """One line per tag: the index written or planned (its digest where the children are
    known), the one the registry already has, or why the tag is skipped."""
    lines = []
    for item in indexes:
        if isinstance(item, IndexOutcome):
            step, status, reason, digest = item.step, item.status, item.reason, item.digest
        else:
            step, reason, digest = item, item.reason, item.digest
            status = {WRITE: "would write", SKIP: "would skip"}.get(item.action, item.action)
        if status in (SKIPPED, FAILED, "would skip"):
            lines.append(f"index {step.ref}: {status}: {reason}")
        else:
            over = f"over {', '.join(c.platform for c in step.children)}"
            details = (reason,) if isinstance(item, IndexStep) and item.action == WRITE else ()
            lines.append(f"index {step.ref}: " + " ".join(part for part in (status, digest, over, *details) if part))
    return "\n".join(lines)


def format_summary(outcomes: Sequence[Outcome], signing: bool = False) -> str:
    def mark(value: bool | None) -> str:
        return "-" if value is None else ("yes" if value else "no")

    rows = []
    for o in outcomes:
        verified = None if o.verify is None else o.verify.ok
        refs = o.step.image.refs  # (the dated tag is not counted: it is not one of the image's tags)
        pushed = f"{len(set(o.pushed) & set(refs))}/{len(refs)}" if o.pushed or o.status == FAILED else "-"
        row = (o.step.image.tags[0], mark(o.built is not None if o.step.action == BUILD else None),
               mark(verified), pushed, o.status, o.reason)
        rows.append(row[:4] + ((mark(bool(o.signed) if o.pushed else None),) if signing else ()) + row[4:])
    headers = ("IMAGE", "BUILT", "VERIFIED", "PUSHED") + (("SIGNED",) if signing else ()) + ("RESULT", "WHY")
    return format_table(headers, rows)


def report_document(registry: str, push: bool, dry_run: bool, planned: Sequence[Step],
                    outcomes: Sequence[Outcome], indexes: Sequence[IndexStep | IndexOutcome]) -> dict[str, Any]:
    """`publish --report`: what was planned, and what became of each image and index; of a dry
    run, the plan (`images` empty, `indexes` as planned, `ok` true)."""
    unmerged = any(isinstance(i, IndexOutcome) and i.status in (SKIPPED, FAILED) for i in indexes)
    ok = dry_run or (len(outcomes) == len(planned) and not any(o.failed for o in outcomes) and not unmerged)
    return {"ok": ok, "dry_run": dry_run, "registry": registry, "push": push,
            "images": [o.to_json() for o in outcomes],
            "indexes": [i.to_json() for i in indexes],
            "planned": [step.to_json() for step in planned]}


def raise_if_failed(outcomes: Sequence[Outcome], indexes: Sequence[IndexStep | IndexOutcome] = ()) -> None:
    """Fail naming the images that failed, else the tags left without an index (a dry run's
    planned skips are no failure)."""
    failures = [(o.step.image.ref, o.reason) for o in outcomes if o.failed]
    if failures:
        raise PublishFailed(failures=tuple(failures), total=len(outcomes))
    written = [i for i in indexes if isinstance(i, IndexOutcome)]
    unmerged = tuple((i.step.ref, i.reason) for i in written if i.status in (SKIPPED, FAILED))
    if unmerged:
        raise MergeIncomplete(unmerged=unmerged, total=len(written))
