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

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from imagebuilder.engine.export import ZSTD_CHUNKED
from imagebuilder.estargz.saved import SavedImage
from imagebuilder.estargz.writer import Written, write_estargz
from imagebuilder.publish.estargz import _put
from imagebuilder.registry.client import HttpRegistry
from support.registry import access_log
from support.unavailable import _unavailable

ROOT_FILES = ("/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2")
MIB = 1 << 20


def _layer(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        folders = sorted({str(Path(name).parent) for name in files} - {"."})
        for folder in folders:
            info = tarfile.TarInfo(folder + "/")
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _push(address: str, repository: str, files: dict[str, bytes]) -> Written:
    """The one-layer image of `files` as publish pushes zstd:chunked: the blob, then _put's
    config, manifests and index under :v1."""
    ref = f"{address}/{repository}:v1"
    out = io.BytesIO()
    written = write_estargz(io.BytesIO(_layer(files)), out, codec=ZSTD_CHUNKED, level=3, workers=2)
    registry = HttpRegistry()
    registry.upload_blob(ref, written.digest, io.BytesIO(out.getvalue()), written.size)
    config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
              "config": {"Cmd": ["/bin/dash"]}}
    saved = SavedImage(manifest={}, config=json.dumps(config).encode(), layers=(),
                       platform={"os": "linux", "architecture": "amd64"})
    _put(ref, [ref], saved, [written], None, registry)
    return written


def _fetched(log: Path, digest: str) -> tuple[int, int]:
    """(Range requests answered 206, bytes sent) for the blob `digest`, from the access log."""
    ranges = sent = 0
    for line in log.read_text(errors="replace").splitlines():
        found = re.search(rf'"GET /v2/[^ ]*/blobs/{digest} HTTP/[0-9.]+" (\d+) (\d+)', line)
        if found:
            ranges += found.group(1) == "206"
            sent += int(found.group(2))
    return ranges, sent


@pytest.mark.registry
def test_podman_pulls_zstd_chunked_layers_partially_and_runs_them(registry: str) -> None:
    podman = shutil.which("podman") or ""
    if not podman:
        _unavailable("podman is not installed (Debian: apt-get install podman)")
    if any(not Path(path).exists() for path in ROOT_FILES):
        _unavailable(f"the image's root is the host's dash and libc: {', '.join(ROOT_FILES)}")
    root = {name.lstrip("/"): Path(name).read_bytes() for name in ROOT_FILES}
    data = {f"data/f{i}": os.urandom(MIB) for i in range(1, 8)}
    images = {"first": {**root, **{k: v for k, v in data.items() if k != "data/f7"}, "marker": b"first\n"},
              "second": {**root, **data, "marker": b"second\n"}}
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

    fetched = {}
    try:
        for name, files in images.items():
            image = f"{registry}/imagebuilder-test/podman-{name}:v1"
            written = _push(registry, f"imagebuilder-test/podman-{name}", files)
            before = _fetched(access_log(registry), written.digest)
            pulled = run("--log-level", "debug", "pull", "--tls-verify=false", image)
            assert f"Retrieved partial blob {written.digest}" in pulled.stderr, pulled.stderr[-3000:]
            after = _fetched(access_log(registry), written.digest)
            fetched[name] = (written.size, after[0] - before[0], after[1] - before[1])
            # the sandbox's hard limits are below Podman's defaults for them
            said = run("run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                       image, "/bin/dash", "-c", "read line </marker; echo $line").stdout
            assert said.split() == [name], said
            mounted = Path(run("image", "mount", image).stdout.strip())  # what the partial pull put in the store
            try:
                assert {path: (mounted / path).read_bytes() for path in files} == files
            finally:
                run("image", "unmount", image)
        size, ranges, sent = fetched["second"]  # its other files were in the store: only f7 and the marker came
        assert ranges >= 1 and 0 < sent < size // 4, fetched
    finally:
        subprocess.run([*base, "rmi", "--all", "--force"], capture_output=True, timeout=120, env=env, check=False)
        for mount in reversed([line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                               if line.split()[1].startswith(str(state))]):
            subprocess.run(["umount", mount], capture_output=True, timeout=30, check=False)
        shutil.rmtree(state, ignore_errors=True)
