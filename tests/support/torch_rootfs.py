"""Two one-layer images made from this host's files, no build: the interpreter that runs the tests
(its binary, libpython, the standard library, the shared libraries they and torch load), and the
same plus the packages `import torch` loads from this venv (torch, numpy, ...) in that
interpreter's site-packages. Each is written by publish's zstd:chunked writer and pushed as
publish pushes it, streamed through files (the torch layer is ~0.9 GB).

Paths in the images are the host's (the interpreter's prefix, /lib/x86_64-linux-gnu/...), so the
interpreter finds its standard library and libpython as it does here, and the loader its
libraries in its default folders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from imagebuilder.engine.export import ZSTD_CHUNKED
from imagebuilder.estargz.writer import Written, write_estargz
from imagebuilder.registry.client import HttpRegistry

from .chunked_images import put_image

SKIPPED = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "site-packages",
           "dist-packages", "include", "share"}
"""Folders no import of torch reads: the standard library's tests and GUI, torch's headers and cmake files."""

_LOADED = """
import json, sys, sysconfig
import torch
purelib = sysconfig.get_paths()["purelib"]
print(json.dumps(sorted({f[len(purelib) + 1:].split("/")[0] for f in
      (getattr(m, "__file__", None) or "" for m in list(sys.modules.values())) if f.startswith(purelib + "/")})))
"""


def _tree(root: Path) -> Iterable[Path]:
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(name for name in folders if name not in SKIPPED and not name.startswith("config-"))
        for name in sorted(files):
            yield Path(folder) / name


def _libraries(binaries: Iterable[Path]) -> set[str]:
    """The shared libraries (as the loader names them here) that `binaries` load, outside the trees."""
    found: set[str] = set()
    for binary in binaries:
        done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=60)
        for line in done.stdout.splitlines():
            parts = line.split()
            path = parts[2] if len(parts) >= 3 and parts[1] == "=>" else parts[0] if parts and parts[0].startswith("/") else ""
            if path.startswith("/") and not path.startswith(sys.base_prefix):
                found.add(path)
    return found


def python_root() -> list[tuple[str, Path]]:
    """(image path, host file) of the interpreter, its standard library and the libraries they load."""
    prefix = Path(sys.base_prefix)
    python = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    libdir = Path(sysconfig.get_config_var("LIBDIR") or prefix / "lib")
    files = [python, *sorted(libdir.glob("libpython3*.so*")), *_tree(stdlib)]
    libraries = _libraries([python, *(f for f in files if f.suffix == ".so" or ".so." in f.name)])
    return [(str(f), f) for f in files if f.is_file()] + [(lib, Path(os.path.realpath(lib))) for lib in sorted(libraries)]


def torch_packages() -> list[tuple[str, Path]]:
    """(image path, host file) of the packages `import torch` loads from this venv, under the
    interpreter's own site-packages, and the libraries their binaries load beyond the root's."""
    loaded = json.loads(subprocess.run([sys.executable, "-c", _LOADED], capture_output=True, text=True, timeout=300,
                                       check=True).stdout)
    purelib = Path(sysconfig.get_paths()["purelib"])
    target = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    entries: list[tuple[str, Path]] = []
    for name in loaded:
        for top in (purelib / name, purelib / f"{name}.libs"):
            if top.is_file():
                entries.append((str(target / top.name), top))
            elif top.is_dir():
                entries.extend((str(target / f.relative_to(purelib)), f) for f in _tree(top) if f.is_file())
    binaries = [host for _, host in entries if host.suffix == ".so" or ".so." in host.name]
    own = {image for image, _ in entries}
    return entries + [(lib, Path(os.path.realpath(lib))) for lib in sorted(_libraries(binaries)) if lib not in own]


def push_tree(address: str, repository: str, entries: Sequence[tuple[str, Path]], command: Sequence[str]) -> Written:
    """The one-layer image of `entries` (regular files, 0755 for executables), pushed as publish
    pushes zstd:chunked under :v1; the layer and blob spooled through a temp folder."""
    ref = f"{address}/{repository}:v1"
    with tempfile.TemporaryDirectory(prefix="ib-torch-rootfs-") as scratch:
        layer, blob = Path(scratch) / "layer.tar", Path(scratch) / "layer.blob"
        with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
            folders: set[str] = set()
            for image, host in sorted(dict(entries).items()):
                parts = image.strip("/").split("/")
                for depth in range(1, len(parts)):
                    folder = "/".join(parts[:depth])
                    if folder not in folders:
                        folders.add(folder)
                        info = tarfile.TarInfo(folder)
                        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
                        tar.addfile(info)
                info = tarfile.TarInfo("/".join(parts))
                info.size, info.mtime = host.stat().st_size, 1_700_000_000
                info.mode = 0o755 if os.access(host, os.X_OK) else 0o644
                with open(host, "rb") as data:
                    tar.addfile(info, data)
        with open(layer, "rb") as source, open(blob, "wb") as out:
            written = write_estargz(source, out, codec=ZSTD_CHUNKED, level=3)
        registry = HttpRegistry()
        with open(blob, "rb") as data:
            registry.upload_blob(ref, written.digest, data, written.size)
    put_image(ref, written, list(command), registry)
    return written
