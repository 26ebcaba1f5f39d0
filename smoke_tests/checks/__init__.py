"""The registry: every check smoke_tests knows, in the order they run.

Adding a check is one module with `check(ctx: Context) -> Result` and one entry here.
This package imports torch; smoke_tests/__init__.py and report.py do not, so that a
host without torch can still read and print a JSON report.
"""

from __future__ import annotations

from typing import Callable, Tuple

from ..context import Context
from ..result import Result
from . import compile, cuda, cuda_graph, environment, nccl

Check = Callable[[Context], Result]

CHECKS: Tuple[Tuple[str, Check], ...] = (
    ("environment", environment.check),
    ("cuda", cuda.check),
    ("nccl", nccl.check),
    ("compile", compile.check),
    ("cuda_graph", cuda_graph.check),
)

CHECK_NAMES: Tuple[str, ...] = tuple(name for name, _ in CHECKS)
