"""GPUs visible, a driver new enough, kernels for every GPU's arch, a matmul that is right."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..archs import Capability, coverage, sm_name
from ..context import Context, no_gpu_reason
from ..result import Result, failed, passed, skipped
from ..versions import parse_release

NAME = "cuda"

# TF32 (if a user enabled it) is ~1e-3 relative; a wrong kernel is off by O(1).
MATMUL_RTOL = 5e-3
MATMUL_SIZE = 512


def driver_version() -> Tuple[Optional[str], str]:
    """(display driver version such as '550.54.15', where it came from)."""
    # Newer torch may grow a public accessor; older ones never had one.
    getter = getattr(torch.cuda, "driver_version", None)
    if callable(getter):
        try:
            value = getter()
            if value:
                return str(value), "torch.cuda.driver_version"
        except Exception:
            pass
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            value = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return (value.decode() if isinstance(value, bytes) else str(value)), "pynvml"
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=False,
            )
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                return lines[0].strip(), "nvidia-smi"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None, "unknown"


def driver_cuda_version() -> Optional[str]:
    """Highest CUDA version the driver supports (12040 -> '12.4'), from the CUDA driver API."""
    getter = getattr(torch._C, "_cuda_getDriverVersion", None)
    if getter is None:
        return None
    try:
        code = int(getter())
    except Exception:
        return None
    return f"{code // 1000}.{code % 1000 // 10}" if code else None


def matmul_error(device: int) -> float:
    """max |gpu - reference| / max |reference| for a float32 matmul, reference in float64 on CPU."""
    generator = torch.Generator().manual_seed(device)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator)
    on_gpu = (a.to(f"cuda:{device}") @ b.to(f"cuda:{device}")).cpu().double()
    reference = a.double() @ b.double()
    return float((on_gpu - reference).abs().max() / reference.abs().max())


def check(ctx: Context) -> Result:
    if not torch.cuda.is_available():
        reason = no_gpu_reason(torch.version.cuda)
        return failed(NAME, reason) if ctx.require_gpu else skipped(NAME, reason)

    count = torch.cuda.device_count()
    arch_list = list(torch.cuda.get_arch_list())
    driver, driver_source = driver_version()
    driver_cuda = driver_cuda_version()
    problems: List[str] = []
    devices: List[Dict[str, Any]] = []

    if ctx.expected.min_driver is not None and driver is not None:
        if parse_release(driver) < parse_release(ctx.expected.min_driver):
            problems.append(
                f"driver {driver} is older than {ctx.expected.min_driver}, the minimum for this image's CUDA"
            )

    for index in range(count):
        capability: Capability = tuple(torch.cuda.get_device_capability(index))  # type: ignore[assignment]
        name = torch.cuda.get_device_name(index)
        covered = coverage(capability, arch_list)
        devices.append({"index": index, "name": name, "arch": sm_name(capability), "kernels": covered.describe(capability)})
        if not covered.covered:
            hint = " (Blackwell needs a torch built with CUDA 12.8 or newer)" if capability[0] >= 10 else ""
            problems.append(
                f"GPU {index} {name} is {sm_name(capability)} but this torch (CUDA {torch.version.cuda}) "
                f"has kernels only for {', '.join(arch_list)}{hint}"
            )
            continue  # running a kernel would only raise "no kernel image is available"
        if covered.jit and driver_cuda is not None and torch.version.cuda is not None:
            # PTX built by a newer toolkit than the driver knows cannot be JIT-compiled.
            if parse_release(driver_cuda) < parse_release(torch.version.cuda):
                problems.append(
                    f"GPU {index} {name} needs {covered.via} PTX JIT-compiled, but the driver supports "
                    f"CUDA {driver_cuda} < {torch.version.cuda}, too old to JIT this PTX"
                )
                continue
        error = matmul_error(index)
        devices[-1]["matmul_rel_error"] = error
        if not error < MATMUL_RTOL:
            problems.append(f"GPU {index} {name}: matmul off by {error:.3g} relative to the CPU (limit {MATMUL_RTOL})")

    measurements: Dict[str, Any] = {
        "gpu_count": count,
        "driver": driver,
        "driver_source": driver_source,
        "driver_cuda": driver_cuda,
        "arch_list": arch_list,
        "devices": devices,
    }
    if problems:
        return failed(NAME, "; ".join(problems), **measurements)
    names = ", ".join(sorted({d["name"] for d in devices}))
    return passed(NAME, f"{count} GPU(s) ({names}), driver {driver or 'unknown'}, matmul matches the CPU", **measurements)
