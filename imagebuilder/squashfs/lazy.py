"""`imagebuilder squashfs IMAGE --lazy -o FILE`: the published squashfs as FILE at once, its bytes
fetched from the registry only as they are read, every chunk checked against the signed chunk
table before it is served.

FILE (a regular file, made empty where missing) is mounted over by nbdfuse (Debian's
libnbd-bin), whose NBD server is nbdkit (nbdkit, nbdkit-plugin-python) running
nbdkit_plugin.py: range GETs on the blob into a sparse cache file (chunk_cache.py). The cache,
the table and the two tools' log lie in `.FILE.lazy/` beside FILE. The mount outlives the
command (pyxis's squashfuse reads FILE while the job runs); `imagebuilder squashfs-release FILE`
unmounts it (nbdfuse and nbdkit exit) and removes FILE and its folder.

An artifact published before the chunk table was (no second blob) cannot be checked chunk by
chunk: the command says so and downloads it whole (fetch.py), as without --lazy.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import interrupts
from ..errors import BadRequest, ImageBuilderError
from ..platforms import DEFAULT_PLATFORM
from ..registry.heartbeat import every
from ..registry.retry import REGISTRY_POLICY
from ..trust.cosign import Cosign
from .artifact import chunk_layer
from .chunks import parse_table
from .fetch import (AlreadyServed, FetchError, Fetched, FetchRegistry, check_space, checked_artifact,
                    download_squashfs, work_folder)
from .make import HEARTBEAT_S, ToolMissing, human

PLUGIN = Path(__file__).with_name("nbdkit_plugin.py")
READY_TIMEOUT_S = 60.0
LOG_RESERVE = 64 << 10
"""Bytes of the log allocated before the tools write to it (from its start: NULs follow their words)."""
PYTHON_ERROR = re.compile(r"^[A-Za-z_.]*(Error|Exception)\b.*: ")
TOOLS = (("nbdfuse", "libnbd-bin"), ("nbdkit", "nbdkit"), ("fusermount3", "fuse3"))


class MountFailed(FetchError):
    template = "nbdfuse could not serve {image}'s squashfs at {path}: {detail} (log: {log})"


class NotServable(BadRequest):
    template = "squashfs-release {path}: a folder, not a file that `imagebuilder squashfs --lazy` serves; give that FILE"


class NotYours(ImageBuilderError):
    template = "cannot release {path}: {detail}; it was served by another user, who releases it"


@dataclass(frozen=True)
class Mounted:
    path: Path
    image: str
    artifact: str
    size: int
    seconds: float
    log: Path


def failed_log(output: Path) -> Path:
    """Where the log of a mount that failed is kept, beside FILE (its folder is removed)."""
    return output.parent / f".{output.name}.lazy.log"


def require_tools() -> None:
    for tool, package in TOOLS:
        if shutil.which(tool) is None:
            raise ToolMissing(tool=tool, package=package)
    plugin = subprocess.run(["nbdkit", "--dump-plugin", "python"], capture_output=True, text=True, timeout=60,
                            env=nbdkit_env())
    if plugin.returncode != 0:
        raise ToolMissing(tool="nbdkit's python plugin", package="nbdkit-plugin-python")


def nbdkit_env() -> dict[str, str]:
    """This environment for nbdkit, whose embedded Python finds its standard library from the
    first `python3` on PATH: an activated venv's, a pyenv's, a conda's or a `module load`'s
    would load that Python's library into the system's (`undefined symbol: _PyModule_Add`). So
    nbdkit's own folder, where its distribution's python3 lies, comes first; and PYTHONPATH is
    only imagebuilder's folder."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONHOME", "VIRTUAL_ENV")}
    folder = os.path.dirname(os.path.realpath(shutil.which("nbdkit") or "/usr/bin/nbdkit"))
    return {**env, "PATH": os.pathsep.join([folder, env.get("PATH", "")]), "PYTHONPATH": str(PLUGIN.parents[2])}


def mount_lazy(registry: FetchRegistry, image: str, output: Path, *, key: str | None = None,
               platform: str = DEFAULT_PLATFORM, cosign: Cosign | None = None,
               timeout_s: float = REGISTRY_POLICY.timeout_s, say: Callable[[str], None]) -> Mounted | Fetched:
    """FILE serving `image`'s squashfs lazily; the whole file downloaded where the artifact has no table."""
    require_tools()
    if work_folder(output).exists():
        raise AlreadyServed(path=output)
    started = time.monotonic()
    target, artifact, layer = checked_artifact(registry, image, key=key, platform=platform, cosign=cosign, say=say)
    table_layer = chunk_layer(registry, artifact)
    if table_layer is None:
        say(f"{image}: its squashfs was published without a chunk table (before imagebuilder could read it "
            "lazily), so it cannot be checked chunk by chunk; downloading it whole")
        return download_squashfs(registry, image, output, target, artifact, layer, started=started, say=say)
    blob, size = str(layer["digest"]), int(layer.get("size") or 0)
    check_space(output.parent, size, image)  # the cache grows to the whole file as it is read
    body = io.BytesIO()
    registry.download_blob(target, str(table_layer["digest"]), body)
    if "sha256:" + hashlib.sha256(body.getvalue()).hexdigest() != table_layer["digest"]:
        raise FetchError(f"the chunk table of {image}'s squashfs arrived corrupted; try again")
    parse_table(body.getvalue(), str(table_layer["digest"]), size)  # refused here, not in nbdkit
    folder = work_folder(output)
    try:
        folder.mkdir(mode=0o700)
    except OSError as e:
        raise FetchError(f"cannot make {folder} beside {output} for its cache: {e.strerror}; give -o a file in a "
                         "folder you can write") from e
    made = not output.exists()
    log = folder / "log"
    try:
        (folder / "chunks.json").write_bytes(body.getvalue())
        output.touch(0o644)
        process = _start(f"{target.partition('@')[0]}@{blob}", size, folder, output, log, timeout_s)
        _wait_ready(image, output, folder / "pid", process, log, say)
        interrupts.settle()  # served: an interrupt before this line unmounts, one after it is ignored
    except BaseException:
        _unmount(output)
        if log.exists():  # the tools' words outlive the failed mount: its message names this file
            with contextlib.suppress(OSError):
                failed_log(output).write_text(_read_log(log))
        shutil.rmtree(folder, ignore_errors=True)
        if made:
            output.unlink(missing_ok=True)
        raise
    say(f"{image}: its squashfs ({human(size)}) is served at {output}; chunks are fetched as they are read "
        f"(release it with `imagebuilder squashfs-release {output}`)")
    return Mounted(output, target, artifact, size, time.monotonic() - started, log)


