"""Writing rendered build contexts into a folder without ever losing a user's files.

A folder is ours only when it is empty or carries the list of files imagebuilder wrote
there (OUTPUT_LIST). Anything else is refused: a project folder with a Dockerfile of its
own, a git checkout, a home directory. Replacing our own output touches only the files
the list names: files the user added beside them stay.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from ..atomic import NEW_FILE_MODE, write_atomic
from ..errors import BadRequest, ImageBuilderError

OUTPUT_LIST = ".imagebuilder-output.json"  # the files imagebuilder wrote into this folder
_FORMAT = 1


class ForeignFolder(BadRequest):
    template = ("{directory} is not empty and was not written by imagebuilder (no {marker}); "
                "give -o a new or empty folder: nothing was written")


class NotAFolder(BadRequest):
    template = "-o {directory}: {reason}; give -o a new or empty folder: nothing was written"


class OutputUnwritable(BadRequest):
    template = "cannot write into {directory} ({reason}); give -o a folder you can write"


class OutputFailed(ImageBuilderError):
    """The disk, not the request: full, over quota, or failing."""

    template = "writing into {directory} failed ({reason}); free some space and render again"


class LinkInOutput(BadRequest):
    template = ("{path} is a symbolic link (to {target}); imagebuilder writes only inside {directory} and "
                "does not follow links out of it: remove the link or choose another folder: nothing was written")


# The kernel's file systems: they take no files, whatever their permissions say.
PSEUDO_FILE_SYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs",
                                 "tracefs", "securityfs", "configfs", "pstore", "bpf", "mqueue", "fusectl"})
_DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})


class BadOutputList(BadRequest):
    template = ("{path} is not a list imagebuilder wrote ({reason}); remove it or choose another "
                "folder: nothing was written")


def owned_files(directory: Path) -> set[str] | None:
    """The files imagebuilder wrote into `directory`; None when the folder is not ours.

    An empty (or missing) folder is ours with no files."""
    if not directory.exists():
        return set()
    if not directory.is_dir():
        raise ForeignFolder(directory=directory, marker=OUTPUT_LIST)
    listing = directory / OUTPUT_LIST
    if not listing.is_file():
        return set() if not any(directory.iterdir()) else None
    try:
        document = json.loads(listing.read_text(encoding="utf-8"))
        files = document["files"]
        if document.get("format") != _FORMAT or not all(isinstance(f, str) for f in files):
            raise ValueError("unknown format")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadOutputList(path=listing, reason=str(e) or type(e).__name__) from e
    return {f for f in files if _is_inside(f)}


def _is_inside(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts


def check_output(directory: Path) -> Path:
    """-o refused before anything is rendered (a refusal after minutes of rendering, or after
    notes about what it rendered, says less): a folder, or a place for one, that is empty or ours."""
    check_target(directory.absolute())
    if owned_files(directory.absolute()) is None:
        raise ForeignFolder(directory=directory.absolute(), marker=OUTPUT_LIST)
    return directory


def write_tree(directory: Path, files: Mapping[str, bytes]) -> list[str]:
    """Write `files` (relative names) into `directory`, which must be empty or ours.

    Each file is written to a temporary name and renamed into place, and the list of what
    we wrote is replaced last, so an interrupted write leaves every file whole and the
    folder still recognisably ours. Files we wrote before and no longer render are
    removed (and returned, for the caller to say so); nothing else in the folder is touched."""
    directory = directory.absolute()
    check_target(directory)
    previous = owned_files(directory)
    if previous is None:
        raise ForeignFolder(directory=directory, marker=OUTPUT_LIST)
    for name in files:
        if not _is_inside(name) or name == OUTPUT_LIST:
            raise ValueError(f"refusing to write {name!r}: not a relative path inside the output folder")
    try:
        if not directory.exists():
            _write_new(directory, {**files, OUTPUT_LIST: _listing(files)})
            return []
        # An existing folder (empty, or ours) is written into and never replaced: it may be the
        # shell's working directory, a mount point, a link's target or a folder whose mode,
        # group and owner its user chose, under a parent they cannot write.
        for name in sorted(set(files) | previous):
            _refuse_links(directory, name)
        # The list names every file this run may leave before it writes one, so an interrupted
        # write leaves a folder that is still recognisably ours; the exact list comes last.
        write_atomic(directory / OUTPUT_LIST, _listing(set(files) | previous))
        for name in sorted(files):
            write_atomic(directory / name, files[name], _mode(files[name]))
        write_atomic(directory / OUTPUT_LIST, _listing(files))
        for stale in sorted(previous - set(files), reverse=True):
            path = directory / stale
            if path.is_file() or path.is_symlink():
                path.unlink()  # a link itself, never what it points to
            _remove_empty_parents(path.parent, directory)
    except OSError as e:
        error = OutputFailed if e.errno in _DISK_ERRORS else OutputUnwritable
        raise error(directory=directory, reason=f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from e
    return sorted(previous - set(files))


def _listing(files: Iterable[str]) -> bytes:
    return (json.dumps({"format": _FORMAT, "generator": "imagebuilder", "files": sorted(files)}, indent=2)
            + "\n").encode()


def _mode(data: bytes) -> int:
    return 0o755 if data.startswith(b"#!") else NEW_FILE_MODE  # COPY keeps the mode: a script must arrive executable


def check_target(directory: Path) -> None:
    """-o names a folder, or a place where one can be made: not a file, a device, or the
    kernel's /proc or /sys (which look like folders and take no files)."""
    if directory.exists() or directory.is_symlink():
        if not directory.is_dir():
            what = ("a symbolic link to nothing" if not directory.exists() else
                    "a device" if directory.is_char_device() or directory.is_block_device() else "a file")
            raise NotAFolder(directory=directory, reason=f"it is {what}, not a folder")
        ancestor = directory
    else:
        ancestor = directory.parent
        while not ancestor.exists() and not ancestor.is_symlink() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise NotAFolder(directory=directory, reason=f"{ancestor} is not a folder")
    kind = file_system_type(ancestor)
    if kind in PSEUDO_FILE_SYSTEMS:
        raise NotAFolder(directory=directory, reason=f"{ancestor} is on the kernel's {kind} file system, "
                                                     "which takes no files")


def file_system_type(path: Path, mounts: Path = Path("/proc/self/mounts")) -> str | None:
    """The type of the file system `path` is on (the longest mount point above it); None
    where the mount table cannot be read (not Linux)."""
    try:
        table = mounts.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _refuse_links(directory: Path, name: str) -> None:
    """A folder on the way to one of our files must be a real folder inside `directory`: a
    link (put there after we wrote it) would take our writes, and removals, elsewhere."""
    path = directory
    for part in PurePosixPath(name).parts[:-1]:
        path = path / part
        if path.is_symlink():
            raise LinkInOutput(path=path, target=os.readlink(path), directory=directory)


def _write_new(directory: Path, files: Mapping[str, bytes]) -> None:
    """A new folder: written beside it and renamed into place, so it appears whole."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        for name, data in files.items():
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(_mode(data))
        staging.chmod(0o755)
        os.rename(staging, directory)  # a folder made meanwhile stops us here (not empty: ENOTEMPTY)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _remove_empty_parents(folder: Path, top: Path) -> None:
    while folder != top and folder.is_relative_to(top):
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
