"""The `publish` command's two endings, over report.py's lines and ledger.py's --report: a run
(publish_all() with a line per outcome and index, the summary, the --report kept as the run goes
and however it ends, the failure) and a publish that builds nothing (the dry run, --merge-only)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..engine.api import Builder, Engine
from ..registry import Registry
from .indexes import IndexOutcome, IndexStep
from .ledger import Ledger
from .plan import RunOptions, Step
from .report import EventPrinter, format_indexes, format_summary, raise_if_failed
from .run import publish_all


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
