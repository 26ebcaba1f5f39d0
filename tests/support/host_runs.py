"""The smoke suite on this host's torch, run once per session and read by every test that asks.

`python -m smoke_tests --json` on this host (a real gloo all-reduce, a real Inductor compile: a
minute or more on 2 cores) is one run: test_smoke_tests' CLI tests read its report, and
test_verify's `verify --local --json` replays it (the table's run, docs/verify.md's command,
is the real subprocess path, through host_verify).
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
