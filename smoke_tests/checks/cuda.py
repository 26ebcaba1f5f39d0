"""GPUs visible, a driver new enough, kernels for every GPU's arch, a matmul that is right.

The per-GPU work runs in a child (smoke_tests.gpu_probe): this process keeps no CUDA
context that would lock the NCCL workers out of exclusive-process GPUs. judge() is pure.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping

import torch

from ..child import run_module
from ..context import Context, no_gpu_reason
from ..driver import EXCLUSIVE_PROCESS, DriverVerdict, judge_driver
from ..expected import Expected
from ..result import FAIL, Result, failed, passed, skipped

NAME = "cuda"

# TF32 (if a user enabled it) is ~1e-3 relative; a wrong kernel is off by O(1).
MATMUL_RTOL = 5e-3


def device_problem(device: Mapping[str, Any], probe: Mapping[str, Any]) -> "str | None":
    label = f"GPU {device['index']} {device['name']}"
    torch_cuda = probe.get("torch_cuda")
    if not device["covered"]:
        hint = " (Blackwell needs a torch built with CUDA 12.8 or newer)" if device["capability"][0] >= 10 else ""
        return (f"{label} is {device['arch']} but this torch (CUDA {torch_cuda}) has kernels only for "
                f"{', '.join(probe['arch_list'])}{hint}")
    if device["matmul_error"]:
        return f"{label}: a matmul on the GPU raised {device['matmul_error']}"
    error = device["matmul_rel_error"]
    if error is None:
        # Not run: only PTX covers this GPU and the driver is older than the PTX.
        return (f"{label} needs {device['via']} PTX JIT-compiled, but the driver supports CUDA "
                f"{probe.get('driver_cuda')} < {torch_cuda}, too old to JIT this PTX (minor-version "
                "compatibility does not cover PTX): upgrade the driver")
    if not error < MATMUL_RTOL:
        return f"{label}: matmul off by {error:.3g} relative to the CPU (limit {MATMUL_RTOL})"
    return None


def judge(probe: Mapping[str, Any], expected: Expected) -> Result:
    """The verdict on what gpu_probe found."""
    devices: List[Mapping[str, Any]] = probe["devices"]
    if not devices:
        return failed(NAME, "torch.cuda.is_available() is True here but the per-GPU probe saw no GPU "
                            f"({probe.get('devices_error') or 'device_count() is 0 in a child process'})")
    problems: List[str] = []
    notes: List[str] = []
    host = probe.get("driver")
    if expected.min_driver is not None and host is not None:
        try:
            verdict = judge_driver(host, expected.min_driver, expected.min_driver_compat, expected.image_cuda)
        except ValueError:
            verdict = DriverVerdict(FAIL, f"cannot compare driver {host!r} with the image's minimum "
                                          f"{expected.min_driver!r}: not a dotted number")
        if verdict.status == FAIL:
            problems.append(verdict.detail)
        elif verdict.minor_version_compat:
            notes.append(verdict.detail)
    problems += [problem for problem in (device_problem(device, probe) for device in devices) if problem]
    if probe.get("mig"):
        notes.append(f"GPU(s) {probe['mig']} are MIG slices")
    exclusive = [device["index"] for device in devices if device.get("compute_mode") == EXCLUSIVE_PROCESS]
    if exclusive:
        notes.append(f"GPU(s) {exclusive} in {EXCLUSIVE_PROCESS} compute mode (one process each)")

    measurements: Dict[str, Any] = {
        "gpu_count": len(devices),
        **{key: probe.get(key) for key in ("driver", "driver_source", "driver_cuda", "driver_cuda_source",
                                           "arch_list", "mig")},
        "devices": [dict(device) for device in devices],
    }
    if problems:
        return failed(NAME, "; ".join(problems), **measurements)
    names = ", ".join(sorted({d["name"] for d in devices}))
    summary = f"{len(devices)} GPU(s) ({names}), driver {host or 'unknown'}, matmul on each GPU matches the CPU"
    return passed(NAME, "; ".join([summary] + notes), **measurements)


def check(ctx: Context) -> Result:
    if not torch.cuda.is_available():
        reason = no_gpu_reason(torch.version.cuda, required=ctx.require_gpu)
        return failed(NAME, reason) if ctx.require_gpu else skipped(NAME, reason)
    done = run_module("smoke_tests.gpu_probe", [], ctx.timeout)
    if done.returncode is None:
        return failed(NAME, f"the per-GPU probe did not finish within {ctx.timeout:g}s (killed): a GPU hangs")
    line = done.result_line()
    if line is None:
        return failed(NAME, f"the per-GPU probe exited {done.returncode} without a result: {done.last_error_line()}")
    return judge(json.loads(line), ctx.expected)
