"""Smoke tests that prove a PyTorch image works: versions, GPUs, NCCL, compile, CUDA Graphs.

Runs inside any image with torch (`python -m smoke_tests`) and imports nothing of
imagebuilder: standard library and torch only. Importing this package does not
import torch; running checks does.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Union

from .context import DEFAULT_TIMEOUT
from .expected import Expected, load_expected
from .result import FAIL, PASS, SKIP, Result

__all__ = ["Expected", "FAIL", "PASS", "Result", "SKIP", "load_expected", "run_checks"]


def run_checks(
    names: Optional[Sequence[str]] = None,
    expected: Union[Expected, Mapping[str, Any], None] = None,
    timeout: float = DEFAULT_TIMEOUT,
    require_gpu: bool = False,
) -> List[Result]:
    """Run the named checks (all by default); see smoke_tests.runner.run_checks."""
    from .runner import run_checks as run

    return run(names, expected, timeout, require_gpu)
