"""torch, CUDA, cuDNN, NCCL and Python versions against the manifest; a C++ compiler."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional

import torch

from ..context import Context
from ..expected import NOTHING_EXPECTED
from ..result import Result, failed, passed
from ..toolchain import CompilerProblem, find_cxx
from ..versions import (
    Release,
    decode_cudnn,
    decode_nccl,
    format_release,
    parse_release,
    release_matches,
    torch_matches,
)

NAME = "environment"


def measured_cudnn() -> Optional[Release]:
    try:
        code = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - a broken libcudnn raises here; report it as absent
        return None
    return None if code is None else decode_cudnn(int(code))


def measured_nccl() -> Optional[Release]:
    # CPU builds have torch.cuda.nccl but not the _nccl_version binding behind it.
    if torch.version.cuda is None or not torch.distributed.is_available():
        return None
    if not torch.distributed.is_nccl_available():
        return None
    try:
        return decode_nccl(torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a broken libnccl: report it as absent, as cuDNN
        return None


def check(ctx: Context) -> Result:
    expected = ctx.expected
    cudnn = measured_cudnn()
    nccl = measured_nccl()
    python = sys.version_info[:3]
    measurements: Dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": format_release(cudnn),
        "nccl": format_release(nccl),
        "python": format_release(python),
    }
    problems: List[str] = []

    if expected.torch is not None and not torch_matches(expected.torch, torch.__version__):
        problems.append(f"torch {torch.__version__} != expected {expected.torch}")

    if expected.cpu_build and torch.version.cuda is not None:
        problems.append(f"expected a CPU torch build, found CUDA {torch.version.cuda}")
    if expected.torch_cuda is not None:
        if torch.version.cuda is None:
            problems.append(f"torch is a CPU build (torch.version.cuda is None), expected CUDA {expected.torch_cuda}")
        elif not release_matches(parse_release(expected.torch_cuda), parse_release(torch.version.cuda)):
            problems.append(f"torch CUDA {torch.version.cuda} != expected {expected.torch_cuda}")

    # The manifest writes cuDNN's full version (9.1.0.70); torch only knows major.minor.patch.
    if expected.cudnn is not None:
        want = parse_release(expected.cudnn)[:3]
        if cudnn is None:
            problems.append(f"cuDNN not available, expected {expected.cudnn}")
        elif not release_matches(want, cudnn):
            problems.append(f"cuDNN {format_release(cudnn)} != expected {expected.cudnn}")

    if expected.nccl is not None:
        if nccl is None:
            problems.append(f"NCCL not available, expected {expected.nccl}")
        elif not release_matches(parse_release(expected.nccl), nccl):
            problems.append(f"NCCL {format_release(nccl)} != expected {expected.nccl}")

    if expected.python is not None and not release_matches(parse_release(expected.python), python):
        problems.append(f"Python {format_release(python)} != expected {expected.python}")

    # NVIDIA's CUDA base images set CUDA_VERSION (e.g. 12.1.1); other bases may not.
    image_cuda = os.environ.get("CUDA_VERSION") or None
    measurements["image_cuda"] = image_cuda
    if expected.image_cuda is not None and image_cuda is not None:
        if not release_matches(parse_release(expected.image_cuda), parse_release(image_cuda)):
            problems.append(f"image CUDA {image_cuda} (CUDA_VERSION) != expected {expected.image_cuda}")
    if expected.variant is not None:
        measurements["variant"] = expected.variant

    compiler = find_cxx()
    if isinstance(compiler, CompilerProblem):
        measurements["cxx"] = None
        problems.append(compiler.reason)
    else:
        measurements["cxx"] = compiler.path
        measurements["cxx_version"] = compiler.version

    if problems:
        return failed(NAME, "; ".join(problems), **measurements)
    checked = "no manifest expectations, measured only" if expected == NOTHING_EXPECTED else "as expected"
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return passed(NAME, f"torch {torch.__version__} ({cuda}), {checked}", **measurements)
