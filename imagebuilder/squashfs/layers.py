"""An image's layers applied in order into a folder: its root as an overlay mount shows it.

The OCI image spec's rules (image-spec layer.md), as containerd and enroot apply them: a
`.wh.NAME` entry removes NAME of the layers below; `.wh..wh..opq` in a folder hides everything
the layers below put there; an entry replaces what was at its path (a file over a folder
removes the folder), a folder over a folder keeps its contents. Hard links and symbolic links
are kept as links; device nodes are left out (enroot's import leaves out dev/*; a runtime mounts
its own /dev), and so are eStargz's and zstd:chunked's TOC and landmarks in the root. Owners are not kept: the squashfs is made with `mksquashfs -all-root`.

`entry_path()` and `whiteout()` are the pure decisions; `apply_layer()` the thin I/O over a tar
stream, never writing outside the root (an entry under a symbolic link is refused).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ..errors import ImageBuilderError
from ..estargz.toc import RESERVED

LAZY_FORMAT_ENTRIES = RESERVED
"""The TOC and landmarks eStargz and zstd:chunked layers carry in their root, which no runtime
shows (the stargz snapshotter hides them): not files of the image."""
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
CHUNK = 1 << 20


class UnsafeLayer(ImageBuilderError):
    template = "layer {layer} is unsafe to apply: {detail}; the image was not built by a tool that writes OCI layers"


def entry_path(name: str) -> str:
    """A tar member's name as a path relative to the root ('' for the root itself); ValueError
    for a name that leaves the root."""
    path = posixpath.normpath(name.lstrip("/") or ".")
    if path == ".." or path.startswith("../"):
        raise ValueError(f"{name!r} leaves the root")
    return "" if path == "." else path


def whiteout(path: str) -> tuple[str, str] | None:
    """('opaque', FOLDER) or ('remove', PATH) for a whiteout entry; None for any other."""
    folder, base = posixpath.split(path)
    if base == OPAQUE:
        return "opaque", folder
    if base.startswith(WHITEOUT):
        return "remove", posixpath.join(folder, base[len(WHITEOUT):])
    return None


@dataclass
class Applied:
    """What the layers applied so far left to do at the end: folder modes and times, set last
    (a read-only folder would refuse the entries of the layers above it)."""

    folders: dict[str, tuple[int, float]] = field(default_factory=dict)
    files: int = 0
    bytes: int = 0


def apply_layer(stream: IO[bytes], root: Path, applied: Applied, name: str,
                on_entry: Callable[[int], None] | None = None) -> None:
    """Apply the uncompressed tar `stream` (layer `name`, for errors) over `root`."""
    added: set[str] = set()
    with tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK) as tar:
        for member in tar:
            try:
                path = entry_path(member.name)
            except ValueError as e:
                raise UnsafeLayer(layer=name, detail=str(e)) from e
            _check_parents(root, path, name)
            mark = whiteout(path)
            if mark is not None:
                kind, target = mark
                if kind == "opaque":
                    _empty(root, target, added)
                elif target not in added:
                    _remove(root / target)
                    applied.folders.pop(target, None)
                continue
            if path == "":
                applied.folders[path] = (member.mode, member.mtime)
                continue
            if path.startswith("dev/") or member.ischr() or member.isblk() or path in LAZY_FORMAT_ENTRIES:
                continue
            _write(tar, member, root, path, applied, name)
            added.add(path)
            if on_entry is not None:
                on_entry(member.size if member.isreg() else 0)


def finish(root: Path, applied: Applied) -> None:
    """Folder modes and times, deepest first, once every layer is applied."""
    for path, (mode, mtime) in sorted(applied.folders.items(), key=lambda item: -item[0].count("/")):
        target = root / path if path else root
        if target.is_dir() and not target.is_symlink():
            os.chmod(target, stat.S_IMODE(mode))
            os.utime(target, (mtime, mtime))


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path, path: str, applied: Applied,
           name: str) -> None:
    target = root / path
    existing = _lstat(target)
    if existing is not None and not (member.isdir() and stat.S_ISDIR(existing.st_mode)):
        _remove(target)
    if member.isdir():
        target.mkdir(mode=0o755, exist_ok=True)
        applied.folders[path] = (member.mode, member.mtime)
        return
    applied.folders.pop(path, None)
    if member.isreg():
        source = tar.extractfile(member)
        assert source is not None
        with open(target, "xb") as out:
            shutil.copyfileobj(source, out, CHUNK)
        os.chmod(target, stat.S_IMODE(member.mode))
        os.utime(target, (member.mtime, member.mtime))
        applied.files += 1
        applied.bytes += member.size
    elif member.issym():
        os.symlink(member.linkname, target)
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)
    elif member.islnk():
        try:
            source_path = entry_path(member.linkname)
        except ValueError as e:
            raise UnsafeLayer(layer=name, detail=f"hard link {path}: {e}") from e
        _check_parents(root, source_path, name)
        source_file = root / source_path
        found = _lstat(source_file)
        if found is None or stat.S_ISDIR(found.st_mode):
            raise UnsafeLayer(layer=name, detail=f"hard link {path} names {member.linkname!r}, which is no file here")
        os.link(source_file, target, follow_symlinks=False)
    elif member.isfifo():
        os.mkfifo(target, stat.S_IMODE(member.mode))


def _check_parents(root: Path, path: str, name: str) -> None:
    """Every folder above `path` is a real folder, or absent: nothing is written through a link."""
    current = root
    for part in path.split("/")[:-1]:
        current = current / part
        found = _lstat(current)
        if found is None:
            current.mkdir(mode=0o755)
        elif stat.S_ISLNK(found.st_mode):
            raise UnsafeLayer(layer=name, detail=f"{path} lies under the symbolic link {current.relative_to(root)}")
        elif not stat.S_ISDIR(found.st_mode):
            _remove(current)
            current.mkdir(mode=0o755)


def _empty(root: Path, folder: str, added: set[str]) -> None:
    """An opaque folder: what the layers below put in it goes, what this layer added stays."""
    target = root / folder if folder else root
    found = _lstat(target)
    if found is None or not stat.S_ISDIR(found.st_mode):
        return
    for child in list(target.iterdir()):
        relative = f"{folder}/{child.name}" if folder else child.name
        if relative not in added:
            _remove(child)
        elif child.is_dir() and not child.is_symlink():
            _empty(root, relative, added)


def _remove(target: Path) -> None:
    found = _lstat(target)
    if found is None:
        return
    if stat.S_ISDIR(found.st_mode):
        shutil.rmtree(target)
    else:
        target.unlink()


def _lstat(target: Path) -> os.stat_result | None:
    try:
        return target.lstat()
    except FileNotFoundError:
        return None
