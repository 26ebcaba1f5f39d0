"""The cold-start benchmark's Slurm path (issue 43, item 3): a fresh node's first task, through the
same tc-shaped link into a network namespace (tests/remote_engine.py; its dockerd stays idle).

(a) "enroot": what enroot's `import` does today (its src/docker.sh), with the same tools: the
    image's layer blobs fetched through the link by curl run inside the namespace, ENROOT_MAX_CONNECTIONS
    (10) at a time; each layer unpacked by tar into its own folder, as many at once as there are
    cores (enroot's `parallel`), its aufs whiteouts turned into overlayfs ones (enroot-aufs2ovlfs);
    enroot's files from the config (/etc/environment, /etc/rc...) in a top folder; the folders
    mounted as one overlay and `mksquashfs ROOT FILE -all-root -no-progress -comp lzo -noD`
    (ENROOT_SQUASH_OPTIONS' default); then the file mounted by squashfuse and `import torch` in it.
(b) "published": `imagebuilder squashfs IMAGE -o FILE` run inside the namespace fetches the squashfs
    that `publish --squashfs` pushed; squashfuse; `import torch` the same way.
(c) "lazy": `imagebuilder squashfs IMAGE --lazy -o FILE` run in the namespace's network (nsenter:
    `ip netns exec` would hide nbdfuse's mount in a mount namespace of its own) serves the same
    squashfs at once through nbdkit and nbdfuse, fetching its chunks as they are read; squashfuse;
    `import torch` the same way, waiting on the chunks it reads; `squashfs-release` afterwards.

`import torch` as pyxis runs a task: bubblewrap over the mount (tests/cluster_runtimes.py), as the
image's user (the first passwd entry with a /home folder), with the environment its
/etc/environment holds. Each step's seconds and the bytes through the link are reported; the
page cache is not dropped (it is shared with other work), so both paths read the file they wrote.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bench.bench_publish import say, sh  # noqa: E402
from bench.manifests import Image  # noqa: E402
from imagebuilder.squashfs.enroot import MOUNT_POINTS, enroot_files  # noqa: E402
from cluster_runtimes import bwrap_argv, squashfs_mounted  # noqa: E402

ENROOT, PUBLISHED, LAZY = "enroot", "published", "lazy"
ENROOT_MAX_CONNECTIONS = 10  # enroot's default parallel downloads
ENROOT_SQUASH_OPTIONS = ("-comp", "lzo", "-noD")  # enroot's default
STEP_TIMEOUT_S = 1800
IMPORT_TORCH = "import torch"
WHITEOUT, OPAQUE = ".wh.", ".wh..wh..opq"
TAR_FILTERS = {"zstd": "--zstd", "gzip": "--gzip", "tar": ""}


@dataclass
class SlurmStart:
    """One path at one rate: (step, seconds) in order, and the bytes through the link."""
    path: str
    rate: str
    steps: list[tuple[str, float]] = field(default_factory=list)
    bytes: int = 0

    @property
    def total(self) -> float:
        return sum(seconds for _, seconds in self.steps)


def layer_tar_filter(media_type: str) -> str:
    """tar's decompression flag for a layer's media type ("" for an uncompressed tar)."""
    for suffix, flag in (("+zstd", "zstd"), ("+gzip", "gzip"), (".gzip", "gzip"), ("tar", "tar")):
        if media_type.endswith(suffix):
            return TAR_FILTERS[flag]
    raise ValueError(f"{media_type}: not a tar layer this benchmark can unpack")


def whiteout_target(name: str) -> str | None:
    """The file an aufs whiteout entry `name` hides (None: not a whiteout, or the opaque marker)."""
    if name == OPAQUE or not name.startswith(WHITEOUT):
        return None
    return name[len(WHITEOUT):]


def to_overlay_whiteouts(folder: Path) -> int:
    """enroot-aufs2ovlfs over one unpacked layer: `.wh.NAME` -> a 0/0 character device NAME,
    `.wh..wh..opq` -> its folder marked opaque (trusted.overlay.opaque=y). The count converted."""
    count = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            path = Path(parent) / name
            if name == OPAQUE:
                path.unlink()
                os.setxattr(parent, "trusted.overlay.opaque", b"y")
                count += 1
            elif (target := whiteout_target(name)) is not None:
                path.unlink()
                os.mknod(Path(parent) / target, 0o600 | 0o020000, os.makedev(0, 0))
                count += 1
    return count


def overlay_options(lower_to_upper: list[Path]) -> str:
    """mount -t overlay's lowerdir option: overlayfs lists the top layer first."""
    return "lowerdir=" + ":".join(str(path) for path in reversed(lower_to_upper))


def ratio(b: SlurmStart | None, a: SlurmStart | None) -> str:
    return "-" if a is None or b is None or not a.total else f"{b.total / a.total:.2f}x"


# --------------------------------------------------------------------------- the steps


