"""An image in a registry -> its root as one squashfs file, as enroot's import makes it, but
once, by the publisher: zstd, 1 MiB blocks (squashfuse reads a block per random access), every
file root's (`-all-root`).

The layers are fetched one at a time from the registry (the published digest, so the squashfs is
what was verified and pushed), each checked against its digest, unpacked over the root
(layers.py) and deleted; then enroot's configuration files (enroot.py) and `mksquashfs`. All of
it happens in one temp folder beside the output, after a check of the free disk, and that
folder is removed on every way out, Ctrl-C included. A line every 15 s while any of it runs.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from ..errors import ImageBuilderError
from ..registry.heartbeat import every
from .enroot import MOUNT_POINTS, enroot_files
from .layers import Applied, apply_layer, finish

HEARTBEAT_S = 15.0
BLOCK_SIZE = 1 << 20
COMPRESSION = "zstd"
LEVEL = 3
"""zstd level: docs/clusters-squashfs.md has the measurements (mksquashfs's default, 15, took
several times as long for a few percent less)."""
SPACE_FACTOR = 4
"""Free disk asked per compressed byte of the image: the unpacked root (2-3x for a torch
image's zstd layers), the squashfs beside it and one layer's blob."""


class SquashfsError(ImageBuilderError):
    """The squashfs could not be made."""


class NotEnoughDisk(SquashfsError):
    template = ("{folder} has {free} free, and making the squashfs of {ref} needs about {needed} "
                "(the unpacked root and the squashfs); free some space or write the output elsewhere")


class ToolMissing(SquashfsError):
    template = "{tool} is not installed; install Debian's {package} (`apt-get install {package}`)"


class ToolFailed(SquashfsError):
    template = "{tool} failed (exit {status}): {detail}"


class BlobCorrupt(SquashfsError):
    template = "blob {digest} of {ref} arrived with digest {actual}; the registry or the link corrupted it, try again"


class LayerRegistry(Protocol):
    """What making the squashfs needs of a registry (registry.client.HttpRegistry)."""

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None: ...

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None: ...

    def download_blob(self, ref: str, digest: str, out: IO[bytes]) -> None: ...


@dataclass(frozen=True)
class Made:
    path: Path
    size: int
    seconds: float
    unpacked_bytes: int
    options: tuple[str, ...]
    tool: str


def squash_options(level: int = LEVEL) -> tuple[str, ...]:
    """mksquashfs's options: zstd at `level`, 1 MiB blocks, all root's, a new file."""
    return ("-all-root", "-comp", COMPRESSION, "-Xcompression-level", str(level), "-b", str(BLOCK_SIZE),
            "-noappend", "-no-progress", "-quiet")


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1000
    raise AssertionError("unreachable")


def require_tools() -> None:
    for tool, package in (("mksquashfs", "squashfs-tools"), ("zstd", "zstd"), ("gzip", "gzip")):
        if shutil.which(tool) is None:
            raise ToolMissing(tool=tool, package=package)


def make_squashfs(registry: LayerRegistry, ref: str, output: Path, *, level: int = LEVEL,
                  say: Callable[[str], None]) -> Made:
    """The squashfs of image `ref` (REPOSITORY@DIGEST of an image manifest) at `output`."""
    require_tools()
    found = registry.manifest(ref)
    config = registry.image_config(ref)
    if found is None or config is None:
        raise SquashfsError(f"the registry has no image {ref}")
    layers = [(str(layer["digest"]), int(layer.get("size") or 0)) for layer in found[0].get("layers") or []]
    needed = SPACE_FACTOR * sum(size for _, size in layers)
    free = shutil.disk_usage(output.parent).free
    if free < needed:
        raise NotEnoughDisk(folder=output.parent, free=human(free), ref=ref, needed=human(needed))
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=".imagebuilder-squashfs-", dir=output.parent))
    try:
        root = work / "root"
        root.mkdir()
        applied = Applied()
        step = [f"{ref.partition('@')[0]}: layer 1/{len(layers)}"]  # the heartbeat's line names the layer at hand
        with every(HEARTBEAT_S, functools.partial(_unpacking, say, step, applied), name="squashfs-heartbeat"):
            for number, (digest, size) in enumerate(layers, 1):
                step[0] = f"{ref.partition('@')[0]}: layer {number}/{len(layers)} ({human(size)})"
                _apply_blob(registry, ref, digest, work / "blob", root, applied)
        for path, text in _configured(root, config[0]).items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).unlink(missing_ok=True)
            (root / path).write_text(text)
        finish(root, applied)
        options = squash_options(level)
        squashfs = work / "image.sqfs"
        say(f"{ref.partition('@')[0]}: mksquashfs {' '.join(options[:7])} over {human(applied.bytes)} "
            f"in {applied.files} files")
        _squash(root, squashfs, options, say)
        os.replace(squashfs, output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Made(output, output.stat().st_size, time.monotonic() - started, applied.bytes, options, mksquashfs_version())


def _unpacking(say: Callable[[str], None], step: list[str], applied: Applied) -> None:
    say(f"{step[0]}: {applied.files} files, {human(applied.bytes)} unpacked so far")


def _configured(root: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """enroot's files, and empty mount points the image lacks."""
    files = enroot_files(config)
    for point in MOUNT_POINTS:
        if not (root / point).exists() and not (root / point).is_symlink():
            files[point] = ""
    return files


def _apply_blob(registry: LayerRegistry, ref: str, digest: str, blob: Path, root: Path, applied: Applied) -> None:
    """Download one layer, check its digest, unpack it over root, delete it."""
    try:
        with open(blob, "w+b") as out:
            registry.download_blob(ref, digest, out)
        actual = sha256_file(blob)
        if actual != digest:
            raise BlobCorrupt(digest=digest, ref=ref, actual=actual)
        with open(blob, "rb") as compressed:
            magic = compressed.read(4)
        program = ["zstd", "-dcq"] if magic == b"\x28\xb5\x2f\xfd" else ["gzip", "-dc"] if magic[:2] == b"\x1f\x8b" \
            else None
        with open(blob, "rb") as layer:  # a fresh handle: the decompressor reads its file from the start
            if program is None:
                apply_layer(layer, root, applied, digest)
            else:
                _apply_decompressed(program, layer, root, applied, digest)
    finally:
        blob.unlink(missing_ok=True)


def _apply_decompressed(program: list[str], compressed: IO[bytes], root: Path, applied: Applied, digest: str) -> None:
    process = subprocess.Popen(program, stdin=compressed, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        apply_layer(process.stdout, root, applied, digest)
        process.stdout.read()  # tar's end blocks, so the decompressor exits
        _, error = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise ToolFailed(tool=program[0], status=process.returncode, detail=error.decode(errors="replace").strip()[-300:])


def _squash(root: Path, squashfs: Path, options: tuple[str, ...], say: Callable[[str], None]) -> None:
    started = time.monotonic()

    def progress() -> None:
        size = squashfs.stat().st_size if squashfs.exists() else 0
        say(f"mksquashfs: {time.monotonic() - started:.0f} s, {human(size)} written")

    with every(HEARTBEAT_S, progress, name="squashfs-heartbeat"):
        done = subprocess.run(["mksquashfs", str(root), str(squashfs), *options], capture_output=True, text=True)
    if done.returncode != 0:
        raise ToolFailed(tool="mksquashfs", status=done.returncode, detail=(done.stderr or done.stdout).strip()[-300:])


def mksquashfs_version() -> str:
    done = subprocess.run(["mksquashfs", "-version"], capture_output=True, text=True, timeout=30)
    first = (done.stdout or done.stderr).splitlines()[:1]
    return " ".join(first[0].split()[:3]) if first else "mksquashfs"


def sha256_file(path: Path) -> str:
    """sha256:HEX of the file at `path`, read 1 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


