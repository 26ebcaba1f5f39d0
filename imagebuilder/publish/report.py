"""For people and for --report: the plan, a line per phase and outcome, the summary, the
report document, and the one failure that names every image (or index) that did not make it.
command.py drives the command's run with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..engine.api import Progress
from ..engine.progress import ProgressPrinter, human_size
from ..errors import ImageBuilderError
from ..build.table import format_table
from ..registry.reference import parse_reference
from .estargz import reuse_summary
from .indexes import WRITE, IndexOutcome, IndexStep, MergeIncomplete
from .plan import BUILD, CACHE, FAILED, RETAG, SKIP, SKIPPED, Outcome, Step, short


class PublishFailed(ImageBuilderError):
    def describe(self) -> str:
        failures = self.fields["failures"]
        what = "; ".join(f"{ref}: {reason}" for ref, reason in failures)
        return (f"{len(failures)} of {self.fields['total']} images failed: {what}; the images the summary "
                "shows as pushed are in the registry, rerun after fixing the rest (published images are skipped)")



# --------------------------------------------------------------------------- presenting


class EventPrinter:
    """A line per phase of each image on `stream`, and a build's progress while it builds."""

    def __init__(self, stream: Any, quiet: bool = False) -> None:
        self.stream, self.quiet = stream, quiet
        self._printer: ProgressPrinter | None = None

    def on_event(self, phase: str, step: Step) -> None:
        self.close()
        if phase == CACHE:
            self.line(f"  {step.image.ref}: waiting for its registry cache's export (the push mounts its layers from there)")
            return
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
            lines.append(f"  {step.image.tags[0]}: " + (f"point {tags} at {short(step.digest or '')}" if push
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
            status = {WRITE: "would write", SKIP: "would skip", FAILED: "would fail"}.get(item.action, item.action)
        if status in (SKIPPED, FAILED, "would skip", "would fail"):
            lines.append(f"index {step.ref}: {status}: {reason}")
        else:
            over = f"over {', '.join(c.platform for c in step.children)}"
            details = (reason,) if isinstance(item, IndexStep) and item.action == WRITE else ()
            lines.append(f"index {step.ref}: " + " ".join(part for part in (status, digest, over, *details) if part))
    return "\n".join(lines)


def format_summary(outcomes: Sequence[Outcome], signing: bool = False) -> str:
    """A row per image, then a line per published image: its layers new to the registry and
    those the registry had already (blobs.Layers.summary); with --compression estargz|zstd:chunked,
    the ordered layers written and those reused from an earlier publish (estargz.reuse_summary)."""
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
    layers = [f"{o.step.image.tags[0]} layers: {o.layers.summary()}" for o in outcomes if o.layers is not None]
    ordered = [f"{o.step.image.tags[0]} {reuse_summary(o.estargz)}" for o in outcomes
               if o.estargz is not None and o.estargz.get("format") and "written_layers" in o.estargz]
    squashfs = [f"{o.step.image.tags[0]} squashfs: {human_size(o.squashfs['size'])} "
                f"{'pushed' if o.squashfs['created'] else 'already published'} ({o.squashfs['artifact']})"
                for o in outcomes if o.squashfs is not None]
    return "\n".join((format_table(headers, rows), *layers, *ordered, *squashfs))


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