class Timer:
    def __init__(self, start: SlurmStart) -> None:
        self.start = start

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        yield
        self.start.steps.append((name, time.perf_counter() - began))
        say(f"  {self.start.path} {self.start.rate}: {name} {self.start.steps[-1][1]:.1f}s")


def in_namespace(engine: Any, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", engine.name, *argv]


def fetch_layers(engine: Any, image: Image, folder: Path) -> list[tuple[Path, str]]:
    """curl inside the namespace, ENROOT_MAX_CONNECTIONS at a time: (file, media type) per layer."""
    host, _, rest = image.ref.partition("/")
    repository = rest.rsplit(":", 1)[0]
    layers = [(folder / f"{number:03d}.blob", layer) for number, layer in enumerate(image.manifest["layers"])]

    def one(item: tuple[Path, dict[str, Any]]) -> None:
        path, layer = item
        sh(*in_namespace(engine, "curl", "-sSfL", "-o", str(path),
                         f"http://{host}/v2/{repository}/blobs/{layer['digest']}"), timeout=STEP_TIMEOUT_S)

    with concurrent.futures.ThreadPoolExecutor(ENROOT_MAX_CONNECTIONS) as pool:
        list(pool.map(one, layers))
    return [(path, str(layer["mediaType"])) for path, layer in layers]


def unpack(blobs: list[tuple[Path, str]], folder: Path) -> list[Path]:
    """Each layer into its own folder (all cores at once), whiteouts made overlayfs's."""
    def one(item: tuple[int, tuple[Path, str]]) -> Path:
        number, (blob, media_type) = item
        target = folder / f"{number + 1}"
        target.mkdir()
        flag = layer_tar_filter(media_type)
        sh("tar", "-C", str(target), "--warning=no-timestamp", "--anchored", "--exclude=dev/*",
           "--exclude=./dev/*", *([flag] if flag else []), "-pxf", str(blob), timeout=STEP_TIMEOUT_S)
        blob.unlink()
        to_overlay_whiteouts(target)
        return target

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(one, enumerate(blobs)))


def configure(folder: Path, config: Mapping[str, Any], layers: list[Path]) -> Path:
    """enroot's top folder "0": its files from the image config, and the files the runtime binds
    the host's over, empty where no layer has them (a squashfuse root is read-only, and bwrap
    cannot make them there; the published squashfs has them the same way)."""
    top = folder / "0"
    missing = {relative: "" for relative in MOUNT_POINTS if not any((layer / relative).exists() for layer in layers)}
    for relative, text in {**missing, **enroot_files(config)}.items():
        (top / relative).parent.mkdir(parents=True, exist_ok=True)
        (top / relative).write_text(text)
    return top


@contextmanager
def overlay(layers: list[Path], mountpoint: Path) -> Iterator[Path]:
    mountpoint.mkdir()
    sh("mount", "-t", "overlay", "overlay", "-o", overlay_options(layers), str(mountpoint))
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], capture_output=True, check=False)


def import_torch(root: Path, home: Path) -> None:
    """`import torch` under bubblewrap as the image's user with its /etc/environment."""
    env = dict(line.split("=", 1) for line in (root / "etc" / "environment").read_text().splitlines() if "=" in line)
    user = next(line.split(":") for line in (root / "etc" / "passwd").read_text().splitlines()
                if line.split(":")[2] != "0" and line.split(":")[5].startswith("/home/"))
    workdir = "/"
    sh(*bwrap_argv(root, home, env, workdir), "--uid", user[2], "--gid", user[3], "python", "-c", IMPORT_TORCH,
       timeout=STEP_TIMEOUT_S)


def enroot_start(engine: Any, image: Image, rate: str, work: Path, sent: Any) -> SlurmStart:
    start = SlurmStart(ENROOT, rate)
    timer, before = Timer(start), sent(engine.link)
    layers_folder, squashfs = work / "layers", work / "enroot.sqsh"
    layers_folder.mkdir()
    try:
        with timer.step("fetch layers (curl)"):
            blobs = fetch_layers(engine, image, layers_folder)
        start.bytes = sent(engine.link) - before
        with timer.step("unpack (tar, whiteouts)"):
            folders = unpack(blobs, layers_folder)
            folders.append(configure(layers_folder, image.config, folders))
        with timer.step("mksquashfs -comp lzo -noD"):
            with overlay(folders, work / "rootfs") as rootfs:
                sh("mksquashfs", str(rootfs), str(squashfs), "-all-root", "-no-progress", *ENROOT_SQUASH_OPTIONS,
                   timeout=STEP_TIMEOUT_S)
        shutil.rmtree(layers_folder)  # enroot removes them before it runs anything
        _mount_and_import(timer, squashfs, work)
    finally:
        shutil.rmtree(layers_folder, ignore_errors=True)
        shutil.rmtree(work / "rootfs", ignore_errors=True)
        squashfs.unlink(missing_ok=True)
    return start


