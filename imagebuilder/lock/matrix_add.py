"""`matrix add`: a torch release's block, read from the wheels' metadata, written into matrix.yaml.

What the block says comes from the index only (index.py): the CUDA runtime, cuDNN, NCCL and
triton pins from torch's Requires-Dist; the Pythons for which torch, torchvision, torchaudio
and the triton torch requires all have wheels; the newest torchvision and torchaudio whose
Requires-Dist accepts this torch; the platforms whose wheel is a CUDA build. What metadata
does not say (a CUDA toolkit block with driver floors and base images, variants published only
on PyTorch's own index) is not guessed: `matrix check` names what is left to fill in.

The block is inserted as text, in version order, so the file's comments and layout stay as
they are; the file is replaced atomically and only once the new text parses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

from packaging.version import Version

from ..atomic import os_reason, write_atomic
from ..errors import ImageBuilderError
from ..matrix.load import load_matrix, parse_matrix
from ..matrix.model import Matrix, MatrixError
from ..platforms import ARM64
from .drift import lacking, missing_releases
from .index import BadIndexAnswer, Index, IndexUnavailable, PackageIndex, WheelMetadata, cuda_platforms
from .requires_dist import applies, cuda_pins, pinned

# Pythons probed for wheels; a release outside this range would need this line to move.
CANDIDATE_PYTHONS = tuple(Version(f"3.{minor}") for minor in range(8, 17))
COMPANION_TRIES = 10  # newest torchvision/torchaudio releases read before giving up
PYTORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
BLOCK_START = re.compile(r'^  "(\d+\.\d+)":')


class CannotAdd(ImageBuilderError):
    template = "cannot add torch {version}: {reason}"


class MatrixUnwritable(ImageBuilderError):
    """The file system, not the request (exit 1)."""

    template = ("could not write torch {version} into {path} ({reason}); it is unchanged: make it writable or "
                "make room, and add again")


class AlreadyInMatrix(CannotAdd):
    """The request, not the index: the same command fails until the block is removed (exit 2)."""

    exit_code = 2


@dataclass(frozen=True)
class Variant:
    name: str
    cuda: Version  # the runtime's full version as pinned (12.4.127); the block keeps major.minor
    cudnn: Version
    nccl: Version
    index: str
    source: str


@dataclass(frozen=True)
class NewRelease:
    version: Version
    torchvision: Version
    torchaudio: Version | None
    triton: Version | None
    pythons: tuple[Version, ...]
    platforms: tuple[str, ...]
    pypi_variant: Variant
    extra_variants: tuple[Variant, ...]
    source: str
    left_out: tuple[str, ...]  # Pythons torch ships that the block leaves out, and why

    @property
    def key(self) -> str:
        return f"{self.version.major}.{self.version.minor}"


def _variant(meta: WheelMetadata, python: Version, where: str) -> Variant:
    pins = cuda_pins(meta.requires_dist, python)
    lacking = [name for name, pin in pins.items() if pin is None]
    if lacking:
        raise CannotAdd(version=meta.version,
                        reason=f"the {where} wheel's Requires-Dist pins no {', '.join(lacking)} (a CPU build?); "
                               "fill the variant in by hand from a primary source")
    cuda, cudnn, nccl = pins["cuda"], pins["cudnn"], pins["nccl"]
    assert cuda is not None and cudnn is not None and nccl is not None
    name = f"cu{cuda.major}{cuda.minor}"
    runtime = next(str(r) for r in meta.requires_dist
                   if r.name.startswith(("nvidia-cuda-runtime", "cuda-toolkit")) and applies(r, python))
    return Variant(
        name=name, cuda=cuda, cudnn=cudnn, nccl=nccl, index=PYTORCH_INDEX.format(variant=name),
        source=f"{where} torch {meta.version.public} Requires-Dist: {runtime.split(';')[0].strip()}, "
               f"nvidia-cudnn-cu{cuda.major}=={cudnn}, nvidia-nccl-cu{cuda.major}=={nccl}",
    )


def _companion(index: Index, project: str, torch: Version, python: Version) -> tuple[Version, str] | None:
    """The newest `project` release whose Requires-Dist accepts this torch, with that requirement."""
    for version in index.versions_with_wheels(project, python)[:COMPANION_TRIES]:
        reqs = index.wheel_metadata(project, version, python).requires_dist
        wanted = [r for r in reqs if r.name == "torch" and applies(r, python)]
        # A release that names no torch says nothing about this one; it is not taken on trust.
        if wanted and torch in wanted[0].specifier:
            return version, f"torch{wanted[0].specifier}"
    return None


def read_release(index: Index, version: Version, cuda_variants: tuple[str, ...] = ()) -> NewRelease:
    """Everything the index's metadata says about one torch release (raises CannotAdd where it
    says too little to write a block)."""
    shipped = tuple(p for p in CANDIDATE_PYTHONS if version in index.versions_with_wheels("torch", p))
    if not shipped:
        raise CannotAdd(version=version, reason="the index has no Linux x86_64 wheel of it for Python "
                                                f"{CANDIDATE_PYTHONS[0]}-{CANDIDATE_PYTHONS[-1]}")
    probe = Version("3.11") if Version("3.11") in shipped else max(shipped)
    torch = index.wheel_metadata("torch", version, probe)
    pypi = _variant(torch, probe, "PyPI")
    triton = pinned(torch.requires_dist, "triton", probe)
    vision = _companion(index, "torchvision", version, probe)
    if vision is None:
        raise CannotAdd(version=version, reason=f"none of the {COMPANION_TRIES} newest torchvision releases "
                                                "declares that it accepts it; wait for its torchvision or add the block by hand")
    audio = _companion(index, "torchaudio", version, probe)
    packages = {"torchvision": vision[0], **({"torchaudio": audio[0]} if audio else {})}
    pythons, left_out = [], []
    for python in shipped:
        missing = lacking(index, torch.requires_dist, packages, triton, python)
        if missing:
            left_out.append(f"{python}: no wheel of {', '.join(missing)}")
        else:
            pythons.append(python)
    if not pythons:
        raise CannotAdd(version=version, reason="no Python has wheels of all its packages: " + "; ".join(left_out))
    platforms = cuda_platforms(index, version, probe)
    extras = tuple(_pytorch_index_variant(version, name, probe) for name in cuda_variants if name != pypi.name)
    tags = f"cp{shipped[0].major}{shipped[0].minor}-cp{shipped[-1].major}{shipped[-1].minor} " + \
        torch.filename.rsplit("-", 1)[-1].removesuffix(".whl")
    source = (f"PyPI torch {version} wheels ({tags}; Requires-Dist triton{_spec(torch, 'triton', probe)}); "
              f"torchvision {vision[0]} Requires-Dist {vision[1]}; "
              + (f"torchaudio {audio[0]} Requires-Dist {audio[1]}" if audio else
                 f"no torchaudio among the {COMPANION_TRIES} newest declares it accepts torch {version}")
              + (f"; left out: Python {'; '.join(left_out)}" if left_out else "")
              + ("; PyPI aarch64 wheel is a CUDA build" if ARM64.name in platforms else ""))
    return NewRelease(version=version, torchvision=vision[0], torchaudio=audio[0] if audio else None,
                      triton=triton, pythons=tuple(pythons), platforms=platforms, pypi_variant=pypi,
                      extra_variants=extras, source=source, left_out=tuple(left_out))


def _spec(meta: WheelMetadata, name: str, python: Version) -> str:
    return next((str(r.specifier) for r in meta.requires_dist if r.name == name and applies(r, python)), " none")


def _pytorch_index_variant(version: Version, name: str, python: Version) -> Variant:
    url = PYTORCH_INDEX.format(variant=name)
    try:
        meta = PackageIndex(url).wheel_metadata("torch", version, python)
    except (IndexUnavailable, BadIndexAnswer) as e:
        raise CannotAdd(version=version, reason=f"{name}: {e}; add that variant by hand from a primary source") from e
    variant = _variant(meta, python, f"PyTorch index {name}:")
    if variant.name != name:
        raise CannotAdd(version=version, reason=f"{url} serves a {variant.name} build, not {name}")
    return variant


# --- text ----------------------------------------------------------------------------------


def _q(version: Version | str) -> str:
    return f'"{version}"'


def block_text(release: NewRelease, today: date | None = None) -> str:
    def variant_line(v: Variant) -> str:
        return (f"      {v.name}: {{cuda: {_q(f'{v.cuda.major}.{v.cuda.minor}')}, cudnn: {_q(v.cudnn)}, "
                f"nccl: {_q(v.nccl)}, index: {_q(v.index)}, source: {_q(v.source)}}}")

    lines = [
        f"  # `imagebuilder matrix add` {(today or date.today()).isoformat()}: what the index's metadata declares",
        "  # (torchvision/torchaudio by their Requires-Dist alone); not yet built or smoke-tested.",
        f"  {_q(release.key)}:",
        f"    version: {_q(release.version)}",
        f"    torchvision: {_q(release.torchvision)}",
        f"    torchaudio: {_q(release.torchaudio) if release.torchaudio else 'null'}",
        f"    triton: {_q(release.triton) if release.triton else 'null'}",
        f"    python: [{', '.join(_q(p) for p in release.pythons)}]",
        f"    platforms: [{', '.join(_q(p) for p in release.platforms)}]",
        f"    pypi_variant: {release.pypi_variant.name}",
        f"    source: {_q(release.source)}",
        "    variants:",
        *(variant_line(v) for v in sorted((release.pypi_variant, *release.extra_variants), key=lambda v: v.cuda)),
    ]
    return "\n".join(lines) + "\n"


def insert_block(text: str, key: str, block: str) -> str:
    """`text` with `block` inserted in the torch section in version order, comments kept."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "torch:"), None)
    if start is None:
        raise CannotAdd(version=key, reason="the matrix has no top-level `torch:` section")
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ", "\n", "#")), len(lines))
    for i in range(start + 1, end):
        match = BLOCK_START.match(lines[i])
        if match and Version(match.group(1)) > Version(key):
            while i - 1 > start and lines[i - 1].startswith("  #"):
                i -= 1  # a block's own comment lines stay above it
            return "".join(lines[:i] + [block] + lines[i:])
    while end - 1 > start and not lines[end - 1].strip():
        end -= 1
    head = "".join(lines[:end])
    return head + ("" if head.endswith("\n") else "\n") + block + "".join(lines[end:])


