"""What an image installs, its lock file, and the locks/ folder that holds the locks.

A lock is a requirements file of every distribution an image installs, each `name==version`
with the sha256 of every file the index offers for that version. Builds install exactly the
lock (`--require-hashes --no-deps`: no resolution inside the build), so two builds from the
same lock carry the same packages, and the lock is what the inputs hash counts.

Locks live in `locks/` beside matrix.yaml, one file per set of requirements: images that
install the same set for the same Python (a runtime image of one torch build on two OSes)
share one. A jupyter image's lock holds only what JupyterLab adds to its runtime image's
lock, resolved with that lock as constraints. `locks/base-images.json` records the digest of
every base image (or, for a local image without a registry digest, its image id). A matrix
without locks still builds, resolving at build time, with a note.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..atomic import os_reason, write_atomic
from ..errors import BadRequest, ImageBuilderError
from ..matrix.model import Matrix
from ..matrix.resolve import BuildSpec
from ..matrix.variants import variant
from .base_pin import BasePin
from .index import CUDA_RUNTIME_PACKAGES

LOCKS_DIR = "locks"
BASES_FILE = "base-images.json"
# The wheels' platform: every OS of the matrix has glibc >= 2.35, and torch's own wheels
# need 2.28 (2.9+) or less. Another architecture (arm64) maps to its own tag here.
PLATFORMS = {"linux/amd64": "x86_64-manylinux_2_28", "linux/arm64": "aarch64-manylinux_2_28"}
DEFAULT_PLATFORM = "linux/amd64"
# What the in-image constraint file pins: the packages whose replacement breaks the image's
# CUDA build of torch (a dependency wanting another torch would bring another CUDA stack).
PROTECTED = re.compile(r"^(torch|torchvision|torchaudio|torchcodec|triton|pytorch-triton|nvidia-.*)$")
HEADER = "# imagebuilder lock"
# What `uv venv --seed` would add unpinned, locked instead: pip for users' own installs, and
# setuptools, which torch.compile imports (through torch.utils.cpp_extension) on every
# Python although torch requires it only from 3.12 on.
SEED = ("pip", "setuptools")


class LockError(ImageBuilderError):
    pass


class StaleLock(LockError):
    path: str
    recorded: str
    wanted: str
    refresh: str
    template = "{path} was locked for `{recorded}` but the image now installs `{wanted}`; refresh it: {refresh}"


class ExtraContradictsPin(BadRequest):
    template = ("--with {extra!r} contradicts the image's {name}=={pinned} (the CUDA stack of torch {torch} "
                "is pinned); leave it out, or pick a --torch that comes with that {name}")


class BadExtra(BadRequest):
    text: str
    why: str
    template = "--with {text!r} is not a requirement ({why}); give e.g. 'pandas==2.2.3'"


# --------------------------------------------------------------------------- what to install (pure)


def parse_extras(texts: Iterable[str]) -> tuple[str, ...]:
    """Normalised, sorted, deduplicated: the same extras in another order are the same lock."""
    out = set()
    for text in texts:
        try:
            out.add(str(Requirement(text)))
        except InvalidRequirement as e:
            raise BadExtra(text=text, why=str(e).splitlines()[0]) from e
    return tuple(sorted(out, key=str.lower))


def check_extras(spec: BuildSpec, extras: Sequence[str], lock: Lock | None = None) -> None:
    """A --with may add packages, not replace the ones the image's torch build stands on:
    torch, torchvision, torchaudio, triton and (as its lock has them) the nvidia-* wheels.
    One that another version of them wants is found by the resolver (`lock`)."""
    pinned: dict[str, Version] = {"torch": spec.torch.version, "torchvision": spec.torch.torchvision}
    if spec.torch.torchaudio is not None:
        pinned["torchaudio"] = spec.torch.torchaudio
    if spec.torch.triton is not None:
        pinned["triton"] = spec.torch.triton
    codec = spec.torch.torchcodec_for(spec.python)
    if codec is not None:
        pinned["torchcodec"] = codec
    if lock is not None:
        pinned.update({canonicalize_name(p.name): p.version for p in lock.pins if PROTECTED.match(p.name)})
    else:  # the matrix's cuDNN and NCCL are the wheel's own Requires-Dist pins
        major = spec.wheel.cuda.major
        pinned.update({f"nvidia-cudnn-cu{major}": spec.wheel.cudnn, f"nvidia-nccl-cu{major}": spec.wheel.nccl})
    for text in extras:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        version = pinned.get(name)
        # A direct URL (`torch @ https://...whl`) is another build, whatever its version.
        if version is not None and (requirement.url or not requirement.specifier.contains(version, prereleases=True)):
            raise ExtraContradictsPin(extra=text, name=name, pinned=version, torch=spec.torch.version)


def requirements(spec: BuildSpec, matrix: Matrix, extras: Sequence[str] = ()) -> list[str]:
    """What an image asks for; a lock pins these and everything they pull in."""
    if spec.parent is not None:  # jupyter, devel-jupyter: what they add to their parent's venv
        return list(matrix.tools.notebook_for(spec.python))
    reqs = [f"torch=={spec.torch.version}", f"torchvision=={spec.torch.torchvision}"]
    if spec.torch.torchaudio is not None:
        reqs.append(f"torchaudio=={spec.torch.torchaudio}")
    codec = spec.torch.torchcodec_for(spec.python)
    if codec is not None:  # torchaudio's load/save (2.9+) go through it
        reqs.append(f"torchcodec=={codec}")
    if variant(spec.variant).toolchain:
        reqs.append(f"ninja=={matrix.tools.ninja}")  # torch.utils.cpp_extension builds with ninja
        if spec.toolchain == "pip":
            reqs += list(spec.cuda.pip_toolchain)
    return reqs + list(extras)


def index_args(spec: BuildSpec, index_url: str | None, extra_index_urls: Sequence[str]) -> list[tuple[str, str]]:
    """The PyPI build of a release comes from the default index (the user's own, or a
    mirror set by --index-url); other CUDA builds come from PyTorch's wheel index. (option,
    value) pairs: the lock passes them to uv as they are, render quotes them into a RUN line
    without their credentials."""
    index = index_url
    if index is None and spec.wheel.name != spec.torch.pypi_variant:
        index = spec.wheel.index
    args = [("--index-url", index)] if index else []
    args += [("--extra-index-url", url) for url in extra_index_urls]
    if len(args) > 1:
        args.append(("--index-strategy", "unsafe-best-match"))
    return args


def with_suffix(extras: Sequence[str]) -> str:
    """`with-{hash}`: the name part of a set of extras (parsed: normalised and sorted), in a
    lock's name and in the tags of an image built --with them."""
    return "with-" + hashlib.sha256("\n".join(extras).encode()).hexdigest()[:8]


