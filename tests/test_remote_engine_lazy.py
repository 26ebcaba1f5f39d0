"""The lazy-pull engine (tests/remote_engine.py, lazy=True), for real on a small image: an
eStargz image (the base plus 40 MB of random files and a marker) pushed to a local registry
is pulled by an empty engine on the stargz snapshotter, which fetches each layer's table of
contents and mounts the layer over FUSE; a file's bytes come down when it is read.

The cold-start benchmark (bench/bench_coldstart.py) measures the same for torch: what a
cold node downloads before `import torch` when it needs only what that reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from support.cleanup import remove_images
from support.unavailable import _unavailable

pytestmark = [pytest.mark.docker, pytest.mark.registry]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
TOC_DIGEST = "containerd.io/snapshot/stargz/toc.digest"


def _manifest(registry: str, repository: str, reference: str) -> dict[str, Any]:
    """The image's manifest from the registry (the amd64 one, when it pushed an index)."""
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{reference}",
                                     headers={"Accept": f"{OCI_MANIFEST},{OCI_INDEX}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        manifest: dict[str, Any] = json.load(response)
    if manifest.get("mediaType") == OCI_INDEX:
        (digest,) = [m["digest"] for m in manifest["manifests"] if m.get("platform", {}).get("architecture") == "amd64"]
        return _manifest(registry, repository, digest)
    return manifest


def _build_records() -> dict[str, str]:
    """BuildKit's cache records on this host's daemon: id -> description."""
    done = subprocess.run(["docker", "system", "df", "-v", "--format", "{{json .BuildCache}}"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not done.stdout.strip():
        return {}
    return {str(r["ID"]): str(r.get("Description", "")) for r in json.loads(done.stdout) or []}


@pytest.fixture
def estargz_image(docker_engine: Any, registry: str, base_image: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The small eStargz image, built on this host's daemon and pushed; its local image and the
    BuildKit records of its build (by their unique marker) are removed after."""
    tag = uuid.uuid4().hex[:12]
    repository = f"imagebuilder-test/lazy-{tag}"
    ref, marker = f"{registry}/{repository}:v1", f"lazy-pull-{tag}"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN mkdir /data && for i in $(seq 1 40); do head -c 1048576 /dev/urandom >/data/f$i; done"
        f" && sha256sum /data/f7 | cut -d' ' -f1 >/f7.sha256 && echo {marker} >/marker\n")
    before = _build_records()
    try:
        done = subprocess.run(
            ["docker", "buildx", "build", "--output",
             f"type=image,name={ref},push=true,compression=estargz,force-compression=true,oci-mediatypes=true,"
             "registry.insecure=true", str(tmp_path)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        manifest = _manifest(registry, repository, "v1")
        yield {"ref": ref, "marker": marker, "layers": manifest["layers"]}
    finally:
        remove_images(docker_engine, [ref])
        for record, description in _build_records().items():
            if record not in before and marker in description:
                subprocess.run(["docker", "builder", "prune", "--force", "--all", "--filter", f"id={record}"],
                               env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, timeout=120, check=False)


@contextmanager
def _lazy_engine(registry: str) -> Iterator[Any]:
    """The empty lazy-pull engine; skips (fails in CI) where it cannot be made."""
    from remote_engine import remote_engine  # type: ignore[import-not-found]

    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        _unavailable("ip netns does not work here (root and iproute2 needed) for the remote engine")
    for tool, why in (("containerd", "the lazy engine's own containerd (Debian's containerd package)"),
                      ("containerd-stargz-grpc", "the stargz snapshotter (.ci/stargz-install.sh builds it)")):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not installed: {why}")
    if not Path("/dev/fuse").exists():
        _unavailable("/dev/fuse does not exist: the stargz snapshotter mounts layers over FUSE")
    with remote_engine(int(registry.rsplit(":", 1)[1]), lazy=True) as engine:
        yield engine


def _fuse_mounts(under: str) -> list[str]:
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[2].startswith("fuse") and line.split()[1].startswith(under)]


def _sent(link: str) -> int:
    return int(Path(f"/sys/class/net/{link}/statistics/tx_bytes").read_text())


def test_a_lazy_pull_moves_a_fraction_of_the_layers_and_the_files_read_are_right(
        estargz_image: dict[str, Any], registry: str) -> None:
    layers = estargz_image["layers"]
    assert all(TOC_DIGEST in layer.get("annotations", {}) for layer in layers), layers
    layer_bytes = sum(layer["size"] for layer in layers)
    assert layer_bytes > 40_000_000  # the random files do not compress

    with _lazy_engine(registry) as lazy_engine:
        env, ref = lazy_engine.env(), estargz_image["ref"]
        assert subprocess.run(["docker", "info", "--format", "{{.Driver}}"], env=env, capture_output=True,
                              text=True, timeout=60).stdout.strip() == "stargz"
        before = _sent(lazy_engine.link)
        pulled = subprocess.run(["docker", "pull", "--quiet", ref], env=env, capture_output=True, text=True, timeout=120)
        moved = _sent(lazy_engine.link) - before
        assert pulled.returncode == 0, pulled.stderr[-3000:]
        # Each layer's table of contents (and the base's prefetched files), not the layers.
        assert moved < layer_bytes / 2, f"the lazy pull moved {moved:,} bytes of {layer_bytes:,}"
        # Every layer is a FUSE mount of the snapshotter's, under the engine's root.
        root = str(lazy_engine.cert_path.parent)
        assert len(_fuse_mounts(root)) == len(layers), _fuse_mounts(root)

        # The files read come down, and are what the build wrote.
        ran = subprocess.run(["docker", "run", "--rm", ref, "sh", "-c",
                              "cat /marker; sha256sum /data/f7 | cut -d' ' -f1; cat /f7.sha256"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr[-3000:]
        marker, f7, f7_at_build = ran.stdout.split()
        assert marker == estargz_image["marker"]
        assert f7 == f7_at_build

    # Stopped (SIGINT), the snapshotter unmounted every layer itself: the teardown found
    # nothing left mounted under the engine's root, and removed the root.
    assert lazy_engine.left_mounted == []
    assert _fuse_mounts(root) == [] and not Path(root).exists()
