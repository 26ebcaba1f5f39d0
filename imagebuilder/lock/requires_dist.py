"""Pure: a wheel's Requires-Dist read as a Linux host of a Python and platform reads it: which
requirements apply (markers), what they pin, and the CUDA runtime, cuDNN and NCCL a torch wheel pins."""

from __future__ import annotations

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import Version

from ..platforms import DEFAULT_PLATFORM, PLATFORMS


def marker_environment(python: Version, platform: str = DEFAULT_PLATFORM) -> dict[str, str]:
    """The environment Requires-Dist markers see on a Linux host of that Python and machine,
    whatever host we run on."""
    env: dict[str, str] = {key: str(value) for key, value in default_environment().items()}
    env.update(python_version=f"{python.major}.{python.minor}", python_full_version=f"{python.major}.{python.minor}.0",
               implementation_name="cpython", platform_python_implementation="CPython",
               sys_platform="linux", platform_system="Linux", os_name="posix",
               platform_machine=PLATFORMS[platform].machine, extra="")
    return env


def applies(req: Requirement, python: Version, platform: str = DEFAULT_PLATFORM) -> bool:
    return req.marker is None or req.marker.evaluate(marker_environment(python, platform))


def pinned(reqs: tuple[Requirement, ...], name: str, python: Version, platform: str = DEFAULT_PLATFORM) -> Version | None:
    """The version a requirement on `name` pins (== or ~=) where it applies, else None."""
    for req in reqs:
        if req.name == name and applies(req, python, platform):
            for spec in req.specifier:
                # ~= is how newer releases pin triton ("~=3.8.0": the 3.8 series from 3.8.0).
                if spec.operator in ("==", "~="):
                    return Version(spec.version)
    return None


CUDA_RUNTIME_PACKAGES = ("nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13",
                         "nvidia-cuda-runtime", "cuda-toolkit")
"""The packages through which a torch wheel pins its CUDA runtime, first match wins: 2.11 and later
pin it through the cuda-toolkit meta-package."""


def cuda_pins(reqs: tuple[Requirement, ...], python: Version, platform: str = DEFAULT_PLATFORM) -> dict[str, Version | None]:
    """CUDA runtime, cuDNN and NCCL as a torch wheel's Requires-Dist pins them (all None for
    a CPU wheel). 2.11 and later pin the runtime through the cuda-toolkit meta-package."""
    def first(*names: str) -> Version | None:
        return next((v for n in names if (v := pinned(reqs, n, python, platform)) is not None), None)

    cuda = first(*CUDA_RUNTIME_PACKAGES)
    major = f"cu{cuda.major}" if cuda else ""
    return {
        "cuda": cuda,
        "cudnn": first(f"nvidia-cudnn-{major}") if cuda else None,
        "nccl": first(f"nvidia-nccl-{major}") if cuda else None,
    }
