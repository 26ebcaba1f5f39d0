"""Results as JSON (for imagebuilder) or as a table (for people). No torch needed."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

from .result import FAIL, PASS, SKIP, Result

# The measurements worth a glance in the table; the JSON carries all of them.
HEADLINE = (
    "torch", "torch_cuda", "cudnn", "nccl", "cxx",
    "gpu_count", "driver",
    "backend", "world_size", "bytes", "algbw_GBps", "busbw_GBps",
    "device", "compile_s", "graphs", "kernels",
    "max_abs_diff", "seconds",
)


# With --json, a line on stderr per check as it ends (the report comes on stdout at the end):
# verify shows each while the others run. Lines without the prefix are anything else printed.
PROGRESS_PREFIX = "smoke_tests: done: "


def progress_line(result: Result) -> str:
    return PROGRESS_PREFIX + json.dumps(result.to_dict(), sort_keys=True)


def read_progress(line: str) -> Optional[Result]:
    """The result a progress line carries; None for any other line (or a broken one)."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        return Result.from_dict(json.loads(line[len(PROGRESS_PREFIX):]))
    except (ValueError, TypeError, KeyError):
        return None


def check_line(result: Result, name_width: int = 0) -> str:
    """One check as a line of the table."""
    return f"{result.name:<{name_width}}  {result.status.upper():<6}  {result.reason}"


def ok(results: Sequence[Result]) -> bool:
    return not any(result.failed for result in results)


def _host_facts() -> Dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch": None, "gpu_count": 0}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"torch": torch.__version__, "gpu_count": gpus}


def to_document(
    results: Sequence[Result], torch_version: Optional[str] = None, gpu_count: Optional[int] = None
) -> Dict[str, Any]:
    facts = _host_facts() if torch_version is None or gpu_count is None else {}
    return {
        "ok": ok(results),
        "torch": torch_version if torch_version is not None else facts["torch"],
        "gpu_count": gpu_count if gpu_count is not None else facts["gpu_count"],
        "checks": [result.to_dict() for result in results],
    }


def to_json(
    results: Sequence[Result], torch_version: Optional[str] = None, gpu_count: Optional[int] = None
) -> str:
    return json.dumps(to_document(results, torch_version, gpu_count), indent=2)


def from_json(text: str) -> List[Result]:
    """The results back from a to_json document, e.g. one printed inside a container."""
    return [Result.from_dict(check) for check in json.loads(text)["checks"]]


def _headline(result: Result) -> str:
    return " ".join(
        f"{key}={result.measurements[key]}" for key in HEADLINE if key in result.measurements
    )


def format_table(results: Sequence[Result]) -> str:
    name_width = max([len("CHECK")] + [len(r.name) for r in results])
    lines = [f"{'CHECK':<{name_width}}  STATUS  REASON"]
    for result in results:
        lines.append(check_line(result, name_width))
        headline = _headline(result)
        if headline:
            lines.append(f"{'':<{name_width}}  {'':<6}  {headline}")
    lines.append(f"{'OK' if ok(results) else 'FAILED'}: {summary(results)}")
    return "\n".join(lines)


def summary(results: Sequence[Result]) -> str:
    """'3 passed, 2 skipped': a skip is not a pass, so it is never folded into one."""
    counts = [(sum(r.status == status for r in results), word)
              for status, word in ((FAIL, "failed"), (PASS, "passed"), (SKIP, "skipped"))]
    parts = [f"{count} {word}" for count, word in counts if count]
    return ", ".join(parts) if parts else "no check ran"
