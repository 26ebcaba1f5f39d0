"""A real containers/storage reader: Podman pulls zstd:chunked layers that publish's writer and
push (imagebuilder/publish/estargz.py) made, with partial pulls on, from the local registry.

Two one-layer images, no Docker needed: a root of the host's dash and libc, six files of 1 MiB
random bytes and a marker; the second the same with a seventh file and another marker. Podman,
its storage in a folder of this test's own (CONTAINERS_STORAGE_CONF, `--root`, `--runroot`,
`--tmpdir`: the host's Podman setup is not touched), pulls the first, then the second: the second
layer is a new blob, but containers/storage finds the files it already holds by the TOC's digests
and asks the registry, in Range requests, for the rest only. Both images then run.

Which annotations Podman reads depends on its containers/storage (estargz/zstdchunked.py): Debian
12's Podman 4.3 (storage 1.43) takes the index's first entry and reads the older
io.containers.zstd-chunked.* names, and no tar-split; Podman 5 (storage 1.57, Debian 13) takes
the entry marked zstd, containers/storage's names, and refuses a layer without tar-split.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.chunked_images import MIB, fetched, push, two_images
from support.registry import access_log
from support.unavailable import _unavailable


@pytest.mark.registry
def test_podman_pulls_zstd_chunked_layers_partially_and_runs_them(registry: str) -> None:
    podman = shutil.which("podman") or ""
    if not podman:
        _unavailable("podman is not installed (Debian: apt-get install podman)")
    big = os.urandom(10 * MIB)  # three chunks; the second copied ahead for the snapshotter (a TOC of its own)
    images = {name: {**files, "data/big": big} for name, files in two_images().items()}
    state = Path(tempfile.mkdtemp(prefix="ib-podman-"))  # Podman refuses a runroot over 50 characters
    conf = state / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{state / "root"}"\nrunroot = "{state / "run"}"\n'
                    '[storage.options]\npull_options = {enable_partial_images = "true", use_hard_links = "false"}\n')
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)}
    base = [podman, "--root", str(state / "root"), "--runroot", str(state / "run"), "--tmpdir", str(state / "tmp"),
            "--cgroup-manager", "cgroupfs", "--events-backend", "none"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, (args, done.stderr[-3000:])
        return done

    pulled_bytes = {}
    try:
        for name, files in images.items():
            image = f"{registry}/imagebuilder-test/podman-{name}:v1"
            written = push(registry, f"imagebuilder-test/podman-{name}", files, copied={"/data/big": {1}})
            assert written.copied_chunks == 1
            before = fetched(access_log(registry), written.digest)
            pulled = run("--log-level", "debug", "pull", "--tls-verify=false", image)
            assert f"Retrieved partial blob {written.digest}" in pulled.stderr, pulled.stderr[-3000:]
            after = fetched(access_log(registry), written.digest)
            pulled_bytes[name] = (written.size, after[0] - before[0], after[1] - before[1])
            # the sandbox's hard limits are below Podman's defaults for them
            said = run("run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                       image, "/bin/dash", "-c", "read line </marker; echo $line").stdout
            assert said.split() == [name], said
            mounted = Path(run("image", "mount", image).stdout.strip())  # what the partial pull put in the store
            try:
                assert {path: (mounted / path).read_bytes() for path in files} == files
            finally:
                run("image", "unmount", image)
        size, ranges, sent = pulled_bytes["second"]  # its other files were in the store: only f7 and the marker came
        assert ranges >= 1 and 0 < sent < size // 4, pulled_bytes
    finally:
        subprocess.run([*base, "rmi", "--all", "--force"], capture_output=True, timeout=120, env=env, check=False)
        for mount in reversed([line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                               if line.split()[1].startswith(str(state))]):
            subprocess.run(["umount", mount], capture_output=True, timeout=30, check=False)
        shutil.rmtree(state, ignore_errors=True)
