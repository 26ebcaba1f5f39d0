"""Image -> locked requirements with hashes (+ the base image's digest); drift check.

A lock is a requirements file of every distribution an image installs, each `name==version`
with the sha256 of every file the index offers for that version. Builds install exactly the
lock (`--require-hashes --no-deps`: no resolution inside the build), so two builds from the
same lock carry the same packages, and the lock is what the inputs hash counts.

Locks live in `locks/` beside matrix.yaml, one file per set of requirements: images that
install the same set for the same Python (a runtime image of one torch build on two OSes)
share one. A jupyter image's lock holds only what JupyterLab adds to its runtime image's
lock, resolved with that lock as constraints. `locks/base-images.json` records the digest of
every base image (or, for a local image without a registry digest, its image id).

The resolver is uv (`uv pip compile` for a target Python and platform: nothing is
installed). A matrix without locks still builds, resolving at build time, with a note.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from .atomic import write_atomic
from .errors import BadRequest, ImageBuilderError
from .matrix import Matrix
from .resolve import BuildSpec
from .variants import variant

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


class ResolutionFailed(LockError):
    name: str
    requirements: str
    detail: str
    template = "cannot lock {name} ({requirements}): {detail}"

    @property
    def unsatisfiable(self) -> bool:
        """The requirements contradict each other (uv proved it): the request, not the index's answer."""
        return "No solution found" in self.detail or "unsatisfiable" in self.detail


class LocksFailed(LockError):
    template = "{failed} of {total} locks could not be resolved (above{why}){others}"


class LocksUnsatisfiable(BadRequest):
    template = ("{failed} of {total} locks cannot be satisfied (above: their requirements contradict each "
                "other){others}; drop or change the --with that conflicts")


class BadUv(BadRequest):
    template = "--uv {uv} is not a uv executable ({why}); pass the path of uv, or leave --uv out"


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


def lock_name(spec: BuildSpec, extras: Sequence[str] = (), platform: str = DEFAULT_PLATFORM) -> str:
    """One name per set of requirements and platform: the runtime images of one torch build and
    Python share a lock whatever their OS or image CUDA; extras get a short hash of their own;
    another platform than linux/amd64 gets its machine (its wheels, and their dependencies, differ)."""
    parts = [f"torch{spec.torch.version}", spec.wheel.name, f"py{spec.python}", spec.variant]
    if variant(spec.variant).toolchain and spec.toolchain == "pip":
        parts.append(f"cuda{spec.cuda.key}")  # the nvcc wheels are the image CUDA's
    if extras:
        parts.append("with-" + hashlib.sha256("\n".join(extras).encode()).hexdigest()[:8])
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


# --------------------------------------------------------------------------- base images (pure)


@dataclass(frozen=True)
class BasePin:
    """How a base image is pinned: a registry digest (FROM name@digest), or for a local
    image without one, its image id (which the build checks before it starts)."""

    image: str
    digest: str | None = None
    image_id: str | None = None

    @property
    def from_ref(self) -> str:
        if self.digest is None:
            return self.image
        return f"{self.image.split('@')[0]}@{self.digest}"

    @property
    def identity(self) -> str:
        return self.digest or self.image_id or ""

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in (("digest", self.digest), ("image_id", self.image_id)) if v}


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


# --------------------------------------------------------------------------- resolving (I/O)


@dataclass(frozen=True)
class LockRequest:
    spec: BuildSpec
    extras: tuple[str, ...] = ()
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    platform: str = DEFAULT_PLATFORM


Resolver = Callable[[LockRequest, Sequence[str], "Lock | None"], str]
"""(request, requirements, constraints lock) -> uv's compiled requirements text."""

UV_TIMEOUT_S = 600

