"""What a render is asked for besides the image's BuildSpec, in two values: what the user asked
(RenderRequest: the repository, the package index, a CA bundle, a Python mirror, extras; the
command line's rendering options, options.rendering, parse into one), and what one image on one
platform renders with (RenderOptions: the request completed by for_command() with the builder,
the source and the matrix's locks, then per platform by per_platform.platform_options(), which sets
its Target: the platform and what depends on it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..engine.api import BuilderKind
from ..lock.lockfile import LockSet, load_locks, locks_dir
from ..matrix.model import Matrix
from ..scan.fixes import OsState
from .install_steps import Installer

DEFAULT_SOURCE = "imagebuilder"


@dataclass(frozen=True)
class RenderRequest:
    """What the user asked of every image a command renders (hashable: a value)."""

    repository: str | None = None  # None: the matrix's defaults.repository
    index_url: str | None = None  # replaces the wheel variant's index (mirrors, air-gapped sites)
    extra_index_urls: tuple[str, ...] = ()
    # --ca-bundle's certificates, read (and checked) once, when the option is parsed: trusted
    # inside the build only.
    ca_bundle: bytes | None = None
    python_mirror: str | None = None  # where `uv python install` downloads CPython (UV_PYTHON_INSTALL_MIRROR)
    extras: tuple[str, ...] = ()  # --with: added to the image's lock (besides matrix.yaml's extras)
    security_mirror: str | None = None  # the OS's security suite's mirror (None: the OS's own, scan/release.py)


@dataclass(frozen=True)
class Target:
    """The platform one image renders for, and what depends on it: set per platform by
    per_platform.platform_options() (and the OS states where a command reads them)."""

    # The platform the image is built for: its release's CUDA wheels are checked for it (None:
    # the host's, unchecked); `platform_tags`: its tags end in -{arch} (another platform than
    # the host's, or every platform of publish --platform).
    platform: str | None = None
    platform_tags: bool = False
    # The image's platform when BuildKit builds it on a host of another (linux/arm64 on an amd64
    # host): its wheels install on the host, natively, instead of under emulation.
    foreign_platform: str | None = None
    # What was read of each base image's OS for this platform (scan.updates.OsStates): the
    # security fixes its image holds. Empty: none known (`render`).
    os_states: Mapping[str, OsState] = field(default_factory=dict, hash=False)  # (compared, not hashed)


@dataclass(frozen=True)
class RenderOptions:
    """What one image renders with on one platform: the request's values, the builder's, the locks
    (the platform's, per_platform.platform_options) and the target. Hashable: build/per_platform's
    renders are keyed by it."""

    repository: str | None = None  # None: the matrix's defaults.repository
    index_url: str | None = None  # replaces the wheel variant's index (mirrors, air-gapped sites)
    extra_index_urls: tuple[str, ...] = ()
    # --ca-bundle's certificates, read (and checked) once, when the option is parsed: trusted
    # inside the build only.
    ca_bundle: bytes | None = None
    python_mirror: str | None = None  # where `uv python install` downloads CPython (UV_PYTHON_INSTALL_MIRROR)
    source: str = DEFAULT_SOURCE  # labels.SOURCE
    buildkit: bool = False  # for the BuildKit builder: the CA mounted per RUN, shared cache mounts
    # BuildKit through buildx: the CA bundle as a named build context (CA_CONTEXT), bind-mounted,
    # not a secret. A secret mount delays every RUN that has one by seconds, growing with the
    # layers below it (measured: 25 s over the eight torch layers); a bind mount does not.
    ca_context: bool = False
    extras: tuple[str, ...] = ()  # --with: added to the image's lock (besides matrix.yaml's extras)
    locks: LockSet = LockSet()  # locks/ beside the matrix; empty: resolve at build time
    # The mirror of the OS's security suite the image's apt step reads (None: the OS's own, scan/release.py).
    security_mirror: str | None = None
    target: Target = Target()

    @property
    def index_urls(self) -> tuple[str | None, ...]:
        """--index-url (None: the wheel variant's) and every --extra-index-url."""
        return (self.index_url, *self.extra_index_urls)

    @property
    def installer(self) -> Installer:
        """What the install RUNs take of these (install_steps)."""
        return Installer(buildkit=self.buildkit, ca_bundle=self.ca_bundle, index_url=self.index_url,
                         extra_index_urls=self.extra_index_urls, python_mirror=self.python_mirror)


def source_label() -> str:
    """The image's source label (labels.SOURCE): the repository CI builds from."""
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    return f"{server}/{repo}" if server and repo else DEFAULT_SOURCE


def for_command(matrix: Matrix, asked: RenderRequest, kind: BuilderKind, repository: str | None = None, *,
                buildx: bool = True) -> RenderOptions:
    """The options every image of a command renders with: what the command line asked
    (options.rendering), with the matrix's locks, for the builder `kind` that engine.select
    decided (the same for a dry run as for the run); `repository`: publish's, under its
    registry; `buildx`: BuildKit through buildx, which takes named build contexts (the CA
    bundle's), not an old CLI's built-in one."""
    return RenderOptions(repository=repository or asked.repository, index_url=asked.index_url,
                         extra_index_urls=asked.extra_index_urls, ca_bundle=asked.ca_bundle,
                         python_mirror=asked.python_mirror, extras=asked.extras, locks=load_locks(locks_dir(matrix)),
                         security_mirror=asked.security_mirror,
                         source=source_label(), buildkit=kind == "buildkit", ca_context=kind == "buildkit" and buildx)
