"""The compile caches' folder (the parent of the image's TORCHINDUCTOR_CACHE_DIR): this uid can
write it, and whether it outlives the container (a volume keeps it) or goes with it.

Needs no torch: the folder is read from the environment, as torch reads it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from ..context import Context
from ..result import Result, failed, passed, skipped

NAME = "cache"
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
# The caches the images name, each of which torch (or the CUDA driver) writes into when it is there.
CACHE_ENVS = (INDUCTOR_ENV, "TRITON_CACHE_DIR", "CUDA_CACHE_PATH")
MOUNTINFO = "/proc/self/mountinfo"
# File systems whose files go with the container (its writable layer) or with the machine's memory.
EPHEMERAL = frozenset({"overlay", "aufs", "fuse-overlayfs", "tmpfs", "ramfs"})
# Files Docker and Podman put in every container: its / is its own layer, whatever the storage
# driver's file system (btrfs, zfs, vfs look like any disk).
CONTAINER_MARKERS = ("/.dockerenv", "/run/.containerenv")


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str


def _unescape(field: str) -> str:
    r"""The kernel writes a space in a mount point as \040 (tab \011, newline \012, backslash \134)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def parse_mountinfo(text: str) -> List[Mount]:
    """The mounts of /proc/PID/mountinfo, in its order (a later mount at the same point covers an
    earlier one): `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER`."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if len(fields) > separator + 1 and len(fields) > 4:
            mounts.append(Mount(_unescape(fields[4]), fields[separator + 1]))
    return mounts


def mount_of(path: str, mounts: Sequence[Mount]) -> Optional[Mount]:
    """The mount that holds `path` (absolute, links resolved): the deepest mount point above it."""
    found: Optional[Mount] = None
    for mount in mounts:
        point = mount.point.rstrip("/") or "/"
        inside = path == point or path.startswith(point if point == "/" else point + "/")
        if inside and (found is None or len(point) >= len(found.point.rstrip("/") or "/")):
            found = mount
    return found


def read_mounts(mountinfo: str = MOUNTINFO) -> Optional[List[Mount]]:
    try:
        with open(mountinfo) as f:
            return parse_mountinfo(f.read())
    except OSError:
        return None  # not Linux (verify --local on a Mac): whether it is kept is unknown


def write_probe(folder: str) -> Optional[str]:
    """None when this process can create (and remove) a file in `folder`; else why not."""
    try:
        handle, path = tempfile.mkstemp(prefix=".smoke-tests-", dir=folder)
    except OSError as e:
        return e.strerror or type(e).__name__
    os.close(handle)
    os.unlink(path)
    return None


def _existing(path: str) -> str:
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _owner(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def kept(mount: Mount, in_container: bool) -> bool:
    """Whether what is written on `mount` outlives the container: a volume or a host folder, not
    the container's own layer nor memory. Outside a container (verify --local) / is the disk."""
    if mount.point == "/" and in_container:
        return False
    return mount.fstype not in EPHEMERAL


def check(ctx: Context, mountinfo: str = MOUNTINFO, container_markers: Sequence[str] = CONTAINER_MARKERS) -> Result:
    setting = os.environ.get(INDUCTOR_ENV)
    if not setting:
        # An image imagebuilder did not build: nothing it promised, so nothing to fail.
        return skipped(NAME, f"{INDUCTOR_ENV} is not set (an image imagebuilder did not build, or a Python outside "
                             "one): torch.compile caches in /tmp/torchinductor_<user>, which goes with a container")
    folder = os.path.dirname(os.path.abspath(setting))
    uid = os.getuid()
    exists = os.path.isdir(folder)
    # Where torch would make it, when it is not there yet (a variable set by hand).
    writable_at = folder if exists else _existing(folder)
    measurements: Dict[str, Any] = {"folder": folder, "uid": uid, "exists": exists}
    why = write_probe(writable_at)
    measurements["writable"] = why is None
    if why is not None:
        return failed(NAME, f"{folder} is not writable by uid {uid} ({writable_at}: {why}): torch.compile cannot "
                            f"keep its kernels; mount a volume there (docker run -v torch-cache:{folder}: a new "
                            f"named volume takes the image's mode 1777) or point {INDUCTOR_ENV} and "
                            "TRITON_CACHE_DIR at a folder this uid can write", **measurements)
    # A volume that another uid filled first: the folder is open to all, what that uid made is not.
    closed: List[str] = []
    for name in CACHE_ENVS:
        path = os.environ.get(name)
        if path and os.path.isdir(path) and write_probe(path) is not None:
            owner = _owner(path)
            closed.append(f"{path} ({name}, owned by uid {owner})")
    measurements["not_writable"] = closed
    if closed:
        return failed(NAME, f"not writable by uid {uid}: {', '.join(closed)}: another uid filled this cache; run "
                            "as that uid, or give this one a volume of its own (or empty this one)", **measurements)
    mounts = read_mounts(mountinfo)
    mount = mount_of(os.path.realpath(folder), mounts) if mounts is not None else None
    measurements["mount_point"] = mount.point if mount else None
    measurements["fstype"] = mount.fstype if mount else None
    in_container = any(os.path.exists(marker) for marker in container_markers)
    measurements["kept"] = None if mount is None else kept(mount, in_container)
    state = "writable" if exists else f"does not exist yet (torch makes it; {writable_at} writable)"
    if mount is None:
        return passed(NAME, f"{folder} {state}; whether a volume keeps it is unknown (no {mountinfo})",
                      **measurements)
    where = f"{mount.fstype} at {mount.point}"
    if measurements["kept"] and mount.point != "/":
        return passed(NAME, f"{folder} {state}; a volume ({where}): compiled kernels outlive the container",
                      **measurements)
    if measurements["kept"]:  # verify --local: this machine's own disk
        return passed(NAME, f"{folder} {state}; on this machine's disk ({where}): compiled kernels stay",
                      **measurements)
    return passed(NAME, f"{folder} {state}; not a volume ({where}: lost with the container; mount one to keep "
                        f"compiled kernels across containers: docker run -v torch-cache:{folder})", **measurements)
