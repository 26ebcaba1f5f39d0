"""`publish --report`: the document, and the Ledger that keeps it as the run goes.

The report records each image's last state, however the run ends: it is written (atomically,
atomic.write_json) after every image and index, and once more when the run ends, also when an
error or Ctrl-C ends it: the image in flight is then `interrupted` (or `failed`) in the phase it
was in, the ones after it `not run`, and `error` says what ended the run. Nothing is claimed
that did not happen: an image's `pushed` lists only the tags the registry confirmed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_json
from ..errors import BadRequest, ImageBuilderError
from .indexes import IndexOutcome, IndexStep
from .plan import CACHE, FAILED, INTERRUPTED, NOT_RUN, SKIPPED, Outcome, Step

# The report's `state`.
RUNNING, DONE, ENDED = "running", "done", "ended"


def report_document(registry: str, push: bool, dry_run: bool, planned: Sequence[Step],
                    outcomes: Sequence[Outcome], indexes: Sequence[IndexStep | IndexOutcome],
                    error: str | None = None, state: str = DONE) -> dict[str, Any]:
    """`publish --report`: what was planned, and what became of each image and index; of a dry
    run, the plan (`images` empty, `indexes` as planned, `ok` true). `error`: what ended the run
    before it was done; `state`: RUNNING (written part way), DONE, or ENDED (by `error`)."""
    unmerged = any(isinstance(i, IndexOutcome) and i.status in (SKIPPED, FAILED) for i in indexes)
    ok = error is None and state == DONE and (
        dry_run or (len(outcomes) == len(planned) and not any(o.failed for o in outcomes) and not unmerged))
    return {"ok": ok, "dry_run": dry_run, "registry": registry, "push": push, "state": state, "error": error,
            "images": [o.to_json() for o in outcomes],
            "indexes": [i.to_json() for i in indexes],
            "planned": [step.to_json() for step in planned]}


@dataclass
class Ledger:
    """What --report records, kept as the run goes (`path` None: no report, the ledger only counts)."""

    path: Path | None
    registry: str
    push: bool
    dry_run: bool = False
    planned: Sequence[Step] = ()
    outcomes: list[Outcome] = field(default_factory=list)
    indexes: list[IndexStep | IndexOutcome] = field(default_factory=list)
    current: tuple[Step, str] | None = None
    """The image in flight and its phase (build, verify, push, sign, retag)."""
    closed: bool = False
    """The last report is written (the run ended, done or not)."""

    def began(self, phase: str, step: Step) -> None:
        if phase != CACHE:  # (a heartbeat while the push waits for the cache export, not a phase)
            self.current = (step, phase)

    def record(self, done: Outcome | IndexOutcome) -> None:
        """One image or index finished: kept, and the report written as it stands now."""
        if isinstance(done, IndexOutcome):
            self.indexes.append(done)
        else:
            self.outcomes.append(done)
            self.current = None
        self.write(state=RUNNING)

    def write(self, error: str | None = None, state: str = DONE) -> None:
        self.closed = state != RUNNING
        if self.path is not None:
            write_json(self.path, report_document(self.registry, self.push, self.dry_run, self.planned,
                                                  self.outcomes, self.indexes, error, state))

    def ended(self, error: str, interrupted: bool) -> None:
        """The run ended before it was done: the image in flight and the rest say so, then the report."""
        finished = {id(o.step) for o in self.outcomes}
        for step in self.planned:
            if id(step) in finished:
                continue
            if self.current is not None and self.current[0] is step:
                status = INTERRUPTED if interrupted else FAILED
                self.outcomes.append(Outcome(step, status, f"{status} during {self.current[1]}: {error}"))
            else:
                self.outcomes.append(Outcome(step, NOT_RUN, f"not run: {error}"))
        self.current = None
        self.write(error, ENDED)

    @contextmanager
    def kept(self) -> Iterator[Ledger]:
        """The report written also when an error or Ctrl-C (SIGTERM: cli.main) ends the block; not
        for a wrong request (exit 2), which leaves nothing behind."""
        try:
            yield self
        except KeyboardInterrupt:
            if not self.closed:
                self.ended("interrupted (Ctrl-C)", interrupted=True)
            raise
        except Exception as e:
            wrong_request = isinstance(e, ImageBuilderError) and e.exit_status == BadRequest.exit_code
            if not self.closed and not wrong_request:
                self.ended(str(e).splitlines()[0] if str(e) else type(e).__name__, interrupted=False)
            raise
