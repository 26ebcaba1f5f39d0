"""The smoke suite on this host's torch, run once per session and read by every test that asks.

`imagebuilder verify --local ...` runs every smoke test on this host's torch for real (a gloo
all-reduce, an Inductor compile); test_verify and the documented commands ask for the same
argv: it runs once per argv (host_verify), and each asker reads its result. `python -m
smoke_tests --json` on this host is one run too (host_smoke_run): test_smoke_tests' CLI tests
read its report, and test_verify's `verify --local --json` replays it (the table's run,
docs/verify.md's command, is the real subprocess path).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

_SMOKE_RUNS: list[subprocess.CompletedProcess[str]] = []


def host_manifest() -> dict[str, Any]:
    """What an imagebuilder manifest for this very torch would say."""
    import torch

    return {
        "torch": torch.__version__.split("+")[0],
        "torch_cuda": torch.version.cuda,  # None: this host's torch is a CPU build
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "variant": "runtime",
        "unrelated_key": [1, 2, 3],
    }


def smoke_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a smoke-test run on this host: this checkout's smoke_tests, one compile
    worker (spawning Inductor's pool costs more than it saves here), no injected fault."""
    from smoke_tests.allreduce import FAULT_ENV

    base = dict(os.environ)
    base["PYTHONPATH"] = str(REPO_ROOT)
    base.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    base.pop(FAULT_ENV, None)
    base.update(env or {})
    return base


def host_smoke_run() -> subprocess.CompletedProcess[str]:
    """Every check through `python -m smoke_tests --json` on this host, with a manifest that
    matches its torch (host_manifest); run once per session."""
    if not _SMOKE_RUNS:
        import atexit
        import json
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="imagebuilder-test-smoke-"))
        atexit.register(shutil.rmtree, folder, True)
        manifest = folder / "manifest.json"
        manifest.write_text(json.dumps(host_manifest()))
        _SMOKE_RUNS.append(subprocess.run([sys.executable, "-m", "smoke_tests", "--json"], capture_output=True,
                                          text=True, timeout=240, cwd=REPO_ROOT, check=False,
                                          env=smoke_env({"SMOKE_TESTS_MANIFEST": str(manifest)})))
    return _SMOKE_RUNS[0]


# argv -> the run under way, and the runs that ended: (exit status, stdout, stderr).
_HOST_VERIFY: dict[tuple[str, ...], subprocess.Popen[str]] = {}
_HOST_VERIFIED: dict[tuple[str, ...], tuple[int, str, str]] = {}


def start_host_verify(*args: str) -> None:
    """Start `imagebuilder verify ARGS` on this host unless this session has (runs side by side)."""
    import sys

    if args not in _HOST_VERIFY and args not in _HOST_VERIFIED:
        _HOST_VERIFY[args] = subprocess.Popen([sys.executable, "-m", "imagebuilder", "verify", *args], cwd=REPO_ROOT,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def host_verify(*args: str, timeout: float = 2400) -> tuple[int, str, str]:
    """`imagebuilder verify ARGS` on this host, run once per session: (exit status, stdout, stderr)."""
    if args not in _HOST_VERIFIED:
        start_host_verify(*args)
        proc = _HOST_VERIFY.pop(args)
        stdout, stderr = proc.communicate(timeout=timeout)
        _HOST_VERIFIED[args] = (proc.returncode, stdout, stderr)
    return _HOST_VERIFIED[args]