def default_uv() -> str:
    """The uv beside this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else (shutil.which("uv") or "uv")


class UvCompile:
    """The resolver: `uv pip compile` for the image's Python and platform, with hashes.

    A context manager: its one temporary folder (the constraint files) and every uv it started
    are gone when it exits, however it exits (Ctrl-C, SIGTERM, an error in another thread).
    Calls may come from several threads at once."""

    def __init__(self, uv: str) -> None:
        self.uv = uv
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._running: set[subprocess.Popen[str]] = set()
        self._guard = threading.Lock()
        self._closed = False
        self._count = 0

    def __enter__(self) -> UvCompile:
        self._tmp = tempfile.TemporaryDirectory(prefix="imagebuilder-lock-")
        return self

    def __exit__(self, *exc: object) -> None:
        with self._guard:
            self._closed = True
            running = list(self._running)
        for process in running:
            process.kill()
        for process in running:
            process.wait()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _start(self, cmd: list[str]) -> subprocess.Popen[str]:
        with self._guard:
            if self._closed:
                raise KeyboardInterrupt  # the run is being stopped: start nothing more
            try:
                process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
            except FileNotFoundError as e:
                raise LockError(f"uv not found at {self.uv}; install uv (matrix.yaml's tools.uv) or pass --uv PATH") from e
            except OSError as e:  # not a program: a text file, no exec permission, another arch
                raise BadUv(uv=self.uv, why=e.strerror or str(e)) from e
            self._running.add(process)
            return process

    def __call__(self, request: LockRequest, reqs: Sequence[str], constraints: Lock | None) -> str:
        assert self._tmp is not None, "use UvCompile as a context manager"
        spec = request.spec
        name = lock_name(spec, request.extras, request.platform)
        # --no-build (a lock is of wheels) and --no-python-downloads: otherwise uv fetches a
        # Python of the target version from GitHub to build sdists with, on every call, and
        # behind a proxy that serves only the index it spends ~45 s in retries each time.
        cmd = [self.uv, "pip", "compile", "--no-config", "--generate-hashes", "--no-header",
               "--no-annotate", "--no-build", "--no-python-downloads", "--python-version", str(spec.python),
               "--python-platform", PLATFORMS[request.platform]]
        for option, value in index_args(spec, request.index_url, request.extra_index_urls):
            cmd += [option, value]
        if constraints is not None:
            with self._guard:
                self._count += 1
                path = os.path.join(self._tmp.name, f"constraints-{self._count}.txt")
            Path(path).write_text(constraints.text())
            cmd += ["--constraint", path]
        cmd.append("-")
        process = self._start(cmd)
        try:
            out, err = process.communicate("\n".join(reqs) + "\n", timeout=UV_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            process.kill()
            process.communicate()
            raise ResolutionFailed(name=name, requirements=" ".join(reqs), detail=f"uv took over {UV_TIMEOUT_S} s") from e
        finally:
            with self._guard:
                self._running.discard(process)
        if process.returncode != 0:
            if self._closed:
                raise KeyboardInterrupt
            # From uv's last `error:` on: what precedes it is noise (a failed download of a
            # Python to build sdists with, say), what follows is the resolver's explanation.
            lines = err.strip().splitlines()
            start = max((n for n, line in enumerate(lines) if line.startswith("error:")), default=0)
            detail = " ".join(line.strip() for line in lines[start:])
            raise ResolutionFailed(name=name, requirements=" ".join(reqs),
                                   detail=detail or f"uv exited {process.returncode}")
        return out


def resolve_lock(request: LockRequest, matrix: Matrix, resolver: Resolver, parent: Lock | None = None) -> Lock:
    """The image's complete locked set, the seed packages included (the venv is made without
    uv's unpinned ones). A jupyter image resolves JupyterLab under its runtime image's lock
    as constraints and keeps only what that adds."""
    spec = request.spec
    reqs = requirements(spec, matrix, request.extras)
    asked = reqs if spec.parent is not None else [*reqs, *SEED]
    compiled = parse_lock("compiled", resolver(request, asked, parent))
    pins = compiled.pins
    if parent is not None:
        have = {(p.name, p.version) for p in parent.pins}
        pins = tuple(p for p in pins if (p.name, p.version) not in have)
    return Lock(name=lock_name(spec, request.extras, request.platform), requirements=tuple(asked),
                platform=PLATFORMS[request.platform], python=str(spec.python), pins=pins)


def drift(recorded: Lock | None, fresh: Lock) -> list[str]:
    """What the index offers now that the recorded lock does not pin, one line per package."""
    if recorded is None:
        return [f"{fresh.filename}: no lock (run `imagebuilder lock`)"]
    old = {p.name: p for p in recorded.pins}
    new = {p.name: p for p in fresh.pins}
    lines = []
    for name in sorted(old.keys() | new.keys()):
        a, b = old.get(name), new.get(name)
        if a is None:
            lines.append(f"{fresh.filename}: {name} {b.version if b else ''} added")
        elif b is None:
            lines.append(f"{fresh.filename}: {name} {a.version} dropped")
        elif a.version != b.version:
            lines.append(f"{fresh.filename}: {name} {a.version} -> {b.version}")
        elif a.hashes != b.hashes:
            lines.append(f"{fresh.filename}: {name} {a.version} files changed on the index")
    return lines


class ImageInspector(Protocol):
    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        """(image id, repo digests) of a local image; None when there is no such image."""
        ...


class DigestSource(Protocol):
    def digest(self, ref: str) -> str | None: ...


def pin_base(image: str, engine: ImageInspector | None, registry: DigestSource | None) -> BasePin | None:
    """The base image's digest: from the local engine when it has the image (its
    RepoDigest, else its image id), else from the registry; None when neither knows it."""
    name = image.split("@")[0]
    if engine is not None:
        found = engine.image_identity(image)
        if found is not None:
            image_id, repo_digests = found
            repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
            for repo_digest in repo_digests:
                r, _, local = repo_digest.partition("@")
                if r == repo or r.endswith("/" + repo):
                    return BasePin(image, digest=local)
            return BasePin(image, image_id=image_id)
    if registry is not None:
        try:
            remote = registry.digest(name)
        except ImageBuilderError:  # unreachable or refusing: the base stays unpinned, with a note
            remote = None
        if remote:
            return BasePin(image, digest=remote)
    return None


def write_locks(directory: Path, locks: Iterable[Lock], bases: Mapping[str, BasePin]) -> list[Path]:
    """Write lock files and merge base pins into base-images.json, each file atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for lock in locks:
        written.append(write_atomic(directory / lock.filename, lock.text()))
    if bases:
        path = directory / BASES_FILE
        current = json.loads(path.read_text()) if path.is_file() else {}
        current.update({image: pin.to_json() for image, pin in bases.items()})
        written.append(write_atomic(path, json.dumps(dict(sorted(current.items())), indent=2) + "\n"))
    return written


