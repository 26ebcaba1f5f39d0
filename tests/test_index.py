"""Reading the index: pins and markers from canned Requires-Dist, the Python check on canned
answers, and the HTTP reader against a real index on 127.0.0.1 (fast; the same code against
the real index is in test_drift.py)."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import threading
import zipfile
from pathlib import Path

import pytest
from support.fakes import CannedIndex
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imagebuilder.lock import drift
from imagebuilder.lock.index import PackageIndex, applies, cuda_pins, cuda_platforms, pinned
from imagebuilder.matrix.load import load_matrix
from imagebuilder.resources import default_matrix_path

X86 = "platform_system == 'Linux' and platform_machine == 'x86_64'"
TORCH_251 = tuple(Requirement(r) for r in [
    f"nvidia-cuda-runtime-cu12==12.4.127; {X86}",
    f"nvidia-cudnn-cu12==9.1.0.70; {X86}",
    f"nvidia-nccl-cu12==2.21.5; {X86}",
    f"triton==3.1.0; {X86} and python_version < '3.13'",
    "sympy==1.13.1; python_version >= '3.9'",
])
TORCH_214 = tuple(Requirement(r) for r in [
    "cuda-toolkit[cublas,cudart,nvrtc]==13.0.3; platform_system == 'Linux'",
    "nvidia-cudnn-cu13==9.24.0.43; platform_system == 'Linux'",
    "nvidia-nccl-cu13==2.30.7; platform_system == 'Linux'",
    "triton~=3.8.0; platform_system == 'Linux'",
])
V = Version


@pytest.mark.parametrize("reqs,python,platform,expected", [
    (TORCH_251, V("3.12"), "linux/amd64", {"cuda": V("12.4.127"), "cudnn": V("9.1.0.70"), "nccl": V("2.21.5")}),
    # The x86_64 markers hold whatever machine reads them; an aarch64 host sees a CPU wheel.
    (TORCH_251, V("3.12"), "linux/arm64", {"cuda": None, "cudnn": None, "nccl": None}),
    (TORCH_214, V("3.14"), "linux/arm64", {"cuda": V("13.0.3"), "cudnn": V("9.24.0.43"), "nccl": V("2.30.7")}),
])
def test_cuda_pins_read_per_platform(reqs, python, platform, expected):
    assert cuda_pins(reqs, python, platform) == expected


@pytest.mark.parametrize("reqs,python,expected", [
    (TORCH_251, V("3.12"), V("3.1.0")),
    (TORCH_251, V("3.13"), None),  # torch 2.5.1 requires no triton on 3.13
    (TORCH_214, V("3.11"), V("3.8.0")),  # ~= is how newer releases pin it
])
def test_triton_pin_follows_the_python_marker(reqs, python, expected):
    assert pinned(reqs, "triton", python) == expected


def test_markers_see_the_target_not_this_host():
    req = Requirement("x; python_version >= '3.15' and platform_machine == 'aarch64'")
    assert applies(req, V("3.15"), "linux/arm64") and not applies(req, V("3.15")) and not applies(req, V("3.14"), "linux/arm64")


def test_python_check_reads_every_package_not_torch_alone():
    """Canned index: torch 2.5.1 has a cp313 wheel, its companions do not."""
    index = CannedIndex({
        "torch": {V("3.12"): {V("2.5.1")}, V("3.13"): {V("2.5.1")}},
        "torchvision": {V("3.12"): {V("0.20.1")}, V("3.13"): {V("0.21.0")}},
        "torchaudio": {V("3.12"): {V("2.5.1")}, V("3.13"): set()},
        "triton": {V("3.12"): {V("3.1.0")}, V("3.13"): {V("3.2.0")}},
    }, requires=TORCH_251)  # every wheel's metadata is torch 2.5.1's
    release = dataclasses.replace(load_matrix(default_matrix_path()).torches["2.5"], pythons=(V("3.12"), V("3.13")))
    assert drift.python_problems(index, release) == [
        "torch 2.5.1 lists Python 3.13, but there is no wheel of torchvision 0.20.1, torchaudio 2.5.1, "
        "triton (torch requires none on Python 3.13: no torch.compile on GPU) for it"
    ]


# --------------------------------------------------------------------------- a real index on 127.0.0.1

PAYLOAD = 8 * 1024 * 1024  # incompressible bytes in each wheel: what reading METADATA must not download
METADATA = """Metadata-Version: 2.1
Name: torch
Version: {version}
Requires-Python: >=3.10
Requires-Dist: nvidia-cuda-runtime-cu12==12.4.127; platform_system == 'Linux' and platform_machine == '{machine}'
Requires-Dist: nvidia-nccl-cu12==2.21.5; platform_system == 'Linux' and platform_machine == '{machine}'
Requires-Dist: filelock

