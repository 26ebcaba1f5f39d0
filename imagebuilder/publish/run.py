"""Run the plan: per image build -> verify -> push -> sign, each its own function, over an
Engine and a Registry, yielding one Outcome per image; publish_all() runs every platform's
plan, then writes the image indexes (indexes.py).

Signing (`--sign-key`): after an image's tags are pushed and confirmed, its digest gets its SBOM
as a signed attestation and a signature (signing.py); a failed signing fails that image, and
it is reported as pushed but not signed. An unchanged image whose registry digest has no
signature is rebuilt, verified, pushed and signed, so a signing that failed half way is finished
by the next run, and images published before signing was turned on get signed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

from ..build.platforms import host_platform
from ..build.render import RenderedImage
from ..build.run import Built, build_image
from ..engine.api import Builder, Engine, OnProgress
from ..engine.export import Export, gzip_ref
from ..errors import ImageBuilderError
from ..registry.api import Registry
from ..registry.reference import pinned
from ..trust.signing import Signed
from ..verify import VerifyReport, verify_image
from .blobs import published_layers
from .indexes import IndexOutcome, plan_indexes, write_indexes
from .plan import (BUILD, CACHE, FAILED, NOT_RUN, PUSHED, RETAG, RETAGGED, SCAN, SKIP, SKIPPED, VERIFIED, Outcome,
                   RunOptions, Step, short)
from .push import Pushing, export_for, layers_of, push_image, put_tag, sign_pushed

Event = Callable[[str, Step], None]
"""Called with "build", "verify", "scan", "push" or "retag" before that phase of a step starts."""
Verifier = Callable[[Engine, Registry, str, RunOptions], VerifyReport]


def smoke_test(engine: Engine, registry: Registry, ref: str, options: RunOptions) -> VerifyReport:
    """The default verifier: the image's smoke tests in a container (verify.verify_image)."""
    # The current smoke tests, lent to the image: editing them rebuilds no image (they are
    # not in the inputs hash) and every image is still checked with today's checks.
    # Not yet pushed: the registry's provenance under this tag is of the image it replaces.
    return verify_image(engine, ref, registry=registry, allow_no_gpu=options.allow_no_gpu,
                        timeout=options.verify_timeout, mount_smoke_tests=True, read_provenance=False)


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
            if options.squashfs is not None and options.push:
                outcome = options.squashfs(outcome, options.platform or host_platform())
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
        assert step.digest is not None
        layers = published_layers(registry, pinned(step.image.ref, step.digest))
        return Outcome(step, SKIPPED, step.reason, layers=layers)
    if step.action == RETAG:
        return _retag(step, registry, options, on_event)
    return _build_verify_push(step, engine, builder, registry, options, local, on_event, on_progress, verifier)


def _retag(step: Step, registry: Registry, options: RunOptions, on_event: Event) -> Outcome:
    assert step.digest is not None
    layers = published_layers(registry, pinned(step.image.ref, step.digest))
    if not options.push:
        return Outcome(step, SKIPPED, f"{step.reason} (--no-push: left as they are)", layers=layers)
    on_event(RETAG, step)
    pushed = {ref: step.digest for ref in step.image.refs if ref not in step.retag}
    try:
        for ref in step.retag:
            pushed[ref] = put_tag(registry, ref, step.digest)
    except ImageBuilderError as e:
        return Outcome(step, FAILED, f"retag failed: {e}", pushed=pushed)
    return Outcome(step, RETAGGED, step.reason, pushed=pushed, layers=layers)



def _build_verify_push(step: Step, engine: Engine, builder: Builder, registry: Registry, options: RunOptions,
                       local: set[str], on_event: Event,
                       on_progress: OnProgress | None, verifier: Verifier) -> Outcome:
    """One image's phases in turn (build, verify, push, sign); the first that fails ends it."""
    timings: dict[str, float] = {}
    on_event(BUILD, step)
    started = time.monotonic()
    try:
        built, export = _build(step.image, engine, builder, registry, options, local, on_progress)
    except ImageBuilderError as e:
        return Outcome(step, FAILED, f"build failed: {e}")
    timings["build_s"] = time.monotonic() - started
    try:
        return _verify_push(step, built, export, engine, registry, options, on_event, verifier, timings)
    finally:
        if built.cache_export is not None:  # ended by now, unless something failed on the way
            built.cache_export.stop()
        if built.gzip is not None:
            # gzip+zstd's gzip image is this run's, for the push alone, however the image's phases
            # ended: pushed, its blobs are in the registry; not, the next run exports it again
            # (every step cached). Here it would only double the image's disk.
            engine.remove_image(gzip_ref(step.image.ref), force=False)


def _verify_push(step: Step, built: Built, export: Export | None, engine: Engine, registry: Registry,
                 options: RunOptions, on_event: Event, verifier: Verifier, timings: dict[str, float]) -> Outcome:
    report = None
    if options.verify:
        on_event("verify", step)
        started = time.monotonic()
        report = verifier(engine, registry, step.image.ref, options)
        timings["verify_s"] = time.monotonic() - started
    if report is not None and not report.ok:
        why = "; ".join(f"{name}: {reason}" for name, reason in report.failures)
        return Outcome(step, FAILED, f"verification failed: {why}", built=built, verify=report, timings=timings)
    scanned = None
    if options.scan is not None:
        on_event(SCAN, step)
        started = time.monotonic()
        try:
            push_it, scanned = options.scan(step.image.ref)
        except ImageBuilderError as e:
            return Outcome(step, FAILED, f"scan failed: {e}", built=built, verify=report, timings=timings)
        finally:
            timings["scan_s"] = time.monotonic() - started
        if not push_it:
            return Outcome(step, FAILED, f"not pushed: {scanned}", built=built, verify=report, timings=timings)
    outcome = _push_or_keep(step, built, report, export, engine, registry, options, on_event, timings)
    return replace(outcome, reason=f"{outcome.reason}; {scanned}") if scanned and not outcome.failed else outcome


