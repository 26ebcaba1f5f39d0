"""Projects for `imagebuilder project` (tests/test_project.py, bench/bench_project.py): the team's
pyproject project, and a package index made in the test that serves a source distribution whose
build imports torch (the flash-attn case, without CUDA or the network).

The index is a PEP 503 simple index of static pages (support.apt_repo.served), listening on the
Docker bridge's gateway: the address both this host (uv, resolving the lock) and a BuildKit build
container (pip, installing it) reach.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.utils import canonicalize_name

from support.apt_repo import served


def trainer_pyproject(package: str) -> str:
    """A pyproject project that depends on pandas and torchmetrics and installs `package` (a folder
    of that name beside it)."""
    return f"""
[project]
name = "{package}"
version = "0.1.0"
dependencies = ["pandas==2.2.3", "torchmetrics==1.6.1"]

[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[tool.setuptools]
packages = ["{package}"]
"""


TORCH_SDIST = "torchext"
"""A source-only package whose build needs torch (the flash-attn case): built against the venv's."""
NVTX_SDIST = "nvtxext"
"""A source-only package whose isolated build needs nvidia-nvtx-cu12, a torch-stack member the base
pins (12.4.127 under torch 2.6) below PyPI's newest, and whose wheel is small."""
_SETUP_PY = """from importlib.metadata import distribution
from pathlib import Path
from setuptools import setup

# What the build ran against: the venv's {requires}, or the one its isolated environment fetched.
found = distribution("{requires}")
Path("{name}/_built_with.py").write_text(
    f"VERSION = {{found.version!r}}\\nWHERE = {{str(found.locate_file(''))!r}}\\n")
setup()
"""


def recording_sdist(folder: Path, name: str, requires: str, version: str = "0.1") -> Path:
    """NAME-VERSION.tar.gz in `folder`: static metadata (a resolver reads it without a build),
    `[build-system] requires = ["setuptools", REQUIRES]` and a setup.py that records which REQUIRES
    its build got in NAME/_built_with.py (VERSION, and WHERE: the site-packages it was in)."""
    root = f"{name}-{version}"
    files = {
        "PKG-INFO": f"Metadata-Version: 2.2\nName: {name}\nVersion: {version}\n",
        "pyproject.toml": (f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = []\n'
                           f'[build-system]\nrequires = ["setuptools", "{requires}"]\n'
                           f'build-backend = "setuptools.build_meta"\n[tool.setuptools]\npackages = ["{name}"]\n'),
        "setup.py": _SETUP_PY.format(requires=requires, name=name),
        f"{name}/__init__.py": "",
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{root}.tar.gz"
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w") as tar:  # the same bytes from run to run
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{root}/{member}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return path


def bridge_gateway() -> str:
    """The Docker bridge network's gateway: this host, as a build container sees it."""
    out = subprocess.run(["docker", "network", "inspect", "bridge", "--format",
                          "{{range .IPAM.Config}}{{.Gateway}} {{end}}"], capture_output=True, text=True, check=True,
                         timeout=30).stdout.split()
    gateway = next((ip for ip in out if "." in ip), None)
    assert gateway is not None, f"the bridge network has no IPv4 gateway: {out}"
    return gateway


@contextmanager
def simple_index(files: list[Path], host: str) -> Iterator[str]:
    """A PEP 503 index of `files` (each linked with its sha256) at http://HOST:PORT/simple/, as
    static pages in a folder of its own, yielded; stopped when the block ends."""
    with tempfile.TemporaryDirectory(prefix="imagebuilder-index-") as tmp:
        root = Path(tmp)
        (root / "files").mkdir()
        projects: dict[str, list[str]] = {}
        for path in files:
            shutil.copy(path, root / "files" / path.name)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            project = canonicalize_name(path.name.split("-", 1)[0])
            projects.setdefault(project, []).append(f'<a href="../../files/{path.name}#sha256={digest}">{path.name}</a>')
        for name, anchors in projects.items():
            (root / "simple" / name).mkdir(parents=True)
            (root / "simple" / name / "index.html").write_text(_page(anchors))
        (root / "simple" / "index.html").write_text(_page([f'<a href="{name}/">{name}</a>' for name in projects]))
        with served(root, host) as url:
            yield f"{url}/simple/"


def _page(anchors: list[str]) -> str:
    return "<!DOCTYPE html>\n<html><body>\n" + "<br/>\n".join(anchors) + "\n</body></html>\n"
