"""Reading wheel metadata: pins and markers from canned Requires-Dist, and the Python check on
canned index answers (fast; the same code against the real index is in test_drift.py)."""

from __future__ import annotations

import dataclasses

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imagebuilder import drift
from imagebuilder.index import WheelMetadata, applies, cuda_pins, pinned
from imagebuilder.matrix import load_matrix
from imagebuilder.resources import default_matrix_path

X86 = "platform_system == 'Linux' and platform_machine == 'x86_64'"
TORCH_251 = tuple(Requirement(r) for r in [
    f"nvidia-cuda-runtime-cu12==12.4.127; {X86}",
    f"nvidia-cudnn-cu12==9.1.0.70; {X86}",
    f"nvidia-nccl-cu12==2.21.5; {X86}",
    f"triton==3.1.0; {X86} and python_version < '3.13'",
    "sympy==1.13.1; python_version >= '3.9'",
])
TORCH_214 = tuple(Requirement(r) for r in [
    "cuda-toolkit[cublas,cudart,nvrtc]==13.0.3; platform_system == 'Linux'",
    "nvidia-cudnn-cu13==9.24.0.43; platform_system == 'Linux'",
    "nvidia-nccl-cu13==2.30.7; platform_system == 'Linux'",
    "triton~=3.8.0; platform_system == 'Linux'",
])
V = Version


@pytest.mark.parametrize("reqs,python,platform,expected", [
    (TORCH_251, V("3.12"), "linux/amd64", {"cuda": V("12.4.127"), "cudnn": V("9.1.0.70"), "nccl": V("2.21.5")}),
    # The x86_64 markers hold whatever machine reads them; an aarch64 host sees a CPU wheel.
    (TORCH_251, V("3.12"), "linux/arm64", {"cuda": None, "cudnn": None, "nccl": None}),
    (TORCH_214, V("3.14"), "linux/arm64", {"cuda": V("13.0.3"), "cudnn": V("9.24.0.43"), "nccl": V("2.30.7")}),
])
def test_cuda_pins_read_per_platform(reqs, python, platform, expected):
    assert cuda_pins(reqs, python, platform) == expected


@pytest.mark.parametrize("reqs,python,expected", [
    (TORCH_251, V("3.12"), V("3.1.0")),
    (TORCH_251, V("3.13"), None),  # torch 2.5.1 requires no triton on 3.13
    (TORCH_214, V("3.11"), V("3.8.0")),  # ~= is how newer releases pin it
])
def test_triton_pin_follows_the_python_marker(reqs, python, expected):
    assert pinned(reqs, "triton", python) == expected


def test_markers_see_the_target_not_this_host():
    req = Requirement("x; python_version >= '3.15' and platform_machine == 'aarch64'")
    assert applies(req, V("3.15"), "linux/arm64") and not applies(req, V("3.15")) and not applies(req, V("3.14"), "linux/arm64")


def test_python_check_reads_every_package_not_torch_alone(monkeypatch):
    """Canned index: torch 2.5.1 has a cp313 wheel, its companions do not."""
    wheels = {
        "torch": {V("3.12"): {V("2.5.1")}, V("3.13"): {V("2.5.1")}},
        "torchvision": {V("3.12"): {V("0.20.1")}, V("3.13"): {V("0.21.0")}},
        "torchaudio": {V("3.12"): {V("2.5.1")}, V("3.13"): set()},
        "triton": {V("3.12"): {V("3.1.0")}, V("3.13"): {V("3.2.0")}},
    }
    monkeypatch.setattr(drift, "versions_with_wheels", lambda project, python, platform="linux/amd64": wheels[project][python])
    monkeypatch.setattr(drift, "wheel_metadata", lambda project, version, python, platform="linux/amd64":
                        WheelMetadata(project, version, TORCH_251, SpecifierSet(">=3.9"), "torch-2.5.1-cp312-cp312-x.whl"))
    release = dataclasses.replace(load_matrix(default_matrix_path()).torches["2.5"], pythons=(V("3.12"), V("3.13")))
    assert drift.python_problems(release) == [
        "torch 2.5.1 lists Python 3.13, but there is no wheel of torchvision 0.20.1, torchaudio 2.5.1, "
        "triton (torch requires none on Python 3.13: no torch.compile on GPU) for it"
    ]
