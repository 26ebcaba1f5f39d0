"""What a render is asked for besides the image's BuildSpec: the repository, the package index,
a CA bundle, the builder, extras and the locks (RenderOptions). The command line's rendering
options (options.rendering) parse into one; pipeline.render_options completes it for a command."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..lock.lockfile import LockSet
from ..scan.fixes import OsState

DEFAULT_SOURCE = "imagebuilder"


@dataclass(frozen=True)
class RenderOptions:
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
    # The image's platform when BuildKit builds it on a host of another (linux/arm64 on an amd64
    # host): its wheels install on the host, natively, instead of under emulation.
    foreign_platform: str | None = None
    # The platform the image is built for: its release's CUDA wheels are checked for it (None:
    # the host's, unchecked); `platform_tags`: its tags end in -{arch} (another platform than
    # the host's, or every platform of publish --platform).
    platform: str | None = None
    platform_tags: bool = False
    # The mirror of the OS's security suite the image's apt step reads (None: the OS's own,
    # scan/release.py), and what was read of each base image's OS for this platform
    # (scan.updates.OsStates): the security fixes its image holds. Empty: none known (`render`).
    security_mirror: str | None = None
    os_states: Mapping[str, OsState] = field(default_factory=dict)
