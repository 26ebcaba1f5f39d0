"""`matrix check --online`: compare matrix.yaml's pins with the index's own metadata.

For each release's PyPI build, pip resolves the wheel without downloading it (`--dry-run
--report`), and the Requires-Dist it reports is the primary source for cuDNN, NCCL, the
CUDA runtime and triton.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from packaging.requirements import Requirement
from packaging.version import Version

from .errors import ImageBuilderError
from .matrix import Matrix, TorchRelease

PLATFORMS = ["manylinux1_x86_64", "manylinux2014_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in range(17, 36)]


class IndexUnavailable(ImageBuilderError):
    template = "pip could not resolve {project}=={version} from the index: {detail}"


def wheel_requires(project: str, version: Version, python: Version) -> list[Requirement]:
    """Requires-Dist of the Linux x86_64 wheel the default index serves."""
    with tempfile.TemporaryDirectory() as scratch:
        report = os.path.join(scratch, "report.json")
        cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--dry-run", "--no-deps",
               "--ignore-installed", "--only-binary=:all:", "--python-version", str(python),
               "--target", os.path.join(scratch, "t"), "--report", report, f"{project}=={version}"]
        cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
        if os.environ.get("SSL_CERT_FILE"):
            cmd += ["--cert", os.environ["SSL_CERT_FILE"]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise IndexUnavailable(project=project, version=version, detail=last)
        with open(report) as f:
            install = json.load(f)["install"]
    return [Requirement(r) for r in install[0]["metadata"].get("requires_dist", [])]


def _pinned(reqs: list[Requirement], prefix: str) -> Version | None:
    for req in reqs:
        if req.name.startswith(prefix) and (req.marker is None or req.marker.evaluate({"extra": ""})):
            for spec in req.specifier:
                # ~= is how newer releases pin triton ("~=3.8.0": the 3.8 series from 3.8.0).
                if spec.operator in ("==", "~="):
                    return Version(spec.version)
    return None


def release_drift(release: TorchRelease) -> list[str]:
    variant = release.variant(release.pypi_variant)
    python = Version("3.11") if Version("3.11") in release.pythons else max(release.pythons)
    reqs = wheel_requires("torch", release.version, python)
    major = variant.cuda.major
    found = {
        "cudnn": _pinned(reqs, f"nvidia-cudnn-cu{major}"),
        "nccl": _pinned(reqs, f"nvidia-nccl-cu{major}"),
        "triton": _pinned(reqs, "triton"),
        # 2.11 and later pin the CUDA runtime through the cuda-toolkit meta-package.
        "cuda": _pinned(reqs, f"nvidia-cuda-runtime-cu{major}") or _pinned(reqs, "nvidia-cuda-runtime")
        or _pinned(reqs, "cuda-toolkit"),
    }
    expected = {"cudnn": variant.cudnn, "nccl": variant.nccl, "triton": release.triton, "cuda": variant.cuda}
    drifts = []
    for key, pin in found.items():
        want = expected[key]
        if key == "cuda" and pin is not None:
            pin = Version(f"{pin.major}.{pin.minor}")
        if pin != want:
            drifts.append(f"torch {release.version} ({variant.name}) {key}: matrix.yaml has {want}, the index's wheel pins {pin}")
    return drifts


def check_drift(matrix: Matrix, progress: Callable[[str], None] = lambda _: None) -> list[str]:
    drifts: list[str] = []
    for release in matrix.torches.values():
        progress(f"checking torch {release.version} against the index ...")
        drifts += release_drift(release)
    return drifts
