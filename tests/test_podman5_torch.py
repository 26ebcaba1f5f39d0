"""Podman 5 (containers/storage 1.57) pulls a torch image partially and imports torch from it
(issue 55, item 2): two one-layer zstd:chunked images that publish's writer and push made from
this host's files (support.torch_rootfs): the interpreter with its standard library, then the
same plus torch and what its import loads (~0.9 GB). Pulled second, the torch image's layer is a
new blob, but containers/storage finds the interpreter's files in the first image's layer by
the TOC's digests and fetches the rest in Range requests: fewer bytes than the blob. Then the
image runs `import torch` and a tensor sum, offline.

The tool image and its privileged container as in test_podman5_partial.py. ~40 s.
"""

from __future__ import annotations

import os
import sys

import pytest

from support.chunked_images import fetched
from support.podman5 import run_podman5, zstd_instance
from support.registry import access_log
from support.torch_rootfs import push_tree, python_root, torch_packages
from support.unavailable import _unavailable

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.beside_builds]

PULLS = r"""
python=$1; shift
for image in "$@"; do
    podman --log-level debug pull --tls-verify=false "$image" >/dev/null 2>/tmp/pull.log \
        || { tail -n 40 /tmp/pull.log; exit 1; }
    grep -oE 'copying \(only\) instance sha256:[0-9a-f]+|Retrieved partial blob sha256:[0-9a-f]+|without tar-split[^"]*' /tmp/pull.log || true
done
podman run --rm --network none --cgroup-manager cgroupfs --events-backend none "$image" \
    "$python" -c 'import torch; print("torch", torch.__version__, torch.ones(3).sum().item())'
"""


def test_podman5_pulls_a_torch_image_partially_and_imports_torch(docker_engine, registry: str) -> None:
    try:
        import torch
    except ImportError:
        _unavailable("torch is not in this venv (.ci/setup --tests installs it)")
    python = os.path.realpath(sys.executable)
    root = python_root()
    written = {"python": push_tree(registry, "imagebuilder-test/podman5-python", root, [python]),
               "torch": push_tree(registry, "imagebuilder-test/podman5-torch", root + torch_packages(), [python])}
    refs = [f"{registry}/imagebuilder-test/podman5-{name}:v1" for name in written]
    done = run_podman5(docker_engine, PULLS, [python, *refs], timeout=600)
    out = done.stdout
    assert done.returncode == 0, f"{out[-3000:]}\n{done.stderr[-3000:]}"
    assert "without tar-split" not in out, out
    for name, layer in written.items():
        assert f"copying (only) instance {zstd_instance(registry, f'imagebuilder-test/podman5-{name}')}" in out, out
        assert f"Retrieved partial blob {layer.digest}" in out, out
    assert f"torch {torch.__version__} 3.0" in out.splitlines(), out[-2000:]
    layer = written["torch"]
    ranges, sent = fetched(access_log(registry), layer.digest)
    # the interpreter's files came from the first image's layer: only the packages' bytes came
    assert ranges >= 1 and 0 < sent < layer.size - written["python"].size // 2, (ranges, sent, layer.size)