def add_release(index: Index, matrix: Matrix, version: Version, cuda_variants: tuple[str, ...] = (),
                dry_run: bool = False) -> tuple[str, list[str]]:
    """Write the release's block into the matrix file; return the block and what `matrix check`
    still reports (a CUDA block the metadata cannot give, say)."""
    key = f"{version.major}.{version.minor}"
    if key in matrix.torches:
        raise AlreadyInMatrix(version=version,
                              reason=f"{matrix.path} already has torch {key} ({matrix.torches[key].version}); "
                                     "remove that block first to write it anew")
    block = block_text(read_release(index, version, cuda_variants))
    text = insert_block(matrix.text, key, block)
    try:
        parse_matrix(text, matrix.path)
        todo: list[str] = []
    except MatrixError as e:
        todo = [p.render(matrix.path) for p in e.fields["problems"]]
    if not dry_run:
        try:
            write_atomic(matrix.path, text)
        except OSError as e:  # read-only, full: the file stays as it was (atomic.py)
            raise MatrixUnwritable(path=matrix.path, reason=os_reason(e), version=version) from e
    return block, todo


def new_releases(index: Index, matrix: Matrix) -> list[Version]:
    """Releases of a minor the matrix does not have yet (patch releases are reported by
    `matrix check --online`; their blocks carry hand-kept variants, so they are edited by hand)."""
    return [v for v in missing_releases(index, matrix) if f"{v.major}.{v.minor}" not in matrix.torches]


def add_releases(matrix_path: Path, torch: Version | None, index_url: str | None, cuda_variants: Sequence[str],
                 dry_run: bool, *, echo: Callable[[str], None], note: Callable[[str], None]) -> None:
    """`matrix add`: `torch`, or (None) every new release the index has, each block written
    (or with `dry_run` printed) and what is left for the user noted."""
    index = PackageIndex(index_url)
    versions = [torch] if torch is not None else new_releases(index, load_matrix(matrix_path))
    if not versions:
        echo(f"{matrix_path}: the index has no release the matrix lacks")
    for version in versions:
        block, todo = add_release(index, load_matrix(matrix_path), version, tuple(cuda_variants), dry_run)
        echo(block if dry_run else f"{matrix_path}: added torch {version}")
        for line in todo:
            note(f"left for you: {line}")
