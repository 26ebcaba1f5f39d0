"""Writing a file so that a reader sees the old content or the new, never half of either.

The one helper every writer uses (locks, reports, matrix.yaml, rendered contexts): the data
goes to a temp file of a unique name beside the target, which replaces the target in one
rename; on any failure (a full disk, Ctrl-C) the temp file is removed and the target is
left as it was.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

NEW_FILE_MODE = 0o644


def write_atomic(path: Path, data: bytes | str, mode: int | None = None) -> Path:
    """Replace `path` with `data` (str: UTF-8) in one step. A file that exists keeps its mode
    unless `mode` is given; a new one gets `mode` or 0644 (mkstemp's 0600 is nobody's intent).
    Makes the parent folder."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = NEW_FILE_MODE
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, document: Any) -> Path:
    """A JSON document (a report, a list of files), indented, atomically."""
    return write_atomic(path, json.dumps(document, indent=2) + "\n")


def os_reason(e: OSError) -> str:
    """An OSError in a few words, with the path it concerns ("Read-only file system: locks/x.txt")."""
    return f"{e.strerror or e}: {e.filename}" if e.filename else str(e.strerror or e)
