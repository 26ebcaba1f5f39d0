"""An image imagebuilder did not build is lent this imagebuilder's smoke tests, copied in
through the API, with the versions its own torch reports as the expectations.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import smoke_tests
from smoke_tests.expected import DEFAULT_MANIFEST

from ..engine.api import Runner, RunResult
from ..engine.errors import ContainerFailed

PROBE_TIMEOUT = 120.0
"""Seconds for the torch probe of an image without a manifest (importing torch takes a few)."""

CONTAINER_SMOKE_TESTS = "/opt/imagebuilder/host"
"""Where this imagebuilder's smoke_tests package goes in a container of an image that is lent them."""
LENT_MANIFEST = f"{CONTAINER_SMOKE_TESTS}/manifest.json"

# --------------------------------------------------------------------------- lent smoke tests


PROBE_PREFIX = "IMAGEBUILDER_PROBE "
TORCH_PROBE = f"""
import json, sys
found = {{"python": ".".join(map(str, sys.version_info[:3]))}}
try:
    import torch
    found.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
except Exception as e:
    found["error"] = repr(e)
print({PROBE_PREFIX!r} + json.dumps(found))
"""


def expected_from_torch(output: str) -> dict[str, Any] | None:
    """Pure: the torch probe's output -> a manifest of what the image's own torch reports.

    Without a manifest that is the best statement of what the image is; None when the probe
    found no torch (the smoke tests then say why, in their own words).
    """
    for line in reversed(output.splitlines()):
        if line.startswith(PROBE_PREFIX):
            try:
                found = json.loads(line[len(PROBE_PREFIX):])
            except ValueError:
                return None
            if not isinstance(found, dict) or not found.get("torch"):
                return None
            return {"torch": found["torch"], "torch_cuda": found.get("torch_cuda"), "python": found.get("python")}
    return None


def not_pytorch(outcome: RunResult | str) -> str | None:
    """Pure: why the torch probe's run (or the daemon's refusal to start it) shows an image
    that is not a PyTorch image at all; None when it may be one."""
    text = outcome if isinstance(outcome, str) else outcome.output
    if re.search(r'executable file not found|exec: "python3"|python3: not found', text):
        return "it has no python3 on its PATH"
    if re.search(r"No module named .?torch.?[\"')]", text):
        return "its python3 cannot import torch"
    return None


def probe_torch(engine: Runner, ref: str, timeout: float) -> tuple[dict[str, Any] | None, str | None]:
    """What the image's own torch reports (None: not read), and why it is not a PyTorch image."""
    try:
        run = engine.run(ref, ["python3", "-c", TORCH_PROBE], timeout=min(PROBE_TIMEOUT, timeout))
    except ContainerFailed as e:
        return None, not_pytorch(e.detail)
    if run.timed_out:
        return None, None
    return expected_from_torch(run.output), not_pytorch(run)


def smoke_tests_archive(manifest: Mapping[str, Any] | None) -> bytes:
    """This imagebuilder's smoke_tests package, and the lent manifest, as a tar to unpack at /.

    Copied into the container through the API rather than bind-mounted: a remote daemon
    (DOCKER_HOST=ssh://...) has no such host path. Files only, so that unpacking creates
    what is missing and changes no directory the image has.
    """
    package = Path(smoke_tests.__file__).resolve().parent
    root = CONTAINER_SMOKE_TESTS.lstrip("/")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(package.rglob("*.py")):
            _add_file(tar, f"{root}/smoke_tests/{path.relative_to(package).as_posix()}", path.read_bytes())
        if manifest is not None:
            _add_file(tar, LENT_MANIFEST.lstrip("/"), json.dumps(manifest, indent=2).encode())
    return buffer.getvalue()


def _add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    # Readable by whatever user the image runs as.
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def lend_notice(ref: str, expected: Mapping[str, Any] | None, *, asked: bool) -> str:
    why = "--mount-smoke-tests" if asked else "it carries no imagebuilder labels"
    if expected is not None:
        cuda = f"CUDA {expected['torch_cuda']}" if expected.get("torch_cuda") else "CPU build"
        expecting = f"expecting what its own torch reports: torch {expected['torch']} ({cuda})"
    elif asked:
        expecting = f"expecting what its manifest ({DEFAULT_MANIFEST}) says"
    else:
        expecting = "its torch could not be read, so there are no expectations"
    return (f"notice: {ref}: {why}, so it is verified with this imagebuilder's smoke tests, copied into "
            f"the container; {expecting}")


