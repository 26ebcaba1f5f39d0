"""Run checks, each under a deadline, turning anything they raise into a fail."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

from .checks import CHECK_NAMES, CHECKS, Check, checks_for
from .context import DEFAULT_TIMEOUT, Context
from .expected import NOTHING_EXPECTED, Expected
from .result import Result, failed

# Checks that start processes (nccl) kill them at ctx.timeout themselves; the
# thread deadline sits a little later so that their own, better reason wins.
GRACE_S = 10.0


class UnknownCheck(ValueError):
    def __init__(self, unknown: Sequence[str]) -> None:
        super().__init__(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECK_NAMES)}")
        self.unknown = list(unknown)


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def run_one(name: str, check: Check, ctx: Context) -> Result:
    """Run check in a daemon thread; past the deadline report a fail and leave it behind.

    A thread cannot be killed, but a stuck CUDA call or compile must not stop the
    report: the process exits after reporting and the thread goes with it.
    """
    outcome: List[Result] = []

    def target() -> None:
        try:
            outcome.append(check(ctx))
        except BaseException as e:  # noqa: BLE001 - every failure becomes a result
            outcome.append(failed(name, one_line(e)))

    start = time.perf_counter()
    thread = threading.Thread(target=target, name=f"smoke_tests.{name}", daemon=True)
    thread.start()
    thread.join(ctx.timeout + GRACE_S)
    elapsed = round(time.perf_counter() - start, 2)
    if not outcome:
        return failed(name, f"did not finish within {ctx.timeout:g}s (abandoned)", seconds=elapsed)
    result = outcome[0]
    return Result(result.name, result.status, result.reason, {**result.measurements, "seconds": elapsed})


def as_expected(expected: Union[Expected, Mapping[str, Any], None]) -> Expected:
    if expected is None:
        return NOTHING_EXPECTED
    if isinstance(expected, Expected):
        return expected
    return Expected.from_manifest(expected)


def built_for_cuda(expected: Expected, torch_cuda: Optional[str]) -> bool:
    """The manifest says CUDA, or (without one) the torch here is a CUDA build."""
    return expected.torch_cuda is not None or (not expected.cpu_build and torch_cuda is not None)


def gpu_required(expected: Expected) -> bool:
    """Without a flag, an image built for CUDA needs a GPU: green without one would lie."""
    import torch

    return built_for_cuda(expected, torch.version.cuda)


def run_checks(
    names: Optional[Sequence[str]] = None,
    expected: Union[Expected, Mapping[str, Any], None] = None,
    timeout: float = DEFAULT_TIMEOUT,
    require_gpu: bool = False,
    on_result: Optional[Callable[[Result], None]] = None,
) -> List[Result]:
    """Run the named checks (by default those for the expected variant) in registry order.

    expected is an Expected or the manifest's dict; None means no expectations. on_result is
    told each result as its check ends (verify prints a line per check while the rest run).
    """
    ctx = Context(expected=as_expected(expected), require_gpu=require_gpu, timeout=timeout)
    wanted = list(checks_for(ctx.expected.variant) if names is None else names)
    unknown = [name for name in wanted if name not in CHECK_NAMES]
    if unknown:
        raise UnknownCheck(unknown)
    results = []
    for name, check in CHECKS:
        if name in wanted:
            results.append(run_one(name, check, ctx))
            if on_result is not None:
                on_result(results[-1])
    return results