def added_extras(matrix: Matrix, extras: Sequence[str]) -> tuple[str, ...]:
    """What --with adds to matrix.yaml's extras (parsed): the packages that make an image
    another one than the matrix's plain image."""
    plain = set(parse_extras(matrix.extras))
    return tuple(e for e in parse_extras(extras) if e not in plain)


def lock_name(spec: BuildSpec, extras: Sequence[str] = (), platform: str = DEFAULT_PLATFORM) -> str:
    """One name per set of requirements and platform: the runtime images of one torch build and
    Python share a lock whatever their OS or image CUDA; extras get a short hash of their own;
    another platform than linux/amd64 gets its machine (its wheels, and their dependencies, differ)."""
    parts = [f"torch{spec.torch.version}", spec.wheel.name, f"py{spec.python}", spec.variant]
    if variant(spec.variant).toolchain and spec.toolchain == "pip":
        parts.append(f"cuda{spec.cuda.key}")  # the nvcc wheels are the image CUDA's
    if extras:
        parts.append(with_suffix(extras))
    if platform != DEFAULT_PLATFORM:
        parts.append(PLATFORMS[platform].split("-")[0])
    return "-".join(parts)


def refresh_command(spec: BuildSpec, extras: Sequence[str] = ()) -> str:
    words = ["imagebuilder lock", f"--torch {spec.torch.version}", f"--cuda {spec.cuda.key}",
             f"--python {spec.python}", f"--os {spec.os.name}", f"--variant {spec.variant}"]
    return " ".join(words + [f"--with '{e}'" for e in extras])


# --------------------------------------------------------------------------- the lock file (pure)


@dataclass(frozen=True)
class Pin:
    name: str  # canonical (PEP 503)
    version: Version
    hashes: tuple[str, ...]  # "sha256:..." of every file the index offers for this version

    def line(self) -> str:
        return f"{self.name}=={self.version}" + "".join(f" \\\n    --hash={h}" for h in self.hashes)


