"""What every check is given."""

from __future__ import annotations

from dataclasses import dataclass

from .expected import NOTHING_EXPECTED, Expected

DEFAULT_TIMEOUT = 300.0


@dataclass(frozen=True)
class Context:
    expected: Expected = NOTHING_EXPECTED
    require_gpu: bool = False
    # Seconds one check may take; checks that start processes enforce it themselves.
    timeout: float = DEFAULT_TIMEOUT


def no_gpu_reason(torch_cuda: "str | None") -> str:
    """Why torch sees no GPU, phrased so that the fix is obvious."""
    if torch_cuda is None:
        return "no CUDA GPU visible: torch is a CPU build (torch.version.cuda is None)"
    return (
        f"no CUDA GPU visible: torch.cuda.is_available() is False with CUDA {torch_cuda} torch "
        "(no driver mounted or no device passed: docker run --gpus all?)"
    )
