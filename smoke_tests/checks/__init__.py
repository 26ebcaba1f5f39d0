"""The registry: every check smoke_tests knows, in the order they run.

Adding a check is one module with `check(ctx: Context) -> Result` and one entry here; a
check of what one variant promises runs only in images of that variant (the manifest's).
This package imports torch; smoke_tests/__init__.py and report.py do not, so that a
host without torch can still read and print a JSON report.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

from ..context import Context
from ..result import Result
from . import cache, compile, cuda, cuda_graph, devel, environment, jupyter, nccl

Check = Callable[[Context], Result]

CHECKS: Tuple[Tuple[str, Check], ...] = (
    ("environment", environment.check),
    ("cuda", cuda.check),
    ("nccl", nccl.check),
    ("cache", cache.check),
    ("compile", compile.check),
    ("cuda_graph", cuda_graph.check),
    ("devel", devel.check),
    ("jupyter", jupyter.check),
)

CHECK_NAMES: Tuple[str, ...] = tuple(name for name, _ in CHECKS)

# check -> the variants whose promise it checks; the others run in every image.
VARIANT_CHECKS: Dict[str, Tuple[str, ...]] = {
    "devel": ("devel", "devel-jupyter"),
    "jupyter": ("jupyter", "devel-jupyter"),
}


def checks_for(variant: Optional[str]) -> Tuple[str, ...]:
    """The checks an image of this variant gets when none are named."""
    return tuple(name for name in CHECK_NAMES if name not in VARIANT_CHECKS or variant in VARIANT_CHECKS[name])