def _push_or_keep(step: Step, built: Built, report: VerifyReport | None, export: Export | None, engine: Engine,
                  registry: Registry, options: RunOptions, on_event: Event, timings: dict[str, float]) -> Outcome:
    if not options.push:
        cache_failed = _cache_exported(step, built, on_event, timings)
        return Outcome(step, VERIFIED, "--no-push" + (f"; {cache_failed}" if cache_failed else ""), built=built,
                       verify=report, timings=timings)
    return _push_and_sign(step, built, report, export, engine, registry, options, on_event, timings)


def _cache_exported(step: Step, built: Built, on_event: Event, timings: dict[str, float]) -> str | None:
    """Wait for the image's registry cache export running since its build (cache_export.py),
    saying so every 15 s; why it failed, or None."""
    exporting = built.cache_export
    if exporting is None:
        return None
    failed = exporting.wait(lambda elapsed: on_event(CACHE, step))
    if exporting.seconds is not None:
        timings["cache_export_s"] = exporting.seconds
    return failed


def _build(image: RenderedImage, engine: Engine, builder: Builder, registry: Registry, options: RunOptions,
           local: set[str], on_progress: OnProgress | None) -> tuple[Built, Export | None]:
    if image.depends_on and image.depends_on not in local:
        # Build FROM the runtime image as published, not whatever this host has under its tag.
        engine.pull(image.depends_on)
    export = export_for(image, options, registry)
    built = build_image(engine, image, matrix_path=options.matrix_path, nocache=options.nocache,
                        pull=options.pull, on_progress=on_progress, builder=builder,
                        platform=options.platform, export=export, gzip_too=options.gzip_too, background_cache=True)
    return built, export


def _push_and_sign(step: Step, built: Built, report: VerifyReport | None, export: Export | None, engine: Engine,
                   registry: Registry, options: RunOptions, on_event: Event, timings: dict[str, float]) -> Outcome:
    on_event("push", step)
    started = time.monotonic()
    # Its layers are mounted from the cache: the push waits for the cache's export (with this
    # image's blobs) to end; where it failed, the push uploads them.
    cache_failed = _cache_exported(step, built, on_event, timings)
    done = Pushing()
    try:
        push_image(step, built, export, engine, registry, options, done)
    except ImageBuilderError as e:
        timings["push_s"] = time.monotonic() - started
        return Outcome(step, FAILED, f"push failed: {e}", built=built, verify=report, pushed=done.pushed,
                       timings=timings)
    timings["push_s"] = time.monotonic() - started
    layers = layers_of(step.image, registry, done)
    signed: tuple[Signed, ...] = ()
    if options.signer is not None:
        on_event("sign", step)
        started = time.monotonic()
        try:
            signed = sign_pushed(engine, registry, step.image, done.pushed, options.signer, done.instances)
        except ImageBuilderError as e:
            return Outcome(step, FAILED, f"pushed, but not signed (the next run rebuilds and signs it): {e}",
                           built=built, verify=report, pushed=done.pushed, timings=timings,
                           pushed_bytes=done.uploaded, layers=layers)
        finally:
            timings["sign_s"] = time.monotonic() - started
    reason = step.reason if options.verify else f"{step.reason}; not verified: {options.platform} is emulated here"
    if done.published is not None:
        reason += f"; the registry had this image ({short(done.published)}): kept, nothing uploaded"
    if cache_failed:
        reason += f"; {cache_failed}: the push uploaded the layers itself"
    return Outcome(step, PUSHED, reason, built=built, verify=report, pushed=done.pushed, timings=timings,
                   pushed_bytes=done.uploaded, signed=signed, layers=layers,
                   estargz=done.estargz.to_json() if done.estargz is not None else None)


def publish_all(plans: Sequence[tuple[str, Sequence[Step]]], *, engine: Engine, builder: Builder,
                registry: Registry, options: RunOptions, multi: bool, merge: bool,
                index_platforms: Mapping[str, Sequence[str]], on_event: Event | None = None,
                on_progress: OnProgress | None = None) -> Iterator[Outcome | IndexOutcome]:
    """Every platform's plan in turn (`options.platform` set per platform with `multi`; the
    smoke tests run where the platform is the host's), then, with `multi` and `merge`, when
    everything was pushed, the image indexes: each Outcome and IndexOutcome as it is done."""
    outcomes: list[Outcome] = []
    for platform, steps in plans:
        per_platform = replace(options, platform=platform if multi else None, verify=platform == host_platform())
        for outcome in publish(steps, engine=engine, builder=builder, registry=registry, options=per_platform,
                               on_event=on_event, on_progress=on_progress):
            outcomes.append(outcome)
            yield outcome
    if multi and merge and options.push and outcomes and not any(o.failed for o in outcomes):
        yield from write_indexes(registry, plan_indexes(registry, index_platforms), options.signer)


