"""The `publish` command: what the CLI parsed (a PublishRequest) -> the checks, the plan, then its two endings, over
report.py's lines and ledger.py's --report: a run (publish_all() with a line per outcome and index,
the summary, the --report kept as the run goes and however it ends, the failure) and a publish that
builds nothing (the dry run, --merge-only)."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from ..build.per_platform import base_reader
from ..build.render_options import for_command
from ..engine.api import Builder, Engine
from ..engine.export import ORDERED, Compression
from ..errors import BadRequest
from ..matrix.model import Matrix
from ..registry.api import Registry
from ..scan import HttpMirror, OsStates, Scanning, cached
from .estargz import LEVELS, EstargzPublisher, asked_layers, pushed_as
from .layer_reuse import LayerStore
from .indexes import IndexOutcome, IndexStep
from .ledger import Ledger
from .plan import RunOptions, Step
from .planner import check_publish, plan_publish
from .report import EventPrinter, format_indexes, format_plan, format_summary, raise_if_failed
from .request import PublishRequest
from .run import publish_all

Echo = Callable[[str], None]
SCAN_BY_DEFAULT = Scanning()


def publish_command(matrix: Matrix, matrix_path: Path, request: PublishRequest, *, echo: Echo, note: Echo,
                    progress: Echo, scanning: Scanning = SCAN_BY_DEFAULT) -> None:
    """`imagebuilder publish` with what its options parsed: the request checked before any daemon or
    registry is asked, the plan printed on `echo`, then the run (or the indexes of a publish that
    builds nothing). `note` and `progress` write the lines of stderr. Each image holds the security
    fixes its OS published (its base read through the daemon, the suite's index through the
    security mirror, once per run), and `scanning` judges it after its verify and before its push."""
    from ..build.platforms import parse_platforms
    from ..engine.docker import DockerEngine
    from ..engine.export_decision import decide_export
    from ..engine.select import CLASSIC, decide, kind_before_probing, make_builder
    from ..registry.client import HttpRegistry
    from ..trust.signing import key_signer

    r = request
    compression = r.compression
    if r.squashfs and not r.push:  # it goes up beside the pushed image: with nothing pushed it would be dropped
        raise SquashfsWithoutPush()
    start = start_profile_command(r.start_command, compression)
    repository = r.target.repository(r.rendering.repository or matrix.defaults.repository)
    wanted = parse_platforms(r.platforms)
    # A wrong request is refused before any daemon or registry is asked (deciding the builder may probe one).
    known = CLASSIC.kind if r.merge_only else kind_before_probing(r.builder_choice)
    check_publish(matrix, r.selection, for_command(matrix, r.rendering, known, repository),
                  wanted, multi=r.multi, merge_only=r.merge_only, compression=compression)
    # The dry run is the run's plan: a key the run would refuse is refused here too (exit 2).
    signer = key_signer(r.sign_key, try_key=True) if r.sign_key is not None else None
    # From here the --report records what happens, also when an error or Ctrl-C ends the run.
    with Ledger(r.report, r.target.base, r.push, r.dry_run).kept() as ledger:
        # Decided once, alike for the dry run and the run: it decides the render, so the inputs hash.
        decision = CLASSIC if r.merge_only else decide(r.builder_choice, r.buildx_builder)
        engine = None if r.dry_run or r.merge_only else DockerEngine()
        if engine is not None:
            engine.ping()
        opts = for_command(matrix, r.rendering, decision.kind, repository, buildx=decision.buildx)
        registry = HttpRegistry(policy=r.registry_policy, ca_file=r.registry_ca)
        today = r.day if r.day is not None else datetime.now(timezone.utc).date()
        # One fetch of each index per run: the plan's fixes and every image's scan read the same.
        get = cached(HttpMirror(progress).get)
        # The dry run reads a --base-image as the run does where a daemon answers: the plan is the run's.
        files = engine if engine is not None or r.merge_only else base_reader(r.selection)
        if files is None and not r.merge_only:
            note("the dry run's inputs hashes leave out the security fixes the images would hold: the run reads "
                 "them from the base images (a dry run only from a --base-image, through a daemon)")
        plan = plan_publish(matrix, r.selection, opts, wanted, multi=r.multi,
                            read_os_release=engine.os_release if engine else None,
                            registry=registry, force=r.force, day=today, merge_only=r.merge_only, note=note,
                            signing=signer is not None,
                            dual=compression is not None and compression.also is not None,
                            read_os_state=OsStates(files, get, opts.security_mirror, progress)
                            if files is not None else None)
        ledger.planned = plan.planned
        for platform, steps in plan.steps:
            echo((f"{platform}:\n" if r.multi else "") + format_plan(steps, r.push))
        if engine is None:  # the dry run, or --merge-only: the indexes it plans, or writes
            if not r.merge_only:  # (which builds nothing, so compresses and flattens nothing)
                for line in asked_lines(compression, start, r.squashfs, signed=signer is not None):
                    echo(line)
            writes = r.merge_only and not r.dry_run
            merged = plan.indexes(registry, merge=r.merge_only or (r.merge and r.push),
                                  signer=signer if writes else None, write=writes)
            report_indexes(merged, ledger, echo=echo)
            return
        hook = None
        if r.squashfs:  # its tools are checked before anything is built
            from ..squashfs.make import require_tools
            from .squashfs import SquashfsPublisher, with_squashfs

            require_tools()
            hook = functools.partial(with_squashfs, SquashfsPublisher(registry, signer, say=progress))
        builder = make_builder(decision, engine)
        buildkit = decision.kind == "buildkit"
        # Compression.DEFAULT (zstd) where BuildKit exports into the containerd store; gzip by docker push elsewhere;
        # --compression estargz|zstd:chunked: the push writes them ordered by the image's start (estargz.py).
        exported = decide_export(compression, command="publish", buildkit=buildkit, cache=r.target,
                                 image_store=buildkit and engine.keeps_compressed_layers())
        ordered = exported.ordered
        estargz = None if ordered is None else EstargzPublisher(
            engine, registry, level=LEVELS[ordered.codec] if ordered.level is None else ordered.level,
            codec=ordered.codec, start=start, start_timeout=r.start_timeout, say=progress,
            reuse=None if r.no_cache else LayerStore())  # --no-cache: every layer written anew
        if not r.quiet:
            progress(f"builder: {builder.describe()}")
            progress(f"layers: {exported.describe()}")
            if estargz is not None:
                progress(pushed_as(estargz.codec, estargz.level, start))
        run_options = RunOptions(matrix_path=matrix_path, push=r.push, keep_going=r.keep_going,
                                 allow_no_gpu=r.allow_no_gpu, verify_timeout=r.verify_timeout, nocache=r.no_cache,
                                 pull=r.pull, export=exported.export, gzip_too=exported.gzip_too,
                                 cache_registry=r.target if exported.export else None,
                                 signer=signer, squashfs=hook, estargz=estargz,
                                 scan=scanning.gate(engine, get, opts.security_mirror, progress))
        run_and_report(plan.steps, engine=engine, builder=builder, registry=registry, options=run_options,
                       multi=r.multi, merge=r.merge, index_platforms=plan.index_platforms, ledger=ledger,
                       events=EventPrinter(sys.stderr, quiet=r.quiet), echo=echo)


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


class StartCommandUnreadable(BadRequest):
    template = "--start-command {command!r} does not read as a shell command ({detail}); quote it as sh would"


def start_profile_command(asked: str | None, compression: Compression | None) -> tuple[str, ...] | None:
    """--start-command as the argv the profile runs: the torch start when not given; None for
    '' (no profile); refused (exit 2) without --compression estargz or zstd:chunked."""
    from ..estargz.profile import TORCH_START

    if asked is not None and (compression is None or compression.kind not in ORDERED):
        raise StartWithoutEstargz()
    if asked is None:
        return TORCH_START
    try:
        return tuple(shlex.split(asked)) or None
    except ValueError as e:  # "No closing quotation", "No escaped character"
        raise StartCommandUnreadable(command=asked, detail=str(e).lower()) from e


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
