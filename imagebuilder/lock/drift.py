"""`matrix check --online`: compare matrix.yaml with the index's own metadata.

Three questions, each answered from the metadata of the wheels pip would install, read off
the index without downloading them (index.py):
- pins: the Requires-Dist of each release's PyPI build is the primary source for cuDNN, NCCL,
  the CUDA runtime and triton;
- Pythons: every Python a release lists needs wheels of all its packages (torch, torchvision,
  torchaudio, and the triton torch requires there), not torch's alone: a torch wheel without
  torchvision or triton makes an image without torchvision or a working torch.compile;
- releases: torch releases the index has that the matrix lacks (`matrix add` writes them).
"""

from __future__ import annotations

from collections.abc import Callable

from packaging.requirements import Requirement
from packaging.version import Version

from ..errors import ImageBuilderError
from ..matrix.model import Matrix, TorchRelease
from .index import Index, PackageIndex, cuda_platforms
from .requires_dist import applies, cuda_pins, pinned


def probe_python(release: TorchRelease) -> Version:
    """The Python whose wheel we read a release's metadata from (the same for every wheel)."""
    return Version("3.11") if Version("3.11") in release.pythons else max(release.pythons)


def release_drift(index: Index, release: TorchRelease) -> list[str]:
    variant = release.variant(release.pypi_variant)
    python = probe_python(release)
    reqs = index.wheel_metadata("torch", release.version, python).requires_dist
    found = {**cuda_pins(reqs, python), "triton": pinned(reqs, "triton", python)}
    expected = {"cudnn": variant.cudnn, "nccl": variant.nccl, "triton": release.triton, "cuda": variant.cuda}
    drifts = []
    for key, pin in found.items():
        want = expected[key]
        if key == "cuda" and pin is not None:
            pin = Version(f"{pin.major}.{pin.minor}")
        if pin != want:
            drifts.append(f"torch {release.version} ({variant.name}) {key}: matrix.yaml has {want}, the index's wheel pins {pin}")
    platforms = cuda_platforms(index, release.version, python)
    if set(platforms) != set(release.platforms):
        drifts.append(f"torch {release.version} platforms: matrix.yaml has {', '.join(release.platforms)}, "
                      f"the index has CUDA wheels for {', '.join(platforms)}")
    return drifts


def lacking(index: Index, torch_reqs: tuple[Requirement, ...], packages: dict[str, Version], triton: Version | None,
            python: Version) -> list[str]:
    """What of a release has no wheel for `python`: each package without one as `name version`,
    and triton where torch requires none (2.5.1 leaves it out by marker on 3.13)."""
    missing = [f"{name} {version}" for name, version in packages.items()
               if version not in index.versions_with_wheels(name, python)]
    if triton is not None:
        if not any(r.name == "triton" and applies(r, python) for r in torch_reqs):
            missing.append(f"triton (torch requires none on Python {python}: no torch.compile on GPU)")
        elif triton not in index.versions_with_wheels("triton", python):
            missing.append(f"triton {triton}")
    return missing


def missing_wheels(index: Index, release: TorchRelease, python: Version) -> list[str]:
    reqs = index.wheel_metadata("torch", release.version, probe_python(release)).requires_dist
    packages = {"torch": release.version, "torchvision": release.torchvision}
    if release.torchaudio is not None:
        packages["torchaudio"] = release.torchaudio
    return lacking(index, reqs, packages, release.triton, python)


def python_problems(index: Index, release: TorchRelease) -> list[str]:
    return [
        f"torch {release.version} lists Python {python}, but there is no wheel of {', '.join(missing)} for it"
        for python in release.pythons
        if (missing := missing_wheels(index, release, python))
    ]


def missing_releases(index: Index, matrix: Matrix) -> list[Version]:
    """Releases on the index newer than the matrix's oldest that the matrix lacks: new minors and
    newer patch releases of the minors it has."""
    newest = matrix.newest_torch()
    oldest = min(t.version for t in matrix.torches.values())
    have = {t.key: t.version for t in matrix.torches.values()}
    # The newest Python of the newest release is the one a next release is likeliest to ship.
    on_index = index.versions_with_wheels("torch", max(newest.pythons))
    newest_patch: dict[str, Version] = {}
    for version in on_index:
        key = f"{version.major}.{version.minor}"
        if version > oldest and version > newest_patch.get(key, Version("0")):
            newest_patch[key] = version
    return sorted(v for key, v in newest_patch.items() if key not in have or v > have[key])


def check_drift(index: Index, matrix: Matrix, progress: Callable[[str], None] = lambda _: None) -> list[str]:
    drifts: list[str] = []
    for release in matrix.torches.values():
        progress(f"checking torch {release.version} against the index ...")
        drifts += release_drift(index, release) + python_problems(index, release)
    progress("looking for releases the matrix lacks ...")
    for version in missing_releases(index, matrix):
        key = f"{version.major}.{version.minor}"
        if key in matrix.torches:
            drifts.append(f"torch {version} is on the index; matrix.yaml has {matrix.torches[key].version}")
        else:
            drifts.append(f"torch {version} is on the index but not in matrix.yaml; "
                          f"add it with `imagebuilder matrix add --torch {version}`")
    return drifts


def report_drift(matrix: Matrix, index_url: str | None, *, echo: Callable[[str], None],
                 progress: Callable[[str], None]) -> None:
    """`matrix check --online`: a `drift:` line per difference, an error when there is any."""
    drifts = check_drift(PackageIndex(index_url), matrix, progress=progress)
    for line in drifts:
        echo(f"drift: {line}")
    if drifts:
        raise ImageBuilderError(f"{len(drifts)} differences from the index; update {matrix.path}")
    echo("online: pins, Pythons, platforms and releases match the index")
