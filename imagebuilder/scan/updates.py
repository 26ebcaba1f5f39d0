"""`OsStates`: each base image's OsState (fixes.py), read once per command: the base's
/etc/os-release and dpkg status (through the engine, nothing run) and the Packages indexes of
its OS's main and security suites (through `get`, each URL fetched once per command; the main
suite's dependency graph is kept on disk between commands, graph_cache.py).

The security suite is at the security mirror (IMAGEBUILDER_SECURITY_MIRROR, --security-mirror;
release.py's defaults). The main suite, read only for the dependency graph, is at the archive
the mirror names: Debian's `.../debian-security` -> `.../debian`, any other mirror (Ubuntu's
archive, a local mirror) is taken to carry both suites.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

from .debian import available, installed
from .fixes import OsState, dependency_graph, newest_by_name
from .graph_cache import MainGraphs, merged
from .mirror import Get, index_text
from .release import Suite, os_release, security_suite
from ..platforms import platform_of_arch
from .run import DPKG_STATUS, CannotScan, ImageFiles

Say = Callable[[str], None]


class BaseFiles(ImageFiles, Protocol):
    def os_release(self, image: str) -> str:
        """The image's /etc/os-release, the image pulled first when it is not here (as its build would)."""
        ...


def cached(get: Get) -> Get:
    """`get` with each URL fetched once (a command's plan and its scans share the indexes)."""
    return functools.lru_cache(maxsize=None)(get)


def main_suite(security: Suite) -> Suite:
    """The OS's main suite (bookworm, noble) beside its security suite, on the archive the
    security mirror names."""
    base = security.base
    if base.endswith("-security"):
        base = base.removesuffix("-security")
    codename = security.suite.removesuffix("-security").removesuffix("/updates")
    return Suite(base, codename, security.component, security.arch)


class OsStates:
    """base image, Debian architecture -> its OsState, each read once."""

    def __init__(self, files: BaseFiles, get: Get, mirror: str | None, say: Say,
                 main_graphs: MainGraphs | None = None) -> None:
        self.files, self.get, self.mirror, self.say = files, get, mirror, say
        self.main_graphs = MainGraphs(get) if main_graphs is None else main_graphs
        self._done: dict[tuple[str, str], OsState] = {}

    def __call__(self, image: str, arch: str) -> OsState:
        if (image, arch) not in self._done:
            self._done[(image, arch)] = self._read(image, arch)
        return self._done[(image, arch)]

    def _read(self, image: str, arch: str) -> OsState:
        # The engine's errors (no daemon, a base that cannot be pulled) are the build's own: as they are.
        release = os_release(image, self.files.os_release(image))
        # The variant of the tag for `arch` (a base tag may hold several platforms: the host's
        # variant's packages are another architecture's, which the filter below would drop).
        status = self.files.read_file(image, DPKG_STATUS, platform=docker_platform(arch))
        if status is None:
            raise CannotScan(image=image, reason=f"it has no {DPKG_STATUS}")
        security = security_suite(release, arch, self.mirror)
        main = main_suite(security)
        self.say(f"security fixes for {image}: reading {security} and {main.suite}'s dependencies")
        security_text = index_text(self.get, security)
        graph = merged(self.main_graphs(main, arch), dependency_graph((security_text,), arch))
        base = {p.name: p.version for p in installed(status.decode("utf-8", "replace")) if p.arch in (arch, "all")}
        return OsState(security.suite, arch, base, newest_by_name(available(security_text), arch), graph)


def docker_platform(arch: str) -> str | None:
    """The engine's platform of a Debian architecture (the table's names match for amd64 and
    arm64); None for one the table lacks (the host's variant is read)."""
    platform = platform_of_arch(arch)
    return platform.name if platform is not None else None

