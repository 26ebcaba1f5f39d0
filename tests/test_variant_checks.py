"""The checks of what a variant promises (smoke_tests/checks/devel.py, jupyter.py), with canned
inputs: fake nvcc and fake Jupyter servers on this host. The real images: tests/test_e2e.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from support.unavailable import require_module

require_module("torch", "the checks import torch (.ci/setup --tests installs the CPU build)")

from smoke_tests.checks import CHECK_NAMES, checks_for  # noqa: E402
from smoke_tests.checks import devel, jupyter  # noqa: E402
from smoke_tests.context import Context  # noqa: E402

BASE = ("environment", "cuda", "nccl", "cache", "compile", "cuda_graph")


@pytest.mark.parametrize(("variant", "expected"), [
    (None, BASE),  # no manifest: a foreign image gets what every image gets
    ("runtime", BASE),
    ("devel", BASE + ("devel",)),
    ("jupyter", BASE + ("jupyter",)),
    ("devel-jupyter", BASE + ("devel", "jupyter")),  # JupyterLab on a devel image promises both
])
def test_checks_for_a_variant(variant: str | None, expected: tuple[str, ...]) -> None:
    assert checks_for(variant) == expected
    assert set(CHECK_NAMES) == set(BASE) | {"devel", "jupyter"}


def test_the_images_run_the_checks_the_variant_registry_names() -> None:
    """smoke_tests runs without imagebuilder, so it keeps its own table; it is the registry's."""
    from imagebuilder.matrix.variants import REGISTRY, checks_of

    assert {name: checks_for(name) for name in REGISTRY} == {name: BASE + checks_of(name) for name in REGISTRY}


# --------------------------------------------------------------------------- devel


@pytest.mark.parametrize(("output", "release"), [
    ("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n", (13, 0)),
    ("Cuda compilation tools, release 12.1, V12.1.105", (12, 1)),
    ("bash: nvcc: command not found", None),
])
def test_nvcc_release(output: str, release: tuple[int, int] | None) -> None:
    assert devel.nvcc_release(output) == release


@pytest.mark.parametrize(("flags", "device", "arch"), [
    ("sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120", None, "7.5"),  # cu130: oldest cubin
    ("sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90", None, "5.0"),
    ("sm_50 sm_90", (8, 6), "8.6"),  # a GPU: its own
    (None, None, devel.FALLBACK_ARCH),
    ("compute_90", None, devel.FALLBACK_ARCH),
])
def test_build_arch(flags: str | None, device: tuple[int, int] | None, arch: str) -> None:
    assert devel.build_arch(flags, device) == arch


def fake_nvcc(home: Path, release: str) -> None:
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)


def test_devel_toolkit_matches_the_image_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvcc(tmp_path, "13.0")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    measurements, problems, nvcc = devel._toolkit("13.0")
    assert problems == [] and nvcc == str(tmp_path / "bin" / "nvcc")
    assert measurements == {"cuda_home": str(tmp_path), "nvcc": "13.0"}


@pytest.mark.parametrize(("release", "cuda_home", "on_path", "phrases"), [
    ("12.4", "set", False, ["nvcc 12.4 != the image's CUDA 13.0"]),
    ("13.0", "empty", False, ["has no bin/nvcc", "no nvcc: a devel image must compile CUDA code"]),
    ("13.0", None, False, ["CUDA_HOME is not set", "no nvcc"]),
    # nvcc on PATH does not excuse a missing CUDA_HOME: builds look there first.
    ("13.0", None, True, ["CUDA_HOME is not set"]),
])
def test_devel_toolkit_problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: str,
                                cuda_home: str | None, on_path: bool, phrases: list[str]) -> None:
    fake_nvcc(tmp_path / "toolkit", release)
    (tmp_path / "empty").mkdir()
    if cuda_home is None:
        monkeypatch.delenv("CUDA_HOME", raising=False)
    else:
        monkeypatch.setenv("CUDA_HOME", str(tmp_path / ("toolkit" if cuda_home == "set" else "empty")))
    monkeypatch.setenv("PATH", f"{tmp_path / 'toolkit' / 'bin'}:/usr/bin:/bin" if on_path else "/usr/bin:/bin")
    _, problems, _ = devel._toolkit("13.0")
    assert len(problems) == len(phrases)
    for problem, phrase in zip(problems, phrases):
        assert phrase in problem