# --------------------------------------------------------------------------- many images (I/O)


@dataclass(frozen=True)
class LockPlan:
    """What `imagebuilder lock` computed for a selection of images."""

    locks: tuple[Lock, ...]
    bases: Mapping[str, BasePin]
    unpinned: tuple[str, ...]  # base images neither the engine nor a registry could pin
    failed: tuple[ResolutionFailed, ...] = ()  # sets the index cannot satisfy; the rest are locked
    extras: tuple[str, ...] = ()  # the --with asked for: without one, no set can contradict the user


def release_platforms(spec: BuildSpec) -> Sequence[str]:
    """Every platform the release has CUDA wheels for: each is locked, and built from its own lock."""
    return spec.torch.platforms


Outcome = Lock | ResolutionFailed


def lock_images(specs: Iterable[BuildSpec], matrix: Matrix, *, resolver: Resolver,
                pin: Callable[[str], BasePin | None], extras: Sequence[str] = (),
                index_url: str | None = None, extra_index_urls: Sequence[str] = (),
                platforms: Callable[[BuildSpec], Sequence[str]] = release_platforms, workers: int = 4,
                progress: Callable[[str, Outcome], None] = lambda name, outcome: None) -> LockPlan:
    """Resolve each distinct lock once and pin each distinct base image once: the runtime and
    devel sets first, then the jupyter sets under their parents' locks, `workers` resolutions
    at a time (each is mostly waiting on the index). `progress` hears of each set as it is
    done. A set the index cannot satisfy is reported, not fatal: one unsatisfiable image must
    not keep a night's refresh from the others."""
    specs = list(specs)
    for spec in specs:
        check_extras(spec, extras)
    done: dict[str, Lock] = {}
    failed: dict[str, ResolutionFailed] = {}

    def resolve_one(spec: BuildSpec, platform: str) -> tuple[str, Outcome]:
        name = lock_name(spec, extras, platform)
        parent = done.get(lock_name(spec.parent, extras, platform)) if spec.parent is not None else None
        request = LockRequest(spec, tuple(extras), index_url, tuple(extra_index_urls), platform)
        try:
            return name, resolve_lock(request, matrix, resolver, parent)
        except ResolutionFailed as e:
            return name, e

    for stage in (_distinct([s.parent or s for s in specs], extras, platforms),
                  _distinct([s for s in specs if s.parent is not None], extras, platforms)):
        # A jupyter set whose parent could not be locked cannot be locked either; it is left out.
        ready = [(s, p) for s, p in stage if s.parent is None or lock_name(s.parent, extras, p) in done]
        pool = ThreadPoolExecutor(max_workers=max(1, workers))
        futures = [pool.submit(resolve_one, spec, platform) for spec, platform in ready]
        try:
            for future in as_completed(futures):
                name, outcome = future.result()
                if isinstance(outcome, Lock):
                    done[name] = outcome
                else:
                    failed[name] = outcome
                progress(name, outcome)
        finally:
            # Not waiting: on Ctrl-C the resolver's owner stops the running ones (UvCompile's exit).
            pool.shutdown(wait=False, cancel_futures=True)
    bases: dict[str, BasePin] = {}
    unpinned: list[str] = []
    for spec in specs:
        base = (spec.parent or spec).base_image
        if base not in bases and base not in unpinned:
            found = pin(base)
            if found is None:
                unpinned.append(base)
            else:
                bases[base] = found
    return LockPlan(tuple(done[n] for n in sorted(done)), bases, tuple(unpinned),
                    tuple(failed[n] for n in sorted(failed)), tuple(extras))


