"""Projects for `imagebuilder project` (tests/test_project.py, bench/bench_project.py): the team's
pyproject project, and a package index made in the test that serves a source distribution whose
build imports torch (the flash-attn case, without CUDA or the network).

The index is a PEP 503 simple index on a thread, listening on the Docker bridge's gateway: the
address both this host (uv, resolving the lock) and a BuildKit build container (pip, installing
it) reach.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
"""The source-only package whose build needs torch: it records the torch its build imported in
`torchext/_built_with.py` (TORCH: its version, TORCH_FILE: where it was imported from)."""
_SETUP_PY = """import torch
from pathlib import Path
from setuptools import setup

# What the build ran against: the base venv's torch, or one an isolated build fetched.
Path("torchext/_built_with.py").write_text(f"TORCH = {torch.__version__!r}\\nTORCH_FILE = {torch.__file__!r}\\n")
setup()
"""


def torch_sdist(folder: Path, version: str = "0.1") -> Path:
    """torchext-VERSION.tar.gz in `folder`: static metadata (a resolver reads it without a build),
    `[build-system] requires = ["setuptools", "torch"]` and a setup.py that imports torch."""
    root = f"{TORCH_SDIST}-{version}"
    files = {
        "PKG-INFO": f"Metadata-Version: 2.2\nName: {TORCH_SDIST}\nVersion: {version}\n",
        "pyproject.toml": (f'[project]\nname = "{TORCH_SDIST}"\nversion = "{version}"\ndependencies = []\n'
                           '[build-system]\nrequires = ["setuptools", "torch"]\nbuild-backend = "setuptools.build_meta"\n'
                           f'[tool.setuptools]\npackages = ["{TORCH_SDIST}"]\n'),
        "setup.py": _SETUP_PY,
        f"{TORCH_SDIST}/__init__.py": "",
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{root}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{root}/{name}")
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
    """A PEP 503 index of `files` (each listed with its sha256) at http://HOST:PORT/simple/,
    yielded; stopped when the block ends."""
    root = files[0].parent
    pages: dict[str, bytes] = {}
    for path in files:
        name = path.name.split("-", 1)[0].lower().replace("_", "-")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        anchor = f'<a href="../../files/{path.name}#sha256={digest}">{path.name}</a><br/>\n'
        pages[f"/simple/{name}/"] = pages.get(f"/simple/{name}/", b"") + anchor.encode()
    pages["/simple/"] = "".join(f'<a href="{p.split("/")[2]}/">{p.split("/")[2]}</a><br/>\n'
                                for p in pages).encode()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?")[0]
            if path.startswith("/files/"):
                return super().do_GET()
            page = pages.get(path if path.endswith("/") else path + "/")
            if page is None:
                self.send_error(404)
                return
            body = b"<!DOCTYPE html><html><body>\n" + page + b"</body></html>\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def translate_path(self, path: str) -> str:
            return str(root / Path(path.split("?")[0]).name)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()