def test_devel_fails_a_cpu_torch() -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    result = devel.check(Context())
    assert result.failed and "torch is a CPU build" in result.reason


def test_devel_compile_failure_names_the_compiler_error(tmp_path: Path) -> None:
    """A compiler that cannot build: the reason carries its error line, not a traceback."""
    fake_nvcc(tmp_path, "13.0")
    why, seconds = devel.compile_extension(str(tmp_path / "bin" / "nvcc"), "8.0", timeout=120)
    assert why is not None and why.startswith("a CUDA extension did not build: ")
    assert "Traceback" not in why and seconds < 120


# --------------------------------------------------------------------------- jupyter

# A stand-in for `jupyter lab`: serves /api/contents on the --port it is given, as told by
# FAKE_JUPYTER (403 without the token and 200 with it, unless told otherwise).
FAKE_JUPYTER = """\
#!{python}
import http.server, os, sys
port = int([a for a in sys.argv if a.startswith("--port=")][0].split("=")[1])
mode = os.environ.get("FAKE_JUPYTER", "good")
if mode == "crash":
    print("ModuleNotFoundError: No module named 'jupyterlab'", flush=True)
    sys.exit(1)
token = "0123456789abcdef0123456789abcdef0123456789abcdef"
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = mode == "open" or self.path.endswith("token=" + token)
        if mode == "wrong-token" and ok:
            ok = False
        self.send_response(200 if ok else 403)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Handler)
if mode != "silent" and mode != "open":
    print("    http://127.0.0.1:%d/lab?token=%s" % (port, token), flush=True)
server.serve_forever()
"""


@pytest.fixture
def fake_jupyter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "jupyter"
    script.write_text(FAKE_JUPYTER.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


@pytest.mark.parametrize(("mode", "status", "phrase"), [
    ("good", "pass", "403 without its token, 200 with it"),
    ("open", "fail", "without a token answered 200, expected 403: the server is open"),
    ("silent", "fail", "printed no token"),
    ("wrong-token", "fail", "with the token it printed answered 403, expected 200"),
    ("crash", "fail", "jupyter lab exited 1 at start: ModuleNotFoundError: No module named 'jupyterlab'"),
])
def test_jupyter_check(fake_jupyter: Path, monkeypatch: pytest.MonkeyPatch, mode: str, status: str,
                       phrase: str) -> None:
    monkeypatch.setenv("FAKE_JUPYTER", mode)
    monkeypatch.setattr(jupyter, "START_TIMEOUT", 8.0)
    result = jupyter.check(Context())
    assert result.status == status, result
    assert phrase in result.reason


def test_jupyter_check_without_jupyter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = jupyter.check(Context())
    assert result.failed and "no jupyter on PATH" in result.reason


def test_jupyter_check_leaves_no_server_behind(fake_jupyter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    started: list[subprocess.Popen[str]] = []
    real = subprocess.Popen

    def recording(*args: object, **kwargs: object) -> subprocess.Popen[str]:
        process = real(*args, **kwargs)  # type: ignore[call-overload]
        started.append(process)
        return process

    monkeypatch.setattr("smoke_tests.checks.jupyter.subprocess.Popen", recording)
    assert jupyter.check(Context()).status == "pass"
    (process,) = started
    assert process.poll() is not None


def test_jupyter_check_ignores_http_proxies(fake_jupyter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy that answers nothing: loopback requests must not go there.
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert jupyter.check(Context()).status == "pass"