@dataclass(frozen=True)
class Lock:
    name: str
    requirements: tuple[str, ...]  # what was resolved (recorded in the file's header)
    platform: str
    python: str
    pins: tuple[Pin, ...]

    @property
    def filename(self) -> str:
        return f"{self.name}.txt"

    def text(self) -> str:
        """The file: deterministic, so relocking an unchanged image changes nothing."""
        lines = [f"{HEADER} {self.name}: do not edit; refresh with `imagebuilder lock`.",
                 f"# python: {self.python}", f"# platform: {self.platform}",
                 f"# requirements: {' '.join(self.requirements)}"]
        lines += [pin.line() for pin in self.pins]
        return "\n".join(lines) + "\n"

    def version_of(self, name: str) -> Version | None:
        wanted = canonicalize_name(name)
        return next((p.version for p in self.pins if p.name == wanted), None)

    def cuda_runtime(self) -> Version | None:
        """The CUDA runtime the locked torch wheels bring: cudart's version where the lock pins it
        (the cuda-toolkit meta-package's only where it does not: CUDA_RUNTIME_PACKAGES' order)."""
        return next((v for name in CUDA_RUNTIME_PACKAGES if (v := self.version_of(name)) is not None), None)

    def constraints(self) -> str:
        """The in-image constraint file: torch and the CUDA stack stay as installed."""
        return "".join(f"{p.name}=={p.version}\n" for p in self.pins if PROTECTED.match(p.name))


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def parse_lock(name: str, text: str) -> Lock:
    """A lock file (ours, or uv's `pip compile --generate-hashes` output) -> Lock."""
    meta: dict[str, str] = {}
    pins: list[Pin] = []
    logical = re.sub(r"\\\n", " ", text)
    for line in logical.splitlines():
        line = line.strip()
        if line.startswith("#"):
            key, sep, value = line[1:].strip().partition(": ")
            if sep and key in ("python", "platform", "requirements"):
                meta[key] = value.strip()
            continue
        if not line:
            continue
        head, *options = line.split()
        match = _PIN.match(head)
        if match is None:
            raise LockError(f"{name}: cannot read line {line[:80]!r}; refresh the lock with `imagebuilder lock`")
        hashes = tuple(sorted(o.removeprefix("--hash=") for o in options if o.startswith("--hash=")))
        pins.append(Pin(canonicalize_name(match[1]), Version(match[2]), hashes))
    return Lock(name=name, requirements=tuple(meta.get("requirements", "").split()),
                platform=meta.get("platform", ""), python=meta.get("python", ""),
                pins=tuple(sorted(pins, key=lambda p: p.name)))


# --------------------------------------------------------------------------- the locks/ folder


@dataclass(frozen=True)
class LockSet:
    """The locks/ folder as read: lock files by name and base-image pins by image name."""

    directory: Path | None = None
    locks: Mapping[str, Lock] = field(default_factory=dict, repr=False)
    bases: Mapping[str, BasePin] = field(default_factory=dict)
    platform: str = DEFAULT_PLATFORM  # whose locks lock_for gives

    def for_platform(self, platform: str) -> LockSet:
        """The same folder, giving `platform`'s locks: each platform builds from its own."""
        return replace(self, platform=platform)

    def lock_for(self, spec: BuildSpec, matrix: Matrix, extras: Sequence[str] = ()) -> Lock | None:
        """The image's lock; None when there is none (a site's own matrix): the build then
        resolves. A lock made for other requirements is an error, not a silent fallback."""
        lock = self.locks.get(lock_name(spec, extras, self.platform))
        if lock is None:
            return None
        wanted = tuple(requirements(spec, matrix, extras))
        recorded = tuple(r for r in lock.requirements if r not in SEED)
        if recorded != wanted:
            path = f"{self.directory}/{lock.filename}" if self.directory else lock.filename
            raise StaleLock(path=path, recorded=" ".join(recorded), wanted=" ".join(wanted),
                            refresh=refresh_command(spec, extras))
        return lock

    def base_for(self, image: str) -> BasePin:
        return self.bases.get(image) or BasePin(image)


def locks_dir(matrix: Matrix) -> Path:
    return matrix.path.parent / LOCKS_DIR


def load_locks(directory: Path) -> LockSet:
    """Read every lock and the base pins; a missing folder is an empty LockSet."""
    locks: dict[str, Lock] = {}
    bases: dict[str, BasePin] = {}
    if not directory.is_dir():
        return LockSet(directory)
    for path in sorted(directory.glob("*.txt")):
        locks[path.stem] = parse_lock(path.stem, path.read_text())
    bases_path = directory / BASES_FILE
    if bases_path.is_file():
        try:
            data = json.loads(bases_path.read_text())
        except ValueError as e:
            raise LockError(f"{bases_path}: not JSON ({e}); refresh it with `imagebuilder lock`") from e
        bases = {image: BasePin(image, entry.get("digest"), entry.get("image_id")) for image, entry in data.items()}
    return LockSet(directory, locks, bases)


class LocksUnwritable(ImageBuilderError):
    """The file system, not the request: read-only, full, over quota (exit 1)."""

    template = ("could not write the locks into {directory} ({reason}); {done}; make room or make it writable, "
                "and lock again")


def write_locks(directory: Path, locks: Iterable[Lock], bases: Mapping[str, BasePin]) -> list[Path]:
    """Write lock files and merge base pins into base-images.json, each file atomically. A
    write that fails leaves every file whole, and no `directory` this call made and left empty."""
    made = not directory.exists()
    written: list[Path] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for lock in locks:
            written.append(write_atomic(directory / lock.filename, lock.text()))
        if bases:
            path = directory / BASES_FILE
            current = json.loads(path.read_text()) if path.is_file() else {}
            current.update({image: pin.to_json() for image, pin in bases.items()})
            written.append(write_atomic(path, json.dumps(dict(sorted(current.items())), indent=2) + "\n"))
    except OSError as e:
        if made and not written:
            try:
                directory.rmdir()
            except OSError:
                pass  # it holds what another process wrote, or could not be made at all
        done = f"{len(written)} files were written ({', '.join(p.name for p in written)})" if written else "nothing was written"
        raise LocksUnwritable(directory=directory, reason=os_reason(e), done=done) from e
    return written
