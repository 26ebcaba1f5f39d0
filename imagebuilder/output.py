"""Writing rendered build contexts into a folder without ever losing a user's files.

A folder is ours only when it is empty or carries the list of files imagebuilder wrote
there (OUTPUT_LIST). Anything else is refused: a project folder with a Dockerfile of its
own, a git checkout, a home directory. Replacing our own output touches only the files
the list names: files the user added beside them stay.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from .atomic import write_atomic
from .errors import BadRequest

OUTPUT_LIST = ".imagebuilder-output.json"  # the files imagebuilder wrote into this folder
_FORMAT = 1


class ForeignFolder(BadRequest):
    template = ("{directory} is not empty and was not written by imagebuilder (no {marker}); "
                "give -o a new or empty folder: nothing was written")


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


def write_tree(directory: Path, files: Mapping[str, bytes]) -> None:
    """Write `files` (relative names) into `directory`, which must be empty or ours.

    Each file is written to a temporary name and renamed into place, and the list of what
    we wrote is replaced last, so an interrupted write leaves every file whole and the
    folder still recognisably ours. Files we wrote before and no longer render are
    removed; nothing else in the folder is touched."""
    directory = directory.absolute()
    previous = owned_files(directory)
    if previous is None:
        raise ForeignFolder(directory=directory, marker=OUTPUT_LIST)
    for name in files:
        if not _is_inside(name) or name == OUTPUT_LIST:
            raise ValueError(f"refusing to write {name!r}: not a relative path inside the output folder")
    listing = {"format": _FORMAT, "generator": "imagebuilder", "files": sorted(files)}
    listing_bytes = (json.dumps(listing, indent=2) + "\n").encode()
    if not previous and not (directory.exists() and any(directory.iterdir())):
        _write_new(directory, {**files, OUTPUT_LIST: listing_bytes})
        return
    directory.mkdir(parents=True, exist_ok=True)
    for name in sorted(files):
        write_atomic(directory / name, files[name])
    write_atomic(directory / OUTPUT_LIST, listing_bytes)
    for stale in sorted(previous - set(files), reverse=True):
        path = directory / stale
        if path.is_file() or path.is_symlink():
            path.unlink()
        _remove_empty_parents(path.parent, directory)


def _write_new(directory: Path, files: Mapping[str, bytes]) -> None:
    """A new (or empty) folder: written beside it and renamed into place, so it appears whole."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        for name, data in files.items():
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if data.startswith(b"#!"):  # COPY keeps the mode: a script must arrive executable
                path.chmod(0o755)
        staging.chmod(0o755)
        if directory.exists():
            directory.rmdir()  # empty, checked above; a file appearing meanwhile stops us here
        os.rename(staging, directory)
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
