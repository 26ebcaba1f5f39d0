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

import hashlib
import io
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ImageBuilderError
from ..platforms import DEFAULT_PLATFORM
from ..registry.heartbeat import every
from ..trust.cosign import Cosign
from .artifact import chunk_layer
from .chunks import parse_table
from .fetch import FetchError, Fetched, FetchRegistry, checked_artifact, download_squashfs
from .make import HEARTBEAT_S, ToolMissing, human

PLUGIN = Path(__file__).with_name("nbdkit_plugin.py")
READY_TIMEOUT_S = 60.0
TOOLS = (("nbdfuse", "libnbd-bin"), ("nbdkit", "nbdkit"), ("fusermount3", "fuse3"))


class MountFailed(FetchError):
    template = "nbdfuse could not serve {image}'s squashfs at {path}: {detail} (log: {log})"


class AlreadyServed(ImageBuilderError):
    template = "{path} is served already (by an earlier --lazy); release it first: imagebuilder squashfs-release {path}"


@dataclass(frozen=True)
class Mounted:
    path: Path
    image: str
    artifact: str
    size: int
    seconds: float
    log: Path


def work_folder(output: Path) -> Path:
    """The folder beside FILE with its cache, chunk table and log."""
    return output.parent / f".{output.name}.lazy"


def require_tools() -> None:
    for tool, package in TOOLS:
        if shutil.which(tool) is None:
            raise ToolMissing(tool=tool, package=package)
    plugin = subprocess.run(["nbdkit", "--dump-plugin", "python"], capture_output=True, text=True, timeout=60)
    if plugin.returncode != 0:
        raise ToolMissing(tool="nbdkit's python plugin", package="nbdkit-plugin-python")


def mount_lazy(registry: FetchRegistry, image: str, output: Path, *, key: str | None = None,
               platform: str = DEFAULT_PLATFORM, cosign: Cosign | None = None,
               say: Callable[[str], None]) -> Mounted | Fetched:
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
    try:
        (folder / "chunks.json").write_bytes(body.getvalue())
        output.touch(0o644)
        log = folder / "log"
        process = _start(f"{target.partition('@')[0]}@{blob}", size, folder, output, log)
        _wait_ready(image, output, folder / "pid", process, log, say)
    except BaseException:
        _unmount(output)
        shutil.rmtree(folder, ignore_errors=True)
        if made:
            output.unlink(missing_ok=True)
        raise
    say(f"{image}: its squashfs ({human(size)}) is served at {output}; chunks are fetched as they are read "
        f"(release it with `imagebuilder squashfs-release {output}`)")
    return Mounted(output, target, artifact, size, time.monotonic() - started, log)


def _start(ref: str, size: int, folder: Path, output: Path, log: Path) -> subprocess.Popen[bytes]:
    """nbdfuse over FILE with nbdkit under it, in a session of their own: they outlive the command."""
    # Only imagebuilder's own folder: nbdkit embeds the system's Python, whose standard library
    # must not be shadowed by this process's (a venv's or pyenv's build of it).
    env = {**os.environ, "PYTHONPATH": str(PLUGIN.parents[2])}
    argv = ["nbdfuse", "-r", "-P", str(folder / "pid"), str(output), "--command",
            "nbdkit", "-s", "--exit-with-parent", "--threads", "16", "python", str(PLUGIN),
            f"ref={ref}", f"size={size}", f"table={folder / 'chunks.json'}", f"cache={folder / 'cache'}"]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True,
                         close_fds=True)


def _wait_ready(image: str, output: Path, pidfile: Path, process: subprocess.Popen[bytes], log: Path,
                say: Callable[[str], None]) -> None:
    """Until nbdfuse wrote its pid file and FILE reads as a squashfs."""
    started = time.monotonic()
    with every(HEARTBEAT_S, lambda: say(f"{image}: waiting for nbdfuse ({time.monotonic() - started:.0f} s)"),
               name="squashfs-heartbeat"):
        while not pidfile.exists():
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise MountFailed(image=image, path=output, detail=f"not ready within {READY_TIMEOUT_S:g} s",
                                  log=log)
            if process.poll() is not None:
                raise MountFailed(image=image, path=output, detail=_last_line(log), log=log)
            time.sleep(0.05)
    try:
        with open(output, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise MountFailed(image=image, path=output, detail=f"reading it: {e.strerror}; {_last_line(log)}",
                          log=log) from e
    if magic != b"hsqs":
        raise MountFailed(image=image, path=output, detail="it does not start as a squashfs", log=log)


def _last_line(log: Path) -> str:
    lines = [line for line in (log.read_text(errors="replace") if log.exists() else "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    return (errors or lines or ["it stopped without a word"])[-1].strip()[-300:]


def _unmount(output: Path) -> bool:
    """fusermount3 -u FILE (nbdfuse, then nbdkit, exit); False where nothing was mounted there."""
    done = subprocess.run(["fusermount3", "-u", str(output)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "not found" not in done.stderr and "not mounted" not in done.stderr \
            and "Invalid argument" not in done.stderr:
        # Busy (a reader still has it): detach it now, the tools exit when the last reader goes.
        subprocess.run(["fusermount3", "-u", "-z", str(output)], capture_output=True, timeout=60, check=False)
    return done.returncode == 0


def release(output: Path) -> bool:
    """Unmount FILE and remove it and its folder; True where something was released. Safe to repeat."""
    folder = work_folder(output)
    mounted = _unmount(output) if output.exists() or folder.exists() else False
    pidfile = folder / "pid"
    if pidfile.exists():
        _wait_gone(pidfile)
    shutil.rmtree(folder, ignore_errors=True)
    existed = output.exists()
    output.unlink(missing_ok=True)
    return mounted or existed


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
