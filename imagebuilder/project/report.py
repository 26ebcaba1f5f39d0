"""`project --report`: what the run did, kept as it goes and written however it ends.

As publish's ledger does: the document is written when the run is done, and also when an error
or Ctrl-C ends it, with `ok` false, the `phase` it ended in and `error` naming the failure (a proof
that failed lists what it found in `error_details`). A wrong request (exit 2: a bad project file,
a conflict with the base, a stale lock under --locked) writes nothing: it ends before any work and
leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_json
from ..errors import BadRequest, ImageBuilderError

# The report's `phase`: what the run was doing (where it ended, when it failed).
READ, RESOLVE, BUILD, PROVE, TAG, PUSH, SIGN, DONE = "read", "resolve", "build", "prove", "tag", "push", "sign", "done"


@dataclass
class ProjectReport:
    tag: str
    project: str
    base: str
    base_digest: str = ""
    lock: str = ""
    lock_reused: bool = False
    ok: bool = False
    phase: str = READ
    error: str | None = None
    """What ended the run before it was done (None: it did not fail)."""
    error_details: list[str] = field(default_factory=list)
    image_id: str = ""
    build_seconds: float = 0.0
    executed_steps: int = 0
    cached_steps: int = 0
    proof: list[str] = field(default_factory=list)
    rebased: str | None = None
    """--rebase: the image re-made on the base ("" when it was not sound and the image was rebuilt)."""
    pushed_digest: str | None = None
    uploaded_blobs: int | None = None
    uploaded: list[str] = field(default_factory=list)
    """The short ids (12 hex digits) of the blobs the push uploaded."""
    uploaded_bytes: int | None = None
    signed: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@contextmanager
def kept(report: ProjectReport, path: Path | None) -> Iterator[ProjectReport]:
    """The report written at `path` when the block ends: done (`ok`), failed or interrupted."""
    try:
        yield report
    except KeyboardInterrupt:
        _ended(report, path, "interrupted (Ctrl-C)", [])
        raise
    except Exception as e:
        if not (isinstance(e, ImageBuilderError) and e.exit_status == BadRequest.exit_code):
            details = e.details() if isinstance(e, ImageBuilderError) else []
            _ended(report, path, str(e).splitlines()[0] if str(e) else type(e).__name__, details)
        raise
    report.ok, report.phase = True, DONE
    if path is not None:
        write_json(path, report.to_json())


def _ended(report: ProjectReport, path: Path | None, error: str, details: list[str]) -> None:
    report.ok, report.error, report.error_details = False, error, [line.strip() for line in details]
    if path is not None:
        write_json(path, report.to_json())