def _distinct(specs: Iterable[BuildSpec], extras: Sequence[str],
              platforms: Callable[[BuildSpec], Sequence[str]]) -> list[tuple[BuildSpec, str]]:
    """One (image, platform) per lock name, in the order given."""
    seen: dict[str, tuple[BuildSpec, str]] = {}
    for spec in specs:
        for platform in platforms(spec):
            seen.setdefault(lock_name(spec, extras, platform), (spec, platform))
    return list(seen.values())


def set_names(specs: Iterable[BuildSpec], extras: Sequence[str] = (),
              platforms: Callable[[BuildSpec], Sequence[str]] = release_platforms) -> set[str]:
    """The name of every lock `lock_images` resolves for these images (their parents' included)."""
    specs = list(specs)
    return {name for s in [*specs, *(s.parent for s in specs if s.parent)] for name in
            (lock_name(s, extras, p) for p in platforms(s))}


def pypi_builds(specs: Iterable[BuildSpec]) -> list[BuildSpec]:
    """The images whose torch comes from the default index (each release's PyPI build): what
    `lock` covers unless a --cuda asks for another build, from PyTorch's own index."""
    return [s for s in specs if (s.parent or s).wheel.name == s.torch.pypi_variant]


def outcome_line(name: str, outcome: Outcome, recorded: LockSet | None = None) -> str:
    """One line per set as it is done: locked, matching the recorded lock or drifted from it, or failed."""
    if isinstance(outcome, ResolutionFailed):
        return f"{name}: failed: {outcome.detail}"
    if recorded is None:
        return f"{name}: locked, {len(outcome.pins)} packages"
    moved = drift(recorded.locks.get(name), outcome)
    return f"{name}: {len(moved)} drifted" if moved else f"{name}: ok"


def check(plan: LockPlan, current: LockSet) -> list[str]:
    """Drift between what the index (and the bases' registries) offer now and the locks."""
    lines = []
    for lock in plan.locks:
        lines += drift(current.locks.get(lock.name), lock)
    for image, pin in plan.bases.items():
        recorded = current.bases.get(image)
        if recorded is None or recorded.identity != pin.identity:
            was = recorded.identity if recorded else "not recorded"
            lines.append(f"{BASES_FILE}: {image} {was} -> {pin.identity}")
    return lines


def check_or_write(plan: LockPlan, directory: Path, *, check_only: bool, echo: Callable[[str], None],
                   note: Callable[[str], None], err: Callable[[str], None]) -> None:
    """`lock`'s result: with `check_only`, each drift (an error when there is any), else the
    locks written; then an error when some set could not be resolved (the others are done).
    `echo` prints the result, `note` and `err` what the user should know on stderr."""
    for image in plan.unpinned:
        note(f"base image {image}: neither the engine nor its registry gave a digest; it stays FROM by tag")
    for failure in plan.failed:
        err(f"error: {failure}")
    if check_only:
        lines = check(plan, load_locks(directory))
        for line in lines:
            echo(f"drift: {line}")
        if lines:
            raise ImageBuilderError(f"{len(lines)} locked pins differ from what the index offers; "
                                    "refresh with `imagebuilder lock` (same filters)")
        echo(f"{len(plan.locks)} locks match the index")
    else:
        for path in write_locks(directory, plan.locks, plan.bases):
            echo(f"wrote {path}")
    if plan.failed:
        unsatisfiable = all(f.unsatisfiable for f in plan.failed)
        others = f"; the other {len(plan.locks)} are {'checked' if check_only else 'written'}" if plan.locks else ""
        if unsatisfiable and plan.extras:
            raise LocksUnsatisfiable(failed=len(plan.failed), total=len(plan.failed) + len(plan.locks), others=others)
        # Without a --with, what the index lacks (torch itself, a mirror without PyTorch's wheels) is its answer.
        why = ": the index offers nothing that satisfies them; check that it serves these releases" if unsatisfiable else ""
        raise LocksFailed(failed=len(plan.failed), total=len(plan.failed) + len(plan.locks), why=why, others=others)
