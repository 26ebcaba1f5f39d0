"""What a devel image promises: nvcc of the image's CUDA, CUDA_HOME, and a CUDA extension
that compiles and links against torch (no GPU needed)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..archs import parse_entry
from ..context import Context
from ..result import Result, failed, passed
from ..versions import Release, format_release, parse_release, release_matches

NAME = "devel"

BUILT = "SMOKE_TESTS_EXTENSION_BUILT"
# The smallest extension that needs nvcc, the C++ compiler, torch's headers and its CUDA
# libraries at link and load time: what a user's custom kernel needs.
EXTENSION = r'''
from torch.utils.cpp_extension import load_inline

CUDA = """
__global__ void add_one_kernel(float* x, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
torch::Tensor add_one(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "a float CUDA tensor");
    long n = x.numel();
    add_one_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), n);
    return x;
}
"""
module = load_inline(name="smoke_tests_devel", cpp_sources="torch::Tensor add_one(torch::Tensor x);",
                     cuda_sources=CUDA, functions=["add_one"])
print("%s", callable(module.add_one))
''' % BUILT

_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")
# gcc's and nvcc's "error:" lines; not Python's "OSError" in a traceback's source lines.
_COMPILER_ERROR = re.compile(r"\berror\b")


def nvcc_release(version_output: str) -> Optional[Release]:
    """`nvcc --version` -> (major, minor): "Cuda compilation tools, release 13.0, V13.0.88"."""
    match = _NVCC_RELEASE.search(version_output)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


# Built by CUDA 11.0 through 13: the arch when torch names none (it names none without a GPU
# only in builds too old to expose their arch flags).
FALLBACK_ARCH = "8.0"


def build_arch(arch_flags: Optional[str], device: Optional[Tuple[int, int]]) -> str:
    """TORCH_CUDA_ARCH_LIST for the build: the GPU's own, else torch's oldest cubin arch, which
    the image's nvcc (same CUDA major as torch) still supports. One arch keeps it short."""
    if device is not None:
        return f"{device[0]}.{device[1]}"
    entries = (parse_entry(flag) for flag in (arch_flags or "").split())
    cubins = sorted(e.capability for e in entries if e is not None and e.kind == "sm")
    return f"{cubins[0][0]}.{cubins[0][1]}" if cubins else FALLBACK_ARCH


def torch_arch_flags() -> Optional[str]:
    # torch.cuda.get_arch_list() is empty without a GPU; the build's flags are there anyway.
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    return flags() if flags is not None else None


def _toolkit(expected_cuda: Optional[str]) -> "Tuple[Dict[str, Any], List[str], Optional[str]]":
    """(measurements, problems, nvcc path) for nvcc and CUDA_HOME."""
    measurements: Dict[str, Any] = {}
    problems: List[str] = []
    cuda_home = os.environ.get("CUDA_HOME") or None
    measurements["cuda_home"] = cuda_home
    if cuda_home is None:
        problems.append("CUDA_HOME is not set: builds (torch.utils.cpp_extension, setup.py) must guess "
                        "where the CUDA toolkit is")
        nvcc = shutil.which("nvcc")
    else:
        nvcc = os.path.join(cuda_home, "bin", "nvcc")
        if not os.access(nvcc, os.X_OK):
            problems.append(f"CUDA_HOME={cuda_home} has no bin/nvcc")
            nvcc = None
    if nvcc is None:
        problems.append("no nvcc: a devel image must compile CUDA code")
        return measurements, problems, None
    try:
        done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        problems.append(f"{nvcc} --version does not run: {e}")
        return measurements, problems, None
    release = nvcc_release(done.stdout)
    measurements["nvcc"] = format_release(release)
    if release is None:
        problems.append(f"{nvcc} --version names no release: {' '.join(done.stdout.split())[:200]}")
    elif expected_cuda is not None and not release_matches(parse_release(expected_cuda)[:2], release):
        problems.append(f"nvcc {format_release(release)} != the image's CUDA {expected_cuda}")
    return measurements, problems, nvcc


def compile_extension(nvcc: str, arch: str, timeout: float) -> "Tuple[Optional[str], float]":
    """Build EXTENSION in a scratch directory under `timeout`; (why it failed or None, seconds).

    A process group, so that nvcc and the compilers it starts die with it at the deadline.
    """
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="smoke_tests_devel_") as scratch:
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=scratch, TORCH_CUDA_ARCH_LIST=arch)
        env["PATH"] = os.pathsep.join([os.path.dirname(nvcc), env.get("PATH", "")])
        process = subprocess.Popen([sys.executable, "-c", EXTENSION], cwd=scratch, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return f"building the extension did not finish within {timeout:g}s", time.monotonic() - started
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    seconds = time.monotonic() - started
    if process.returncode == 0 and f"{BUILT} True" in output:
        return None, seconds
    # The compiler's first error says what is missing; the last line is the Python exception.
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if _COMPILER_ERROR.search(line)]
    said = " | ".join(dict.fromkeys(errors[:1] + lines[-1:])) or f"exit code {process.returncode}"
    return f"a CUDA extension did not build: {said[:400]}", seconds


def check(ctx: Context) -> Result:
    if torch.version.cuda is None:
        return failed(NAME, "torch is a CPU build (torch.version.cuda is None): a devel image builds CUDA code")
    expected_cuda = ctx.expected.image_cuda or torch.version.cuda
    measurements, problems, nvcc = _toolkit(expected_cuda)
    measurements["expected_cuda"] = expected_cuda
    device = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
    arch = build_arch(torch_arch_flags(), device)
    measurements["arch"] = arch
    if nvcc is not None:
        why, seconds = compile_extension(nvcc, arch, ctx.timeout)
        measurements["build_s"] = round(seconds, 1)
        if why is not None:
            problems.append(why)
    if problems:
        return failed(NAME, "; ".join(problems), **measurements)
    return passed(NAME, f"nvcc {measurements['nvcc']} at CUDA_HOME={measurements['cuda_home']} built and "
                        f"loaded a CUDA extension for sm_{arch.replace('.', '')} in {measurements['build_s']}s",
                  **measurements)
