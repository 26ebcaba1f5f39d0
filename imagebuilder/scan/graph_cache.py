"""The main suite's dependency graph, kept on disk from one command to the next.

Every build and publish reads its base's OS state (updates.py): the security suite's index
(~2.5 MB of text, what changes overnight: always read anew) and the main suite's (~50 MB of
text, ~9 MB of xz, 60,000 paragraphs: ~2 s to fetch and parse, and it changes only at a point
release), for the dependency graph alone. So the main suite's graph is kept, keyed by the
SHA256 that the suite's Release file (InRelease, else Release) gives its Packages index: a
command then reads the Release (~150 kB) and the graph (~3 MB of JSON), and a new point
release (another SHA256) is fetched, checked against that SHA256, parsed and kept anew.

A mirror with no Release file (a bare test repository) is read as before, every time. The
folder is $IMAGEBUILDER_CACHE_DIR, else $XDG_CACHE_HOME/imagebuilder, else
~/.cache/imagebuilder; a folder that cannot be written costs only the time (the graph is made,
not kept).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ..atomic import write_atomic
from .fixes import Graph, dependency_graph
from .mirror import INDEX_FORMATS, Get, MirrorError, NotFound, index_text
from .release import Suite

FORMAT = 1  # of the JSON written: another FORMAT is another file name, never misread
_SHA256_LINE = re.compile(r"^\s+([0-9a-f]{64})\s+\d+\s+(\S+)$")


def cache_folder() -> Path:
    """Where imagebuilder keeps what it may read again (see the module's docstring)."""
    if folder := os.environ.get("IMAGEBUILDER_CACHE_DIR"):
        return Path(folder)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "imagebuilder"


def release_sha256(get: Get, suite: Suite) -> dict[str, str]:
    """The SHA256 section of the suite's InRelease (or Release): path under dists/SUITE -> sha256;
    {} when the mirror has neither."""
    for name in ("InRelease", "Release"):
        try:
            text = get(f"{suite.base}/dists/{suite.suite}/{name}").decode("utf-8", "replace")
        except NotFound:
            continue
        found: dict[str, str] = {}
        section = ""
        for line in text.splitlines():
            if line and not line[0].isspace():
                section = line.split(":", 1)[0]
            elif section == "SHA256" and (match := _SHA256_LINE.match(line)):
                found[match.group(2)] = match.group(1)
        return found
    return {}


class MainGraphs:
    """suite, arch -> the dependency graph of the suite's Packages index, from the folder when
    its Release names the same index."""

    def __init__(self, get: Get, folder: Path | None = None) -> None:
        self.get = get
        self.folder = cache_folder() / "apt-graphs" if folder is None else folder

    def __call__(self, suite: Suite, arch: str) -> Graph:
        listed = release_sha256(self.get, suite)
        for suffix, decompress in INDEX_FORMATS:
            relative = f"{suite.component}/binary-{suite.arch}/Packages{suffix}"
            if relative not in listed:
                continue
            path = self.folder / f"{suite.suite}-{arch}-v{FORMAT}-{listed[relative]}.json"
            if (graph := _load(path)) is not None:
                return graph
            url = f"{suite.base}/dists/{suite.suite}/{relative}"
            data = self.get(url)
            if hashlib.sha256(data).hexdigest() != listed[relative]:
                raise MirrorError(url=url, reason=f"its sha256 is not the one the suite's Release names "
                                                  f"({listed[relative]}): the mirror changed mid-read? rerun")
            graph = dependency_graph((decompress(data).decode("utf-8", "replace"),), arch)
            _store(path, graph)
            return graph
        return dependency_graph((index_text(self.get, suite),), arch)


def merged(main: Graph, *more: Graph) -> Graph:
    """One graph of several indexes, as dependency_graph of their texts together makes it (the
    main suite's 60,000 entries copied once, the others' added)."""
    depends, provides = dict(main.depends), dict(main.provides)
    for graph in more:
        for name, wanted in graph.depends.items():
            depends[name] = depends.get(name, frozenset()) | wanted
        for virtual, names in graph.provides.items():
            provides[virtual] = provides.get(virtual, frozenset()) | names
    return Graph(depends, provides)


def _load(path: Path) -> Graph | None:
    try:
        doc = json.loads(path.read_bytes())
        return Graph({k: frozenset(v) for k, v in doc["depends"].items()},
                     {k: frozenset(v) for k, v in doc["provides"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, or not what this version writes: made again


def _store(path: Path, graph: Graph) -> None:
    """Write the graph; the suite's older ones (an earlier point release) go."""
    doc = {"depends": {k: sorted(v) for k, v in graph.depends.items()},
           "provides": {k: sorted(v) for k, v in graph.provides.items()}}
    try:
        write_atomic(path, json.dumps(doc, separators=(",", ":")))
        suite_arch = path.name.rsplit("-v", 1)[0]
        for older in path.parent.glob(f"{suite_arch}-v*.json"):
            if older != path:
                older.unlink(missing_ok=True)
    except OSError:
        pass  # a folder that cannot be written: the graph is made again next time
