"""Podman 5 (Debian 13's 5.4, containers/storage 1.57) for the tests: its tool image, which
.ci/setup --tests makes (.ci/podman5-image.sh), run privileged with the host's network (to reach
the registry on 127.0.0.1) and its store in an anonymous volume, removed with the container."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Sequence
from typing import Any

from imagebuilder.registry.manifests import OCI_INDEX, ZSTD_ANNOTATION

from .unavailable import _unavailable

TOOL_IMAGE = "imagebuilder-podman5:trixie"

PARTIAL_PULLS = r"""
mkdir -p /etc/containers
cat >/etc/containers/storage.conf <<'END'
[storage]
driver = "overlay"
graphroot = "/var/lib/containers/storage"
runroot = "/run/containers/storage"
[storage.options]
pull_options = {enable_partial_images = "true", use_hard_links = "false"}
END
export PODMAN_IGNORE_CGROUPSV1_WARNING=1
"""
"""The start of a script run in the tool image: partial pulls on."""


def run_podman5(docker_engine: Any, script: str, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """bash -euo pipefail -c PARTIAL_PULLS + `script` with `args`, in a container of the tool
    image (removed, with its store, however it ends)."""
    if not docker_engine.image_exists(TOOL_IMAGE):
        _unavailable(f"{TOOL_IMAGE} is missing: .ci/setup --tests makes it (.ci/podman5-image.sh)")
    container = f"imagebuilder-test-podman5-{os.getpid()}"
    try:
        return subprocess.run(["docker", "run", "--rm", "--name", container, "--privileged", "--network", "host",
                               "--cpu-shares", "256",  # (under contention: CI builds beside it come first)
                               "--volume", "/var/lib/containers", TOOL_IMAGE, "bash", "-euo", "pipefail", "-c",
                               PARTIAL_PULLS + script, "pulls", *args], capture_output=True, text=True, timeout=timeout)
    finally:
        subprocess.run(["docker", "rm", "--force", "--volumes", container], capture_output=True, timeout=60, check=False)


def zstd_instance(address: str, repository: str) -> str:
    """The digest of the index's entry marked zstd (containers/storage's annotations)."""
    asked = urllib.request.Request(f"http://{address}/v2/{repository}/manifests/v1", headers={"Accept": OCI_INDEX})
    with urllib.request.urlopen(asked, timeout=30) as answer:
        index = json.load(answer)
    marked = [entry["digest"] for entry in index["manifests"] if ZSTD_ANNOTATION in entry.get("annotations", {})]
    assert len(marked) == 1, index
    return str(marked[0])
