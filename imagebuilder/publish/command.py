"""The `publish` command: what the CLI parsed -> the checks, the plan, then its two endings, over
report.py's lines and ledger.py's --report: a run (publish_all() with a line per outcome and index,
the summary, the --report kept as the run goes and however it ends, the failure) and a publish that
builds nothing (the dry run, --merge-only)."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timezone
from pathlib import Path

from .. import pipeline
from ..build.render_options import RenderOptions
from ..engine.api import Builder, Engine
from ..engine.export import ORDERED, Compression
from ..errors import BadRequest
from ..matrix.model import Matrix
from ..matrix.selection import Selection
from ..registry.api import Registry
from ..registry.reference import RegistryTarget
from ..registry.retry import RetryPolicy
from .estargz import EstargzPublisher, asked_layers, pushed_as, split_export
from .indexes import IndexOutcome, IndexStep
from .ledger import Ledger
from .plan import RunOptions, Step
from .report import EventPrinter, format_indexes, format_plan, format_summary, raise_if_failed
from .run import publish_all

Echo = Callable[[str], None]


def publish_command(matrix: Matrix, matrix_path: Path, selection: Selection, rendering: RenderOptions,
                    target: RegistryTarget, *, push: bool, dry_run: bool, keep_going: bool, force: bool,
                    allow_no_gpu: bool, verify_timeout: float, day: date | None, quiet: bool, no_cache: bool,
                    pull: bool, report: Path | None, registry_ca: Path | None, builder_choice: str,
                    buildx_builder: str | None, platforms: str | None, merge: bool, merge_only: bool,
                    compression: Compression | None, sign_key: str | None, registry_policy: RetryPolicy,
                    squashfs: bool, echo: Echo, note: Echo, progress: Echo,
                    start_command: str | None = None, scan: Callable[[str], tuple[bool, str]] | None = None) -> None:
    """`imagebuilder publish` with what its options parsed: the request checked before any daemon or
    registry is asked, the plan printed on `echo`, then the run (or the indexes of a publish that
    builds nothing). `note` and `progress` write the lines of stderr. `scan` (--scan) judges each
    image after its verify and before its push (RunOptions.scan)."""
    from ..build.platforms import parse_platforms
    from ..engine.docker import DockerEngine
    from ..engine.export import choose
    from ..engine.select import CLASSIC, decide, kind_before_probing, make_builder
    from ..registry.client import HttpRegistry
    from ..trust.signing import key_signer

    if squashfs and not push:  # it goes up beside the pushed image: with nothing pushed it would be dropped
        raise SquashfsWithoutPush()
    start = start_profile_command(start_command, compression)
    repository = target.repository(rendering.repository or matrix.defaults.repository)
    wanted = parse_platforms(platforms)
    # --platform: each platform's images under their own tags (TAG-arm64), then an index per TAG.
    multi = platforms is not None
    # A wrong request is refused before any daemon or registry is asked (deciding the builder may probe one).
    known = CLASSIC.kind if merge_only else kind_before_probing(builder_choice)
    pipeline.check_publish(matrix, selection, pipeline.render_options(matrix, rendering, known, repository),
                           wanted, multi=multi, merge_only=merge_only, compression=compression)
    # The dry run is the run's plan: a key the run would refuse is refused here too (exit 2).
    signer = key_signer(sign_key, try_key=True) if sign_key is not None else None
    # From here the --report records what happens, also when an error or Ctrl-C ends the run.
    with Ledger(report, target.base, push, dry_run).kept() as ledger:
        # Decided once, alike for the dry run and the run: it decides the render, so the inputs hash.
        decision = CLASSIC if merge_only else decide(builder_choice, buildx_builder)
        engine = None if dry_run or merge_only else DockerEngine()
        if engine is not None:
            engine.ping()
        opts = pipeline.render_options(matrix, rendering, decision.kind, repository, buildx=decision.buildx)
        registry = HttpRegistry(policy=registry_policy, ca_file=registry_ca)
        today = day if day is not None else datetime.now(timezone.utc).date()
        plan = pipeline.plan_publish(matrix, selection, opts, wanted, multi=multi,
                                     read_os_release=engine.os_release if engine else None,
                                     registry=registry, force=force, day=today, merge_only=merge_only, note=note,
                                     signing=signer is not None,
                                     dual=compression is not None and compression.also is not None)
        ledger.planned = plan.planned
        for platform, steps in plan.steps:
            echo((f"{platform}:\n" if multi else "") + format_plan(steps, push))
        if engine is None:  # the dry run, or --merge-only: the indexes it plans, or writes
            if not merge_only:  # (which builds nothing, so compresses and flattens nothing)
                for line in asked_lines(compression, start, squashfs, signed=signer is not None):
                    echo(line)
            merged = plan.indexes(registry, merge=merge_only or (merge and push),
                                  signer=signer if merge_only and not dry_run else None, write=merge_only and not dry_run)
            report_indexes(merged, ledger, echo=echo)
            return
        hook = None
        if squashfs:  # its tools are checked before anything is built
            from ..squashfs.make import require_tools
            from .squashfs import SquashfsPublisher, with_squashfs

            require_tools()
            hook = functools.partial(with_squashfs, SquashfsPublisher(registry, signer, say=progress))
        builder = make_builder(decision, engine)
        buildkit = decision.kind == "buildkit"
        # Compression.DEFAULT (zstd) where BuildKit exports into the containerd store; gzip by docker push elsewhere.
        export = choose(compression, buildkit=buildkit, provenance=True,
                        image_store=buildkit and engine.keeps_compressed_layers())
        # --compression estargz|zstd:chunked: the push writes them ordered by the image's start (estargz.py).
        export, estargz = split_export(export, lambda codec, level: EstargzPublisher(
            engine, registry, level=level, codec=codec, start=start, say=progress))
        if not quiet:
            progress(f"builder: {builder.describe()}")
            progress(f"layers: {export.describe() if export else 'gzip (docker push compresses them)'}")
            if estargz is not None:
                progress(pushed_as(estargz.codec, estargz.level, start))
        run_options = RunOptions(matrix_path=matrix_path, push=push, keep_going=keep_going,
                                 allow_no_gpu=allow_no_gpu, verify_timeout=verify_timeout, nocache=no_cache,
                                 pull=pull, export=export, cache_registry=target if export is not None else None,
                                 signer=signer, squashfs=hook, estargz=estargz, scan=scan)
        run_and_report(plan.steps, engine=engine, builder=builder, registry=registry, options=run_options,
                       multi=multi, merge=merge, index_platforms=plan.index_platforms, ledger=ledger,
                       events=EventPrinter(sys.stderr, quiet=quiet), echo=echo)


def asked_lines(compression: Compression | None, start: Sequence[str] | None, squashfs: bool, *,
                signed: bool) -> list[str]:
    """What a dry run says of the options that change what goes up besides the plan's tags:
    --compression (with eStargz's start profile) and --squashfs."""
    lines = [asked_layers(compression, start)] if compression is not None else []
    if squashfs:
        lines.append("squashfs: beside each image pushed or found published, its squashfs for pyxis/enroot "
                     "unless the registry has one" + (", signed" if signed else ""))
    return lines


class SquashfsWithoutPush(BadRequest):
    template = "--squashfs pushes each image's squashfs beside it: drop --no-push or --squashfs"


class StartWithoutEstargz(BadRequest):
    template = ("--start-command orders eStargz layers: give --compression estargz (or zstd:chunked) with it, "
                "or drop it")


def start_profile_command(asked: str | None, compression: Compression | None) -> tuple[str, ...] | None:
    """--start-command as the argv the profile runs: the torch start when not given; None for
    '' (no profile); refused (exit 2) without --compression estargz or zstd:chunked."""
    from ..estargz.profile import TORCH_START

    if asked is not None and (compression is None or compression.kind not in ORDERED):
        raise StartWithoutEstargz()
    if asked is None:
        return TORCH_START
    return tuple(shlex.split(asked)) or None


def run_and_report(plans: Sequence[tuple[str, Sequence[Step]]], *, engine: Engine, builder: Builder,
                   registry: Registry, options: RunOptions, multi: bool, merge: bool,
                   index_platforms: Mapping[str, Sequence[str]], ledger: Ledger,
                   events: EventPrinter, echo: Callable[[str], None]) -> None:
    """`publish`: publish_all() with a line per outcome and index on `events`, the summary on
    `echo`, each outcome kept in `ledger` (the --report, written as the run goes and however it
    ends: Ledger.kept); raises when any image failed, or any tag could not be made an index."""
    def on_event(phase: str, step: Step) -> None:
        ledger.began(phase, step)
        events.on_event(phase, step)

    try:
        for done in publish_all(plans, engine=engine, builder=builder, registry=registry, options=options,
                                multi=multi, merge=merge, index_platforms=index_platforms,
                                on_event=on_event, on_progress=events.on_progress):
            ledger.record(done)
            if isinstance(done, IndexOutcome):
                events.line(format_indexes([done]))
            else:
                events.line(f"{done.status} {done.step.image.ref}: {done.reason}")
    finally:
        events.close()
        if ledger.outcomes:
            echo(format_summary(ledger.outcomes, signing=options.signer is not None))
    ledger.write()
    raise_if_failed(ledger.outcomes, ledger.indexes)


def report_indexes(indexes: Sequence[IndexStep | IndexOutcome], ledger: Ledger, echo: Callable[[str], None]) -> None:
    """A publish that builds nothing (the dry run, --merge-only): the indexes it planned or
    wrote on `echo`, the --report, then a failure naming each tag left without an index."""
    if indexes:
        echo(format_indexes(indexes))
    ledger.indexes = list(indexes)
    ledger.write()
    raise_if_failed((), indexes)
