"""Pure: which of the OS's security fixes an image built on a base will hold (`fixes_for`).

An image holds its base's packages and what the template's `apt-get install` adds, with their
dependencies. `OsState` is what the plan needs to know of one base on one architecture: the
base's dpkg status, the security suite's newest binaries, and the dependency graph of the OS's
archive (its main suite and the security suite). `fixes_for` follows Depends and Pre-Depends
from the installed packages (every alternative, every provider of a virtual package: what apt
might choose), so the answer may name a fix the image does not get, never leave one out; the
build checks only the packages that are installed.

The answer is rendered into the image's apt step: `upgrades` are the base's packages to take
from the security suite, `expected` the version each fixed package must have at least. Same
fixes, same text; a new fix that reaches the image, another text and so another inputs hash.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .debian import DebVersion, Package

# "libc6 (>= 2.36), libssl3 | libssl1.1, python3:any" -> every name, alternatives and all.
_NAME = re.compile(r"(?:^|[,|])\s*([a-z0-9][a-z0-9+.-]*)")


@dataclass(frozen=True)
class Graph:
    """What each binary may pull in: its Depends and Pre-Depends (every alternative), a virtual
    package standing for every binary that provides it."""

    depends: Mapping[str, frozenset[str]] = field(default_factory=dict)
    provides: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def pulls(self, name: str) -> set[str]:
        return {n for target in self.depends.get(name, ()) for n in self.provides.get(target, frozenset()) | {target}}


def dependency_graph(indexes: Iterable[str], arch: str) -> Graph:
    """The graph of the binaries of `arch` (or all) that the Packages index texts offer. A whole
    archive's index is 60,000 paragraphs: only four fields are read, in one pass over the lines
    (Packages indexes write each on one line)."""
    depends: dict[str, set[str]] = {}
    provides: dict[str, set[str]] = {}

    def add(name: str, package_arch: str, wanted: list[str], provided: list[str]) -> None:
        if name and package_arch in (arch, "all"):
            depends.setdefault(name, set()).update(wanted)
            for virtual in provided:
                provides.setdefault(virtual, set()).add(name)

    for text in indexes:
        name, package_arch, wanted, provided = "", "", list[str](), list[str]()
        for line in text.splitlines():
            if not line:
                add(name, package_arch, wanted, provided)
                name, package_arch, wanted, provided = "", "", [], []
            elif line.startswith("Package:"):
                name = line[8:].strip()
            elif line.startswith("Architecture:"):
                package_arch = line[13:].strip()
            elif line.startswith(("Depends:", "Pre-Depends:")):
                wanted += _NAME.findall(line.partition(":")[2])
            elif line.startswith("Provides:"):
                provided += _NAME.findall(line[9:])
        add(name, package_arch, wanted, provided)
    return Graph({k: frozenset(v) for k, v in depends.items()}, {k: frozenset(v) for k, v in provides.items()})


@dataclass(frozen=True)
class OsState:
    """One base image's OS on one architecture, as the plan sees it."""

    suite: str  # the security suite, e.g. bookworm-security
    arch: str
    installed: Mapping[str, DebVersion] = field(repr=False)  # the base's binaries
    security: Mapping[str, Package] = field(repr=False)  # the security suite's newest binary of each name
    graph: Graph = field(repr=False)


@dataclass(frozen=True)
class Fixes:
    upgrades: tuple[str, ...] = ()
    """The base's binaries the security suite has newer: `apt-get install --only-upgrade` them."""
    expected: tuple[tuple[str, str], ...] = ()
    """(binary, version): each fixed binary the image may hold, and the version it must have at least."""


def holds(state: OsState, packages: Iterable[str]) -> set[str]:
    """The binaries an image on this base with `packages` installed may hold."""
    seen = set(state.installed)
    todo = [name for name in packages if name not in seen]
    seen |= set(todo)
    while todo:
        for target in state.graph.pulls(todo.pop()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def fixes_for(state: OsState, packages: Iterable[str]) -> Fixes:
    """The security suite's fixes an image on this base with `packages` installed holds."""
    upgrades, expected = [], []
    for name in sorted(holds(state, packages)):
        fixed = state.security.get(name)
        if fixed is None:
            continue
        have = state.installed.get(name)
        if have is not None and not have < fixed.version:
            continue  # the base has it already
        if have is not None:
            upgrades.append(name)
        expected.append((name, str(fixed.version)))
    return Fixes(tuple(upgrades), tuple(expected))


def newest_by_name(index: Mapping[tuple[str, str], Package], arch: str) -> dict[str, Package]:
    """A Packages index (scan.debian.available) narrowed to `arch` and Architecture: all, by name."""
    return {name: package for (name, package_arch), package in index.items() if package_arch in (arch, "all")}
