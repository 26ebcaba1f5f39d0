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


ALLOW_NO_GPU_HINT = "; pass --allow-no-gpu to skip the GPU checks on purpose"


def no_gpu_reason(torch_cuda: "str | None", required: bool = False) -> str:
    """Why torch sees no GPU, phrased so that the fix is obvious."""
    if torch_cuda is None:
        reason = "no CUDA GPU visible: torch is a CPU build (torch.version.cuda is None)"
    else:
        reason = (
            f"no CUDA GPU visible: torch.cuda.is_available() is False with CUDA {torch_cuda} torch "
            "(no driver mounted or no device passed: docker run --gpus all?)"
        )
    return reason + ALLOW_NO_GPU_HINT if required else reason
