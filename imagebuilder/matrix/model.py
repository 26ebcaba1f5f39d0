"""The matrix as a frozen model: OSes, CUDA releases, torch releases and their wheel variants,
the tools, the defaults; and the error that names every problem of a matrix.yaml.

matrix/load.py reads matrix.yaml into it (parse first, then validate everything); nothing
downstream ever sees a half-valid matrix.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from ..errors import BadRequest
from ..platforms import DEFAULT_PLATFORM
from ..resources import default_matrix_path
from .variants import JUPYTER_PARENTS as JUPYTER_PARENTS
from .variants import VARIANTS as VARIANTS

KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class Problem:
    path: KeyPath
    line: int | None
    message: str

    def render(self, file: Path) -> str:
        where = f"{file}:{self.line}" if self.line else str(file)
        return f"{where}: {'.'.join(self.path) or '<top>'}: {self.message}"


class MatrixError(BadRequest):
    """Fields: file, problems. The command to re-check names the same file the user gave.

    A bad request (exit 2): the matrix is the user's input, like a flag."""
    file: Path
    problems: list[Problem]

    def describe(self) -> str:
        file: Path = self.fields["file"]
        problems: list[Problem] = self.fields["problems"]
        noun = "problem" if len(problems) == 1 else "problems"
        return (f"{file} has {len(problems)} {noun}; fix them and run `{check_command(file)}`:\n  "
                + "\n  ".join(p.render(file) for p in problems))


class MatrixMissing(BadRequest):
    template = "--matrix {file}: {reason}; give the path of a matrix.yaml (default: the packaged one)"


def check_command(file: Path) -> str:
    """`imagebuilder matrix check`, with the --matrix that names `file` unless it is the default."""

    if file.resolve() == default_matrix_path().resolve():
        return "imagebuilder matrix check"
    return f"imagebuilder --matrix {shlex.quote(str(file))} matrix check"


@dataclass(frozen=True)
class OSRelease:
    name: str
    family: str
    python: Version  # the distribution's own python3
    base: str  # plain OS image, for CUDA versions NVIDIA publishes no image of for this OS
    source: str
    ffmpeg: tuple[str, ...] = ()  # the OS's FFmpeg shared-library packages (runtime, not -dev)
    rdma: tuple[str, ...] = ()  # the OS's RDMA user-space packages: libibverbs, its providers, librdmacm


@dataclass(frozen=True)
class CudaRelease:
    key: Version  # major.minor, e.g. 12.1
    version: Version  # full toolkit version, e.g. 12.1.1
    min_driver: str  # the toolkit's own Linux driver floor, as NVIDIA writes it (530.30.02)
    min_driver_compat: str  # floor through CUDA minor-version compatibility; a branch ("580") where NVIDIA states one
    images: Mapping[str, Mapping[str, str]]  # os -> {"runtime"|"devel": nvidia/cuda tag}
    pip_toolchain: tuple[str, ...]  # PyPI packages giving a working nvcc (CUDA 13+)
    source: str

    @property
    def major(self) -> int:
        return self.key.major


@dataclass(frozen=True)
class WheelVariant:
    name: str  # e.g. cu124
    cuda: Version
    cudnn: Version
    nccl: Version
    index: str
    source: str
    pythons: tuple[Version, ...] = ()  # only where the variant ships fewer Pythons than its release
    # The driver of the CUDA toolkit update the wheels' libraries come from, where that is a later
    # update than the one the matrix's block for their CUDA names (torch 2.15's cu132: 13.2.2).
    min_driver: str | None = None


@dataclass(frozen=True)
class TorchCodec:
    """The torchcodec torchaudio's load/save go through (torchaudio 2.9+), for the Pythons its
    wheels exist for; it loads the OS's FFmpeg (OSRelease.ffmpeg)."""
    version: Version
    pythons: tuple[Version, ...]
    source: str


@dataclass(frozen=True)
class TorchRelease:
    key: str  # major.minor, e.g. "2.6"
    version: Version
    torchvision: Version
    torchaudio: Version | None
    triton: Version | None
    pythons: tuple[Version, ...]
    pypi_variant: str
    variants: tuple[WheelVariant, ...]
    source: str
    # Where the PyPI wheels (pypi_variant) are CUDA builds; before 2.11 PyPI's aarch64 torch is CPU-only.
    platforms: tuple[str, ...] = (DEFAULT_PLATFORM,)
    torchcodec: TorchCodec | None = None

    def variant(self, name: str) -> WheelVariant:
        return next(v for v in self.variants if v.name == name)

    def torchcodec_for(self, python: Version) -> Version | None:
        """The torchcodec pin of an image with this Python, or None where it gets none."""
        codec = self.torchcodec
        if codec is None or Version(f"{python.major}.{python.minor}") not in codec.pythons:
            return None
        return codec.version


class NoNotebookPins(BadRequest):
    python: Version
    known: str
    template = ("matrix.yaml's tools.notebook has no jupyter packages for Python {python} (it has {known}); "
                "choose one of those with --python, or add an entry")


NOTEBOOK = ("jupyterlab", "ipykernel", "ipywidgets", "pandas", "matplotlib", "tqdm", "tensorboard", "jupyter-server-proxy")
# jupyter-server-proxy puts TensorBoard behind Jupyter's token; before 4.1.1 its websocket proxy
# let anyone in without it (CVE-2024-28179).
SERVER_PROXY_FLOOR = Version("4.1.1")


@dataclass(frozen=True)
class NotebookPins:
    """What the jupyter variants install beside JupyterLab for one Python: each package's newest
    release whose wheels' Requires-Python admits it (cited in `source`)."""
    python: Version
    versions: Mapping[str, str]
    source: str

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(f"{name}=={self.versions[name]}" for name in NOTEBOOK)


@dataclass(frozen=True)
class Tools:
    uv: str
    ninja: str
    notebook: Mapping[Version, NotebookPins]  # by Python (major.minor)

    def notebook_for(self, python: Version) -> tuple[str, ...]:
        """The jupyter variants' requirements for this Python, pinned."""
        pins = self.notebook.get(Version(f"{python.major}.{python.minor}"))
        if pins is None:
            raise NoNotebookPins(python=python, known=", ".join(str(p) for p in sorted(self.notebook)))
        return pins.requirements


@dataclass(frozen=True)
class Defaults:
    os: str
    variant: str
    repository: str


@dataclass(frozen=True)
class Matrix:
    path: Path
    defaults: Defaults
    oses: Mapping[str, OSRelease]
    cudas: Mapping[Version, CudaRelease]
    torches: Mapping[str, TorchRelease]
    tools: Tools
    text: str = field(repr=False, default="")
    extras: tuple[str, ...] = ()  # a site's packages added to every image, resolved into its lock

    def newest_torch(self) -> TorchRelease:
        return max(self.torches.values(), key=lambda t: t.version)


def driver_key(version: str) -> tuple[int, ...]:
    """NVIDIA driver versions compare as integers per field; "530.30.02" keeps its zero."""
    return tuple(int(part) for part in version.split("."))