def _start(ref: str, size: int, folder: Path, output: Path, log: Path,
           timeout_s: float) -> subprocess.Popen[bytes]:
    """nbdfuse over FILE with nbdkit under it, in a session of their own: they outlive the command."""
    argv = ["nbdfuse", "-r", "-P", str(folder / "pid"), str(output), "--command",
            "nbdkit", "-s", "--exit-with-parent", "--threads", "16", "python", str(PLUGIN),
            f"ref={ref}", f"size={size}", f"table={folder / 'chunks.json'}", f"cache={folder / 'cache'}",
            f"timeout={timeout_s:g}"]
    with open(log, "wb") as out:
        with contextlib.suppress(OSError):  # taken now: a disk the cache fills up later still takes their words
            os.posix_fallocate(out.fileno(), 0, LOG_RESERVE)
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=nbdkit_env(),
                                start_new_session=True, close_fds=True)


def _wait_ready(image: str, output: Path, pidfile: Path, process: subprocess.Popen[bytes], log: Path,
                say: Callable[[str], None]) -> None:
    """Until nbdfuse wrote its pid file and FILE reads as a squashfs."""
    started = time.monotonic()
    with every(HEARTBEAT_S, lambda: say(f"{image}: waiting for nbdfuse ({time.monotonic() - started:.0f} s)"),
               name="squashfs-heartbeat"):
        while not pidfile.exists():
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise MountFailed(image=image, path=output, detail=f"not ready within {READY_TIMEOUT_S:g} s",
                                  log=failed_log(output))
            if process.poll() is not None:
                raise MountFailed(image=image, path=output, detail=_last_line(log), log=failed_log(output))
            time.sleep(0.05)
    try:
        with open(output, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise MountFailed(image=image, path=output, detail=f"reading it: {e.strerror}; {_last_line(log)}",
                          log=failed_log(output)) from e
    if magic != b"hsqs":
        raise MountFailed(image=image, path=output, detail="it does not start as a squashfs",
                          log=failed_log(output))


def _read_log(log: Path) -> str:
    return log.read_text(errors="replace").replace("\0", "") if log.exists() else ""


def _last_line(log: Path) -> str:
    """The line of the log that says why: the plugin's `error: ...`, else a Python exception's
    (nbdkit could not load the plugin), else nbdkit's, else the last (nbdfuse's, mostly "server
    disconnected unexpectedly", which says nothing of the cause)."""
    lines = [line.strip() for line in _read_log(log).splitlines() if line.strip()]
    for wanted in (lambda line: line.startswith("error: "), PYTHON_ERROR.match, lambda line: "nbdkit: error" in line):
        found = [line for line in lines if wanted(line)]
        if found:
            return found[-1][-300:]
    return (lines or ["it stopped without a word"])[-1][-300:]


def _unmount(output: Path) -> bool:
    """fusermount3 -u FILE (nbdfuse, then nbdkit, exit); False where nothing was mounted there."""
    done = subprocess.run(["fusermount3", "-u", str(output)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "not found" not in done.stderr and "not mounted" not in done.stderr \
            and "Invalid argument" not in done.stderr:
        # Busy (a reader still has it): detach it now, the tools exit when the last reader goes.
        subprocess.run(["fusermount3", "-u", "-z", str(output)], capture_output=True, timeout=60, check=False)
    return done.returncode == 0


def release(output: Path) -> bool:
    """Unmount FILE and remove it and its folder, where `squashfs --lazy` served it (its folder
    beside it holds the chunk table); True where something was released. Anything else at FILE
    (a file it did not serve, another mount) is left alone. Safe to repeat."""
    if str(output) in ("", ".") or output.is_dir():
        raise NotServable(path=output)
    folder = work_folder(output)
    try:
        if not (folder / "chunks.json").is_file():
            return False
        _unmount(output)
        pidfile = folder / "pid"
        if pidfile.exists():
            _wait_gone(pidfile)
        shutil.rmtree(folder)
        output.unlink(missing_ok=True)
    except PermissionError as e:
        raise NotYours(path=output, detail=e.strerror) from e
    return True


def _wait_gone(pidfile: Path, timeout_s: float = 30.0) -> None:
    """Until nbdfuse (whose pid the file holds) has exited, so its cache is closed."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):  # exited; its parent (a test's process) has not reaped it yet
            return
        time.sleep(0.05)
