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
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
from ..platforms import DEFAULT_PLATFORM, PLATFORMS
from ..reading import DIGEST, Source, read_json, read_text, shown, unusable_specifier
from .base_pin import BasePin
from .requires_dist import CUDA_RUNTIME_PACKAGES

LOCKS_DIR = "locks"
BASES_FILE = "base-images.json"
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
            requirement = Requirement(text)
        except InvalidRequirement as e:
            raise BadExtra(text=text, why=str(e).splitlines()[0]) from e
        why = unusable_specifier(requirement)
        if why is not None:
            raise BadExtra(text=text, why=why)
        out.add(str(requirement))
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
        parts.append(PLATFORMS[platform].machine)
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
_META = {"python": re.compile(r"\d+\.\d+"), "platform": re.compile(r"[a-z0-9_]+-[a-z0-9_]+|linux/[a-z0-9]+"),
         "requirements": re.compile(r".+")}


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number of its first line, text) of each line, a backslash's continuation joined to it."""
    first, parts = 0, []
    for number, raw in enumerate(text.splitlines(), 1):
        first = first or number
        if raw.endswith("\\"):
            parts.append(raw[:-1])
            continue
        yield first, " ".join(parts + [raw])
        first, parts = 0, []
    if parts:
        yield first, " ".join(parts)


def parse_lock(name: str, text: str, file: str | None = None) -> Lock:
    """A lock file (ours, or uv's `pip compile --generate-hashes` output) -> Lock; a line or value
    it cannot use is a BadValue naming `file` (default: `name`), the package and the line."""
    source = Source(file or name)
    meta: dict[str, str] = {}
    pins: dict[str, Pin] = {}
    for number, line in _logical_lines(text):
        line = line.strip()
        if line.startswith("#"):
            key, sep, value = line[1:].strip().partition(": ")
            if sep and key in _META:
                meta[key] = source.string(value.strip(), (key,), pattern=_META[key], what=f"a lock's {key}") \
                    if key != "requirements" or value.strip() else ""
            continue
        if not line:
            continue
        head, *options = line.split()
        match = _PIN.match(head)
        if match is None:
            source.fail((), f"cannot read {shown(line[:80])}; refresh the lock with `imagebuilder lock`", number)
        package = canonicalize_name(match[1])
        if package in pins:
            source.fail((package,), "pinned twice; refresh the lock with `imagebuilder lock`", number)
        version = source.version(match[2], (package, "version"), number)
        hashes = []
        for option in options:
            if not option.startswith("--hash=") or not DIGEST.fullmatch(option.removeprefix("--hash=")):
                source.fail((package, "hash"), f"{shown(option)} is not --hash=sha256:<64 hex digits>", number)
            hashes.append(option.removeprefix("--hash="))
        pins[package] = Pin(package, version, tuple(sorted(hashes)))
    return Lock(name=name, requirements=tuple(meta.get("requirements", "").split()),
                platform=meta.get("platform", ""), python=meta.get("python", ""),
                pins=tuple(sorted(pins.values(), key=lambda p: p.name)))


# --------------------------------------------------------------------------- the locks/ folder


@dataclass(frozen=True)
class LockSet:
    """The locks/ folder as read: lock files by name and base-image pins by image name."""

    directory: Path | None = None
    locks: Mapping[str, Lock] = field(default_factory=dict, repr=False)
    bases: Mapping[str, BasePin] = field(default_factory=dict)
    platform: str = DEFAULT_PLATFORM  # whose locks lock_for gives

    def __hash__(self) -> int:
        # A value (a render's options are a cache key, build/per_platform.Renderer): equal sets hash
        # alike; the mappings are compared by __eq__, which meets the same Lock objects first.
        return hash((self.directory, self.platform, len(self.locks), len(self.bases)))

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
        locks[path.stem] = parse_lock(path.stem, read_text(path), str(path))
    bases_path = directory / BASES_FILE
    if bases_path.is_file():
        bases = read_bases(bases_path)
    return LockSet(directory, locks, bases)


def read_bases(path: Path) -> dict[str, BasePin]:
    """base-images.json: {image: {"digest": "sha256:...", "image_id": "sha256:..."}}, each checked."""
    data, source = read_json(path)
    bases = {}
    for image, entry in source.mapping(data, (), "a mapping of base images to their pins").items():
        pin = source.mapping(entry, (image,), 'a mapping with "digest" and/or "image_id"')
        for key in sorted(set(pin) - {"digest", "image_id"}):
            source.fail((image, key), 'is not a key of a pin ("digest", "image_id")')
        digest, image_id = (None if pin.get(key) is None else
                            source.string(pin[key], (image, key), pattern=DIGEST, what="sha256:<64 hex digits>")
                            for key in ("digest", "image_id"))
        bases[image] = BasePin(image, digest, image_id)
    return bases


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
            current = {image: pin.to_json() for image, pin in read_bases(path).items()} if path.is_file() else {}
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
