"""The `publish` command's two endings, over report.py's lines and documents: a run
(publish_all() with a line per outcome and index, the summary, the --report however the run
ends, the failure) and a publish that builds nothing (the dry run, --merge-only)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..atomic import write_json
from ..engine.api import Builder, Engine
from ..registry import Registry
from .indexes import IndexOutcome, IndexStep
from .plan import Outcome, RunOptions, Step
from .report import EventPrinter, format_indexes, format_summary, raise_if_failed, report_document
from .run import publish_all


def run_and_report(plans: Sequence[tuple[str, Sequence[Step]]], *, engine: Engine, builder: Builder,
                   registry: Registry, options: RunOptions, multi: bool, merge: bool,
                   index_platforms: Mapping[str, Sequence[str]], base: str, report: Path | None,
                   events: EventPrinter, echo: Callable[[str], None]) -> None:
    """`publish`: publish_all() with a line per outcome and index on `events`, the summary on
    `echo` and the --report written however the run ends; raises when any image failed, or
    any tag could not be made an index."""
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
    if indexes:
        echo(format_indexes(indexes))
    if report is not None:
        write_json(report, report_document(base, push, dry_run, planned, (), indexes))
    raise_if_failed((), indexes)
