"""The reader that owns zstd:chunked: Podman 5 (Debian 13's 5.4, containers/storage 1.57) pulls
layers that publish's writer and push made, partially, from the local registry (issue 55).

containers/storage 1.57 takes the index's entry marked zstd, reads its own annotations
(io.github.containers.zstd-chunked.*), the TOC and the tar-split at the positions they name,
checks the TOC's digest and the tar-split's (`tarSplitDigest`), and that every entry's metadata
agrees in both (ensureTOCMatchesTarSplit: a disagreement fails the pull); without a tar-split it
downloads the whole blob. The second image (support.chunked_images: one new file of seven, and
the varied entries that check compares) must then come in Range requests, for under a quarter
of its blob; `podman save` gives back its layer's tar from the tar-split, which must be the
layer's diff (its DiffID), byte for byte; both images run.

Podman 5 needs glibc 2.38, newer than Debian 12's: it runs in a privileged container of the
tool image .ci/setup --tests makes (.ci/podman5-image.sh), its store in an anonymous volume
(overlay over the container's own overlay root would not mount), removed with the container.
The container shares the host's network namespace to reach the registry on 127.0.0.1, as the
Podman 4 test's Podman on the host does; its `podman run` has --network none, so nothing in
the host's networking is set up or changed. ~5 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request

import pytest

from imagebuilder.registry.manifests import OCI_INDEX, ZSTD_ANNOTATION
from support.chunked_images import MIB, fetched, push, two_images
from support.registry import access_log
from support.unavailable import _unavailable

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.beside_builds]

TOOL_IMAGE = "imagebuilder-podman5:trixie"

# Run by bash in the tool image with the images' references as its arguments: each pulled with
# partial pulls on (the debug log's lines that say how), then run; the last one's layer saved.
PULLS = r"""
mkdir -p /etc/containers
cat >/etc/containers/storage.conf <<'EOF'
[storage]
driver = "overlay"
graphroot = "/var/lib/containers/storage"
runroot = "/run/containers/storage"
[storage.options]
pull_options = {enable_partial_images = "true", use_hard_links = "false"}
EOF
export PODMAN_IGNORE_CGROUPSV1_WARNING=1
podman --version
for image in "$@"; do
    podman --log-level debug pull --tls-verify=false "$image" >/dev/null 2>/tmp/pull.log \
        || { tail -n 40 /tmp/pull.log; exit 1; }
    grep -oE 'copying \(only\) instance sha256:[0-9a-f]+|Missing [0-9]+ bytes out of [0-9]+|Retrieved partial blob sha256:[0-9a-f]+|without tar-split[^"]*' /tmp/pull.log || true
    podman run --rm --network none --cgroup-manager cgroupfs --events-backend none "$image" \
        /bin/dash -c 'read line </marker; echo "said $line"'
done
mkdir /tmp/saved
podman save --format docker-archive --output /tmp/saved.tar "$image" >/dev/null
tar -C /tmp/saved -xf /tmp/saved.tar
for layer in /tmp/saved/*.tar; do echo "saved layer sha256:$(sha256sum <"$layer" | cut -d' ' -f1)"; done
"""


def _zstd_instance(address: str, repository: str) -> str:
    """The digest of the index's entry marked zstd (containers/storage's annotations)."""
    asked = urllib.request.Request(f"http://{address}/v2/{repository}/manifests/v1", headers={"Accept": OCI_INDEX})
    with urllib.request.urlopen(asked, timeout=30) as answer:
        index = json.load(answer)
    marked = [entry["digest"] for entry in index["manifests"] if ZSTD_ANNOTATION in entry.get("annotations", {})]
    assert len(marked) == 1, index
    return str(marked[0])


def test_podman5_pulls_zstd_chunked_layers_partially_with_their_tar_split(docker_engine, registry: str) -> None:
    if not docker_engine.image_exists(TOOL_IMAGE):
        _unavailable(f"{TOOL_IMAGE} is missing: .ci/setup --tests makes it (.ci/podman5-image.sh)")
    images = two_images()
    # Five chunks of 4 MiB; the second copied ahead for the snapshotter (a TOC of its own), and the
    # one the second image changes: containers/storage finds the others in the first image's file
    # and must fetch that one from its place, not from the copy through the blob's middle.
    big = {"first": os.urandom(20 * MIB)}
    big["second"] = big["first"][:4 * MIB] + os.urandom(4 * MIB) + big["first"][8 * MIB:]
    written = {name: push(registry, f"imagebuilder-test/podman5-{name}", {**files, "data/big": big[name]},
                          varied=True, copied={"/data/big": {1}}) for name, files in images.items()}
    assert all(layer.copied_chunks == 1 for layer in written.values())
    refs = [f"{registry}/imagebuilder-test/podman5-{name}:v1" for name in images]
    container = f"imagebuilder-test-podman5-{os.getpid()}"
    try:
        done = subprocess.run(["docker", "run", "--rm", "--name", container, "--privileged", "--network", "host",
                               "--volume", "/var/lib/containers", TOOL_IMAGE, "bash", "-euo", "pipefail", "-c", PULLS,
                               "pulls", *refs], capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run(["docker", "rm", "--force", "--volumes", container], capture_output=True, timeout=60, check=False)
    out = done.stdout
    assert done.returncode == 0, f"{out[-3000:]}\n{done.stderr[-3000:]}"
    assert out.startswith("podman version 5."), out[:200]
    assert "without tar-split" not in out, out  # storage's fallback to a whole download
    for name, layer in written.items():
        assert f"copying (only) instance {_zstd_instance(registry, f'imagebuilder-test/podman5-{name}')}" in out, out
        assert f"Retrieved partial blob {layer.digest}" in out, out
    assert [line for line in out.splitlines() if line.startswith("said ")] == [f"said {n}" for n in images]
    second = written["second"]
    missing = [tuple(map(int, found)) for found in re.findall(r"Missing (\d+) bytes out of (\d+)", out)]
    assert len(missing) == 2 and missing[1][0] < missing[1][1] // 4, missing  # what the store lacked of the tar
    ranges, sent = fetched(access_log(registry), second.digest)
    # f7, the marker and big's second chunk, from their places (random bytes: compressed as large): 9.4 MB
    # of 33.6 MB, where containers/storage given the snapshotter's TOC (the copy) fetched 26.2 MB.
    assert ranges >= 1 and 5 * MIB < sent < second.size // 3, (ranges, sent, second.size)
    # the layer's tar as containers/storage gives it back (tar-split + files): the DiffID
    assert f"saved layer {second.diff_id}" in out, out
