"""Reading the package index through pip: wheel metadata and which versions have wheels.

pip answers without installing anything: `install --dry-run --report` gives one wheel's
metadata (Requires-Dist, Requires-Python; where the index serves no separate metadata file pip
fetches the wheel into a temporary folder, about 0.5 GB for a CUDA torch), `index versions
--json` lists the versions that have a wheel for a Python, ABI and platform. So what we read is
exactly what pip would install. No pip configuration is read (constraints that cap torch,
extra local indexes): the index is pip's default or the one given, and a TLS-intercepting
proxy's CA comes from SSL_CERT_FILE.

`matrix check --online` (drift.py) and `matrix add` (matrix_add.py) both read through here.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .errors import ImageBuilderError

# The manylinux tags a glibc-2.35 host (ubuntu22.04, the oldest OS we build) accepts.
_GLIBC = range(17, 36)
PLATFORM_TAGS: dict[str, tuple[str, ...]] = {
    "linux/amd64": ("manylinux1_x86_64", "manylinux2014_x86_64", *(f"manylinux_2_{n}_x86_64" for n in _GLIBC)),
    "linux/arm64": ("manylinux2014_aarch64", *(f"manylinux_2_{n}_aarch64" for n in _GLIBC)),
}
MACHINE = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
TIMEOUT_S = 300


class IndexUnavailable(ImageBuilderError):
    template = "pip could not {action} from the index: {detail}"


@dataclass(frozen=True)
class WheelMetadata:
    project: str
    version: Version
    requires_dist: tuple[Requirement, ...]
    requires_python: SpecifierSet
    filename: str  # the wheel's file name: its tags are the evidence for Pythons and platforms


def _pip(args: list[str], index_url: str | None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", *args, "--isolated", "--disable-pip-version-check"]
    if index_url:
        cmd += ["--index-url", index_url]
    if os.environ.get("SSL_CERT_FILE"):
        cmd += ["--cert", os.environ["SSL_CERT_FILE"]]
    # --isolated skips the user's configuration but not the site's, where a constraint file may
    # cap torch (this project's own machines cap it at 2.14.1): metadata of newer releases must
    # still be readable, so no configuration file is read at all.
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as e:
        raise IndexUnavailable(action=" ".join(args[:2]), detail=f"no answer within {TIMEOUT_S} s") from e


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stderr.strip().splitlines() or ["(no output)"])[-1]


def _target(python: Version, platform: str, abi: str | None) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", str(python)]
    args += [arg for tag in PLATFORM_TAGS[platform] for arg in ("--platform", tag)]
    return args + (["--abi", abi] if abi else [])


@functools.lru_cache(maxsize=None)
def wheel_metadata(project: str, version: Version, python: Version, platform: str = "linux/amd64",
                   index_url: str | None = None) -> WheelMetadata:
    """The metadata of the wheel pip would install for this Python and platform."""
    with tempfile.TemporaryDirectory() as scratch:
        report = os.path.join(scratch, "report.json")
        done = _pip(["install", "--quiet", "--dry-run", "--no-deps", "--ignore-installed",
                     "--target", os.path.join(scratch, "t"), "--report", report,
                     *_target(python, platform, None), f"{project}=={version}"], index_url)
        if done.returncode != 0:
            raise IndexUnavailable(action=f"resolve {project}=={version}", detail=_last_line(done))
        with open(report) as f:
            install = json.load(f)["install"][0]
    metadata = install["metadata"]
    return WheelMetadata(
        project=project,
        version=Version(metadata["version"]),
        requires_dist=tuple(Requirement(r) for r in metadata.get("requires_dist", [])),
        requires_python=SpecifierSet(metadata.get("requires_python") or ""),
        filename=install["download_info"]["url"].rsplit("/", 1)[-1].split("#")[0],
    )


@functools.lru_cache(maxsize=None)
def versions_with_wheels(project: str, python: Version, platform: str = "linux/amd64", abi: str | None = None,
                         index_url: str | None = None) -> tuple[Version, ...]:
    """Final releases of `project` that have a wheel for this Python (and ABI) on this platform,
    newest first; empty when there is none."""
    done = _pip(["index", "versions", "--json", *_target(python, platform, abi), project], index_url)
    if done.returncode != 0:
        if "No matching distribution found" in done.stderr:
            return ()
        raise IndexUnavailable(action=f"list {project}", detail=_last_line(done))
    versions = []
    for text in json.loads(done.stdout)["versions"]:
        try:
            versions.append(Version(text))
        except InvalidVersion:
            continue  # pre-PEP 440 names of ancient releases
    return tuple(sorted(versions, reverse=True))


def marker_environment(python: Version, platform: str = "linux/amd64") -> dict[str, str]:
    """The environment Requires-Dist markers see on a Linux host of that Python and machine,
    whatever host we run on."""
    env: dict[str, str] = {key: str(value) for key, value in default_environment().items()}
    env.update(python_version=f"{python.major}.{python.minor}", python_full_version=f"{python.major}.{python.minor}.0",
               implementation_name="cpython", platform_python_implementation="CPython",
               sys_platform="linux", platform_system="Linux", os_name="posix",
               platform_machine=MACHINE[platform], extra="")
    return env


def applies(req: Requirement, python: Version, platform: str = "linux/amd64") -> bool:
    return req.marker is None or req.marker.evaluate(marker_environment(python, platform))


def pinned(reqs: tuple[Requirement, ...], name: str, python: Version, platform: str = "linux/amd64") -> Version | None:
    """The version a requirement on `name` pins (== or ~=) where it applies, else None."""
    for req in reqs:
        if req.name == name and applies(req, python, platform):
            for spec in req.specifier:
                # ~= is how newer releases pin triton ("~=3.8.0": the 3.8 series from 3.8.0).
                if spec.operator in ("==", "~="):
                    return Version(spec.version)
    return None


def cuda_pins(reqs: tuple[Requirement, ...], python: Version, platform: str = "linux/amd64") -> dict[str, Version | None]:
    """CUDA runtime, cuDNN and NCCL as a torch wheel's Requires-Dist pins them (all None for
    a CPU wheel). 2.11 and later pin the runtime through the cuda-toolkit meta-package."""
    def first(*names: str) -> Version | None:
        return next((v for n in names if (v := pinned(reqs, n, python, platform)) is not None), None)

    cuda = first("nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13",
                 "nvidia-cuda-runtime", "cuda-toolkit")
    major = f"cu{cuda.major}" if cuda else ""
    return {
        "cuda": cuda,
        "cudnn": first(f"nvidia-cudnn-{major}") if cuda else None,
        "nccl": first(f"nvidia-nccl-{major}") if cuda else None,
    }


def cuda_platforms(version: Version, python: Version) -> tuple[str, ...]:
    """The platforms whose torch wheel on the index is a CUDA build (it pins a CUDA runtime)."""
    return tuple(
        platform for platform in PLATFORM_TAGS
        if version in versions_with_wheels("torch", python, platform)
        and cuda_pins(wheel_metadata("torch", version, python, platform).requires_dist, python, platform)["cuda"]
    )