def published_start(engine: Any, image: Image, rate: str, work: Path, sent: Any) -> SlurmStart:
    start = SlurmStart(PUBLISHED, rate)
    timer, before = Timer(start), sent(engine.link)
    squashfs = work / "published.sqfs"
    try:
        with timer.step("fetch squashfs (imagebuilder squashfs)"):
            sh(*in_namespace(engine, "env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "imagebuilder", "squashfs",
                             image.ref, "-o", str(squashfs)), timeout=STEP_TIMEOUT_S)
        start.bytes = sent(engine.link) - before
        _mount_and_import(timer, squashfs, work)
    finally:
        squashfs.unlink(missing_ok=True)
    return start


def lazy_start(engine: Any, image: Image, rate: str, work: Path, sent: Any) -> SlurmStart:
    start = SlurmStart(LAZY, rate)
    timer, before = Timer(start), sent(engine.link)
    squashfs = work / "lazy.sqfs"
    command = ["nsenter", f"--net=/run/netns/{engine.name}", "--", "env", f"PYTHONPATH={ROOT}", sys.executable, "-m",
               "imagebuilder"]
    try:
        with timer.step("serve squashfs lazily (imagebuilder squashfs --lazy)"):
            sh(*command, "squashfs", image.ref, "-o", str(squashfs), "--lazy", timeout=STEP_TIMEOUT_S)
        _mount_and_import(timer, squashfs, work)
        start.bytes = sent(engine.link) - before  # the chunks import torch read
    finally:
        subprocess.run([*command, "squashfs-release", str(squashfs)], capture_output=True, timeout=120, check=False)
    return start


def _mount_and_import(timer: Timer, squashfs: Path, work: Path) -> None:
    home = work / "home"
    home.mkdir(exist_ok=True)
    home.chmod(0o777)
    with ExitStack() as stack:
        with timer.step("squashfuse"):
            root = stack.enter_context(squashfs_mounted(squashfs))
        with timer.step(IMPORT_TORCH):
            import_torch(root, home)


def slurm_starts(engine: Any, image: Image, rate: str, sent: Any) -> list[SlurmStart]:
    """Both paths at `rate` (the link already shaped), in a temp folder removed afterwards."""
    # Under /tmp: bwrap binds the home over its own tmpfs /tmp (the image root is read-only).
    work = Path(tempfile.mkdtemp(prefix="ib-bench-slurm-", dir="/tmp"))
    try:
        return [enroot_start(engine, image, rate, work, sent), published_start(engine, image, rate, work, sent),
                lazy_start(engine, image, rate, work, sent)]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def squashfs_bytes(registry: Any, image: Image) -> int | None:
    """The registry bytes of `image`'s squashfs artifact: its blob and manifest (None: none found)."""
    from imagebuilder.squashfs.artifact import find_artifact
    from imagebuilder.squashfs.fetch import image_digest

    found = find_artifact(registry, image_digest(registry, image.ref, "linux/amd64"))
    if found is None:
        return None
    descriptor = registry.descriptor(found[0])
    return int(found[1]["size"]) + (int(descriptor["size"]) if descriptor else 0)


# --------------------------------------------------------------------------- the report


def report(starts: list[SlurmStart], image_bytes: int, squashfs_bytes: int | None) -> None:
    from imagebuilder.build.table import format_table

    if squashfs_bytes is not None:
        print(f"\nSlurm: registry bytes the squashfs adds: {squashfs_bytes:,} (its blob and manifest) against the "
              f"image's {image_bytes:,} ({squashfs_bytes / image_bytes:.2f}x)")
    if not starts:
        return
    print("\nSlurm cold start: (a) enroot's import today, (b) the squashfs publish --squashfs pushed, (c) the same "
          "read lazily (--lazy)")
    print(format_table(("rate", "path", "step", "s"), [
        (start.rate, start.path, name, f"{seconds:.1f}") for start in starts for name, seconds in start.steps]
        + [(start.rate, start.path, "TOTAL", f"{start.total:.1f}") for start in starts]))
    print(format_table(("rate", "path", "bytes through the link"),
                       [(start.rate, start.path, f"{start.bytes:,}") for start in starts]))
    for path in (PUBLISHED, LAZY):
        for (rate, a), b in pairs(starts, path):
            target = " (target <= 0.4x)" if rate == "1gbit" else ""
            print(f"  Slurm at {rate}: {path} / enroot, fetch to import torch: {ratio(b, a)}{target}")


def pairs(starts: list[SlurmStart], path: str = PUBLISHED) -> list[tuple[tuple[str, SlurmStart | None],
                                                                            SlurmStart | None]]:
    """((rate, enroot's start), the start of `path` that followed it) in the order they ran; a
    rate given twice (--rates 1gbit,200mbit,1gbit,200mbit) is a pair per pass."""
    found: list[tuple[tuple[str, SlurmStart | None], SlurmStart | None]] = []
    for start in starts:
        if start.path not in (ENROOT, path):
            continue
        if start.path == ENROOT or not found or found[-1][1] is not None or found[-1][0][0] != start.rate:
            found.append(((start.rate, start if start.path == ENROOT else None), None))
        if start.path == path:
            found[-1] = (found[-1][0], start)
    return found
