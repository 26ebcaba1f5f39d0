"""Pure: the smoke tests' JSON report out of whatever else the process printed, or why
there is none (a timeout, a crash, a missing torch).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from smoke_tests.result import Result

TAIL_LINES = 40

# --------------------------------------------------------------------------- smoke test output


@dataclass(frozen=True)
class SmokeOutput:
    """What one smoke-test process left: its report, or why there is none."""

    checks: tuple[Result, ...]
    torch: str | None = None
    gpu_count: int | None = None
    error: str | None = None


# Recognisable ways the run dies before printing its report, and what to say.
_DEATHS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"No module named smoke_tests|No module named 'smoke_tests'"),
     "the image has no smoke_tests package although it carries imagebuilder's labels; verify it "
     "with this imagebuilder's smoke tests (--mount-smoke-tests)"),
    (re.compile(r"No module named 'torch'"),
     "torch is not importable in {python}; {fix}"),
    (re.compile(r"executable file not found|python3: not found|No such file or directory.*python3"),
     "the image has no python3 on its PATH"),
)
_EXIT_MEANINGS = {137: "killed (out of memory?)", 139: "segmentation fault", 134: "aborted"}


IN_IMAGE = ("the image's Python", "install torch into the Python on its PATH")


def in_local(python: str) -> tuple[str, str]:
    return (f"{python} (the Python `verify --local` checks)",
            "install torch into it, or run verify --local with the Python that has torch "
            "(`/path/to/python -m imagebuilder verify --local`)")


def parse_output(output: str, exit_code: int | None, *, timed_out: bool = False,
                 timeout: float | None = None, python: tuple[str, str] = IN_IMAGE) -> SmokeOutput:
    """The smoke tests' JSON report from everything the process printed (warnings included).

    The last JSON object with a "checks" list wins: a report is printed last, and library
    warnings on the same stream must not break the parse.
    """
    if timed_out:
        return SmokeOutput((), error=f"the smoke tests did not finish within {timeout:g}s and were "
                                     "killed; raise --timeout or look at the output below")
    document = _last_report(output)
    if document is None:
        for pattern, meaning in _DEATHS:
            if pattern.search(output):
                return SmokeOutput((), error=meaning.format(python=python[0], fix=python[1]))
        how = _EXIT_MEANINGS.get(exit_code or 0, "")
        return SmokeOutput((), error=f"the smoke tests exited with code {exit_code}"
                                     f"{f' ({how})' if how else ''} without a report; see the output below")
    try:
        checks = tuple(Result.from_dict(check) for check in document["checks"])
    except (KeyError, TypeError, ValueError) as e:
        return SmokeOutput((), error=f"the smoke tests' report is malformed: {e}")
    gpu_count = document.get("gpu_count")
    result = SmokeOutput(checks, torch=document.get("torch"),
                         gpu_count=gpu_count if isinstance(gpu_count, int) else None)
    if exit_code not in (0, None) and not any(check.failed for check in checks):
        return SmokeOutput(checks, result.torch, result.gpu_count,
                           error=f"the smoke tests exited with code {exit_code} although no check failed")
    return result


def _last_report(output: str) -> dict[str, Any] | None:
    """The last report in `output`; else the last one once every line that cannot be part of
    an indented JSON document is left out: Docker copies a container's stdout and stderr line by
    line, each stream on its own, so a line of stderr (a check's progress line, a warning) can
    land inside the report's lines (seen once over ssh://)."""
    found = _last_document(output)
    if found is None:
        found = _last_document("\n".join(line for line in output.splitlines() if _JSON_LINE.match(line)))
    return found


# A line of `json.dumps(..., indent=2)`: indentation, then a brace, bracket, string, number or literal.
_JSON_LINE = re.compile(r'^\s*(?:[{}\[\]"\d-]|true|false|null)')


def _last_document(output: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    starts = [m.start(1) for m in re.finditer(r"(?m)^[ \t]*(\{)", output)]
    for start in reversed(starts):
        try:
            document, _ = decoder.raw_decode(output, start)
        except ValueError:
            continue
        if isinstance(document, dict) and isinstance(document.get("checks"), list):
            return document
    return None


def tail(output: str, lines: int = TAIL_LINES) -> tuple[str, ...]:
    return tuple(output.rstrip("\n").splitlines()[-lines:]) if output.strip() else ()