"""


def wheel(path: Path, version: str, tag: str, machine: str) -> Path:
    out = path / f"torch-{version}-{tag}.whl"
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("torch/_C.so", os.urandom(PAYLOAD))  # stored, not deflated: the bulk of the file
        z.writestr(f"torch-{version}.dist-info/METADATA", METADATA.format(version=version, machine=machine),
                   compress_type=zipfile.ZIP_DEFLATED)
        z.writestr(f"torch-{version}.dist-info/RECORD", "")
    return out


class IndexHandler(http.server.BaseHTTPRequestHandler):
    """A simple index that serves PEP 691 JSON (or PEP 503 HTML when asked only for that), no
    .metadata files, and answers byte ranges of its files, as the file host here does."""

    root: Path
    log: list[tuple[str, str | None]]
    html_only = False

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.log.append((self.path, self.headers.get("Range")))
        if self.path == "/simple/torch/":
            files = sorted(self.root.glob("*.whl"))
            if "json" in self.headers.get("Accept", "") and not self.html_only:
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": "torch", "files": [
                    {"filename": f.name, "url": f"/files/{f.name}", "hashes": {}, "requires-python": ">=3.10"}
                    for f in files]}).encode()
                kind = "application/vnd.pypi.simple.v1+json"
            else:
                body = "".join(f'<a href="../../files/{f.name}#sha256=00" data-requires-python="&gt;=3.10">{f.name}</a>\n'
                               for f in files).encode()
                kind = "text/html"
            return self.answer(200, body, {"Content-Type": kind})
        path = self.root / self.path.removeprefix("/files/")
        if not self.path.startswith("/files/") or not path.is_file():
            return self.answer(404, b"", {})
        data = path.read_bytes()
        wanted = self.headers.get("Range")
        if wanted is None:
            return self.answer(200, data, {})
        first, _, last = wanted.removeprefix("bytes=").partition("-")
        start = len(data) - int(last) if not first else int(first)
        end = min(len(data) - 1, int(last)) if first and last else len(data) - 1
        self.answer(206, data[start:end + 1], {"Content-Range": f"bytes {start}-{end}/{len(data)}"})

    def answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(params=["json", "html"])
def local_index(request, tmp_path):
    wheel(tmp_path, "2.5.1", "cp311-cp311-manylinux_2_28_x86_64", "x86_64")
    wheel(tmp_path, "2.5.1", "cp311-cp311-manylinux_2_28_aarch64", "aarch64")
    wheel(tmp_path, "2.6.0", "cp312-cp312-manylinux_2_28_x86_64", "x86_64")
    wheel(tmp_path, "2.7.0rc1", "cp311-cp311-manylinux_2_28_x86_64", "x86_64")
    handler = type("Handler", (IndexHandler,), {"root": tmp_path, "log": [], "html_only": request.param == "html"})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/simple/", handler.log  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


def test_versions_come_from_the_wheels_tags_on_the_simple_index(local_index):
    url, log = local_index
    index = PackageIndex(url)
    assert index.versions_with_wheels("torch", V("3.11")) == (V("2.5.1"),)  # no pre-release, no cp312 wheel
    assert index.versions_with_wheels("torch", V("3.12")) == (V("2.6.0"),)
    assert index.versions_with_wheels("torch", V("3.11"), "linux/arm64") == (V("2.5.1"),)
    assert index.versions_with_wheels("Torch", V("3.13")) == ()
    assert index.versions_with_wheels("torchvision", V("3.11")) == ()  # not on the index: 404
    assert [path for path, _ in log] == ["/simple/torch/", "/simple/torchvision/"]  # each page read once


def test_metadata_is_read_with_ranges_not_by_downloading_the_wheel(local_index):
    url, log = local_index
    index = PackageIndex(url)
    meta = index.wheel_metadata("torch", V("2.5.1"), V("3.11"), "linux/arm64")
    assert meta.filename == "torch-2.5.1-cp311-cp311-manylinux_2_28_aarch64.whl"
    assert cuda_pins(meta.requires_dist, V("3.11"), "linux/arm64")["nccl"] == V("2.21.5")
    assert meta.requires_python == SpecifierSet(">=3.10")
    wheel_reads = [(path, ranges) for path, ranges in log if path.startswith("/files/")]
    assert wheel_reads and all(ranges is not None for _, ranges in wheel_reads), log
    assert index.received < PAYLOAD / 4, index.received
    # The same wheel asked for again, however the arguments are spelled, is not read again.
    seen = len(log)
    assert index.wheel_metadata("torch", V("2.5.1.0"), V("3.11.0"), platform="linux/arm64") == meta
    assert len(log) == seen
    assert cuda_platforms(index, V("2.5.1"), V("3.11")) == ("linux/amd64", "linux/arm64")
    seen = len(log)
    assert cuda_platforms(index, V("2.5.1"), V("3.11")) == ("linux/amd64", "linux/arm64")
    assert len(log) == seen
