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

import os
import re

import pytest

from support.chunked_images import MIB, fetched, push, two_images
from support.registry import access_log
from support.podman5 import run_podman5, zstd_instance

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.beside_builds]

# Run by bash in the tool image (after support.podman5's PARTIAL_PULLS) with the images' references
# as its arguments: each pulled (the debug log's lines that say how), then run; the last one's layer saved.
PULLS = r"""
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


def test_podman5_pulls_zstd_chunked_layers_partially_with_their_tar_split(docker_engine, registry: str) -> None:
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
    done = run_podman5(docker_engine, PULLS, refs, timeout=300)
    out = done.stdout
    assert done.returncode == 0, f"{out[-3000:]}\n{done.stderr[-3000:]}"
    assert out.startswith("podman version 5."), out[:200]
    assert "without tar-split" not in out, out  # storage's fallback to a whole download
    for name, layer in written.items():
        assert f"copying (only) instance {zstd_instance(registry, f'imagebuilder-test/podman5-{name}')}" in out, out
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
