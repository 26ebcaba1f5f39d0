"""The order a layer's entries are written in: the start profile's files first, then the landmark.

As upstream's sortEntries (estargz/build.go): each profile path found in the layer moves to the
front, in the profile's order, after its parent folders and, for a hard link, after the file it
links to (an unpacker creates those first); then `.prefetch.landmark`; then every other entry in
the tar's order. Where no profile path is in the layer, `.no.prefetch.landmark` comes first, so the
snapshotter fetches nothing ahead for it. Names match whatever the tar's spelling ("./a", "a", "/a").
Whiteouts (`.wh.x`, `.wh..wh..opq`) are entries like any other: the TOC and an unpacker apply
them by name, not by position.

Where upstream differs, this follows what the snapshotter does with the result: a profile path
whose parent folder has no entry in this layer (it comes from a layer below) still moves (upstream
counts it missing; the reader makes the folder), and a profile none of whose paths is here gets
`.no.prefetch.landmark` (upstream writes `.prefetch.landmark` at offset ~0, which fetches as little).
As upstream, a name the tar repeats keeps its later entry, at that entry's position, and a landmark
or TOC already in the tar is dropped.
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .toc import NO_PREFETCH_LANDMARK, PREFETCH_LANDMARK, RESERVED, clean_name


@dataclass(frozen=True)
class Order:
    before: tuple[tarfile.TarInfo, ...]
    """Entries written before the landmark: the profile's files with their parents and link targets."""
    landmark: str
    """PREFETCH_LANDMARK, or NO_PREFETCH_LANDMARK where no profile path is in the layer."""
    after: tuple[tarfile.TarInfo, ...]
    found: tuple[str, ...]
    """The profile's paths this layer holds ("/a/b"), in the order written, each once."""


def prioritize(members: Iterable[tarfile.TarInfo], profile: Sequence[str]) -> Order:
    """The layer's `members` (in tar order) ordered for the start `profile` (image paths)."""
    remaining: dict[str, tarfile.TarInfo] = {}
    for info in members:
        name = clean_name(info.name)
        if name in RESERVED:
            continue
        remaining.pop(name, None)  # a repeated name: the later entry, at its own position
        remaining[name] = info
    moved: dict[str, tarfile.TarInfo] = {}
    found: list[str] = []
    for path in profile:
        name = clean_name(path)
        if name and (name in remaining or name in moved):
            _move(name, remaining, moved)
            if f"/{name}" not in found:
                found.append(f"/{name}")
    landmark = PREFETCH_LANDMARK if found else NO_PREFETCH_LANDMARK
    return Order(tuple(moved.values()), landmark, tuple(remaining.values()), tuple(found))


def _move(name: str, remaining: dict[str, tarfile.TarInfo], moved: dict[str, tarfile.TarInfo]) -> None:
    """Move `name` with what must precede it (parent folders up to the root, a hard link's target)."""
    if name:
        _move(clean_name(posixpath.dirname(name)), remaining, moved)
    info = remaining.get(name)
    if info is None:
        return
    if info.islnk():
        target = clean_name(info.linkname)
        if target != name:
            _move(target, remaining, moved)
    moved[name] = remaining.pop(name)
