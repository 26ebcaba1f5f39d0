"""Issue 43: the published squashfs read lazily on a node (`imagebuilder squashfs --lazy`).

The chunk table (pure); publish's second blob; verified range reads through the chunk cache
from a real local registry, and through the fault proxy corrupting the blob; a real
nbdkit + nbdfuse serving the squashfs file, mounted by squashfuse and read, an EIO and one
line where the blob is corrupted after the mount; an artifact without a table read whole;
the pyxis importer with IMAGEBUILDER_LAZY=1. Seconds each: the squashfs is of ~12 MiB.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fault_proxy import Fault, FaultProxy
from squashfs_images import E, push_image

from support.real_images import REPO_ROOT
from support.unavailable import _unavailable
from imagebuilder.cli import cli
from imagebuilder.publish.squashfs import SquashfsPublisher
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.squashfs.artifact import CHUNKS_TYPE, LAYER_TYPE, push_artifact
from imagebuilder.squashfs.chunk_cache import ChunkCache
from imagebuilder.squashfs.chunks import BadChunkTable, ChunkCorrupt, ChunkTable, parse_table, table_of
from imagebuilder.squashfs.lazy import work_folder

MIB = 1 << 20
BIG = b"".join(hashlib.sha256(str(n).encode()).digest() for n in range(12 * MIB // 32))
"""12 MiB that zstd cannot shrink: the squashfs spans 12+ chunks."""


# --- the chunk table (pure) -------------------------------------------------------------------


def test_the_chunk_table_names_each_mib_and_refuses_a_wrong_chunk(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(BIG[:2 * MIB + 5])
    body = table_of(path)
    table = parse_table(body, "sha256:x", 2 * MIB + 5)
    assert table.digests == tuple(hashlib.sha256(BIG[start:min(start + MIB, 2 * MIB + 5)]).hexdigest()
                                  for start in (0, MIB, 2 * MIB))
    assert list(table.chunks(MIB - 1, 2)) == [0, 1] and list(table.chunks(2 * MIB, 100)) == [2]
    assert table.span(2) == (2 * MIB, 5)
    table.check(2, BIG[2 * MIB:2 * MIB + 5], "sha256:blob")
    with pytest.raises(ChunkCorrupt, match=r"^chunk 1 of the squashfs sha256:blob \(bytes 1048576-2097151\) "
                                           r"arrived with sha256 \w{16}, not \w{16}: the registry or the link"):
        table.check(1, BIG[:MIB], "sha256:blob")


@pytest.mark.parametrize(("body", "size", "why"), [
    (b"not json", 10, "not a table"),
    (json.dumps({"chunk_size": MIB, "size": 5, "sha256": ["0" * 64]}).encode(), 6, "of 5 bytes"),
    (json.dumps({"chunk_size": MIB, "size": MIB + 1, "sha256": ["0" * 64]}).encode(), MIB + 1, "1 digests for 2"),
])
def test_a_bad_chunk_table_is_refused_in_one_line(body: bytes, size: int, why: str) -> None:
    with pytest.raises(BadChunkTable, match=why):
        parse_table(body, "sha256:t", size)


# --- a published squashfs in a real registry ----------------------------------------------------


@pytest.fixture(scope="module")
def lazy_image(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An image of a 12 MiB file and a small one in the module's registry, its squashfs published."""
    if shutil.which("mksquashfs") is None or shutil.which("zstd") is None:
        _unavailable("these tests need Debian's squashfs-tools and zstd (.ci/setup --tests installs them)")
    repository = "imagebuilder-test/lazy"
    digest = push_image(upstream, repository, "runtime", [(
        [E("data", "dir", mode=0o755), E("data/big.bin", data=BIG), E("data/small.txt", data="small\n")], "zstd")],
        {"Env": ["PATH=/usr/bin:/bin"]})
    registry = HttpRegistry(config={})
    publisher = SquashfsPublisher(registry, say=lambda line: None, workdir=tmp_path_factory.mktemp("lazy-work"))
    outcome = publisher.ensure(f"{upstream}/{repository}:runtime", "linux/amd64")
    return {"repository": repository, "digest": digest, "outcome": outcome, "registry": registry}


def _blob(registry: HttpRegistry, ref: str, digest: str) -> bytes:
    out = io.BytesIO()
    registry.download_blob(ref, digest, out)
    return out.getvalue()


def _table(lazy_image: dict, host: str) -> tuple[ChunkTable, bytes]:
    registry, outcome = lazy_image["registry"], lazy_image["outcome"]
    manifest = registry.manifest(outcome.artifact)[0]
    assert [layer["mediaType"] for layer in manifest["layers"]] == [LAYER_TYPE, CHUNKS_TYPE]
    table_layer = manifest["layers"][1]
    body = _blob(registry, outcome.artifact, table_layer["digest"])
    squashfs = _blob(registry, outcome.artifact, outcome.blob)
    return parse_table(body, table_layer["digest"], len(squashfs)), squashfs


@pytest.mark.registry
def test_publish_adds_the_chunk_table_as_a_second_blob_of_the_artifact(lazy_image: dict, upstream: str) -> None:
    table, squashfs = _table(lazy_image, upstream)
    assert len(table.digests) >= 12
    assert table.digests == tuple(hashlib.sha256(squashfs[start:start + MIB]).hexdigest()
                                  for start in range(0, len(squashfs), MIB))


@pytest.mark.registry
def test_range_reads_fetch_only_the_chunks_read_each_checked(lazy_image: dict, proxy: FaultProxy,
                                                             tmp_path: Path) -> None:
    table, squashfs = _table(lazy_image, proxy.upstream)
    ref = f"{proxy.address}/{lazy_image['repository']}@{lazy_image['outcome'].blob}"
    cache = ChunkCache(HttpRegistry(config={}), ref, lazy_image["outcome"].blob, table, tmp_path / "cache",
                       readahead=0)
    try:
        assert cache.pread(MIB - 10, 20) == squashfs[MIB - 10:MIB + 10]  # across a chunk boundary: two chunks
        assert (cache.requests, cache.fetched_bytes) == (1, 2 * MIB)  # next to each other: one range GET
        assert cache.pread(MIB, 100) == squashfs[MIB:MIB + 100]  # cached: no request
        assert cache.requests == 1
        proxy.inject(Fault("GET", r"/blobs/", corrupt=True, times=None))
        with pytest.raises(ChunkCorrupt, match=r"^chunk 5 of the squashfs sha256:\w+ \(bytes 5242880-6291455\)"):
            cache.pread(5 * MIB + 3, 10)
        assert cache.pread(MIB + 5, 5) == squashfs[MIB + 5:MIB + 10]  # what was checked is still served
        proxy.faults.clear()
        assert cache.pread(5 * MIB + 3, 10) == squashfs[5 * MIB + 3:5 * MIB + 13]  # the corrupt one was not kept
    finally:
        cache.close()
    assert os.stat(tmp_path / "cache").st_blocks * 512 < 4 * MIB  # sparse: only the chunks fetched


@pytest.mark.registry
def test_readahead_follows_a_read_into_the_next_chunk_and_not_a_jump(lazy_image: dict, upstream: str,
                                                                     tmp_path: Path) -> None:
    table, squashfs = _table(lazy_image, upstream)
    ref = f"{upstream}/{lazy_image['repository']}@{lazy_image['outcome'].blob}"
    cache = ChunkCache(HttpRegistry(config={}), ref, lazy_image["outcome"].blob, table, tmp_path / "cache",
                       readahead=2)
    try:
        assert cache.pread(10, 10) == squashfs[10:20]  # the first read: no readahead
        assert cache.pread(20, 10) == squashfs[20:30]  # the same chunk again: none
        assert cache.pread(5 * MIB, 10) == squashfs[5 * MIB:5 * MIB + 10]  # a jump: none
        assert cache.pread(MIB - 5, 10) == squashfs[MIB - 5:MIB + 5]  # on into chunk 1: chunks 2 and 3 ahead
    finally:
        cache.close()  # waits for the readahead
    assert (cache.fetched_bytes, cache.requests) == (5 * MIB, 4)


# --- nbdkit + nbdfuse + squashfuse ------------------------------------------------------------


def _need_tools() -> None:
    for tool, package in (("nbdkit", "nbdkit"), ("nbdfuse", "libnbd-bin"), ("squashfuse", "squashfuse")):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is missing: Debian's {package} (.ci/setup --tests installs it)")
    if subprocess.run(["nbdkit", "--dump-plugin", "python"], capture_output=True).returncode != 0:
        _unavailable("nbdkit's python plugin is missing: Debian's nbdkit-plugin-python (.ci/setup --tests installs it)")


@pytest.fixture
def served(lazy_image: dict, proxy: FaultProxy, tmp_path: Path) -> Iterator[Path]:
    """The squashfs served lazily through the proxy at tmp_path/image.sqfs; released afterwards."""
    _need_tools()
    output = tmp_path / "image.sqfs"
    done = CliRunner().invoke(cli, ["squashfs", f"{proxy.address}/{lazy_image['repository']}:runtime", "-o",
                                    str(output), "--lazy"])
    try:
        assert done.exit_code == 0, done.output
        assert "chunks are fetched as they are read" in done.output
        yield output
    finally:
        released = CliRunner().invoke(cli, ["squashfs-release", str(output)])
        assert released.exit_code == 0, released.output
        assert not output.exists() and not work_folder(output).exists()


@pytest.mark.registry
def test_a_lazily_served_squashfs_mounts_and_reads_its_files(served: Path, lazy_image: dict,
                                                             proxy: FaultProxy) -> None:
    from cluster_runtimes import squashfs_mounted

    assert served.stat().st_size == lazy_image["outcome"].size
    again = CliRunner().invoke(cli, ["squashfs", f"{proxy.address}/{lazy_image['repository']}:runtime", "-o",
                                     str(served), "--lazy"])
    assert again.exit_code == 1 and "is served already" in again.output
    with squashfs_mounted(served) as root:
        assert (root / "data/small.txt").read_text() == "small\n"
        assert hashlib.sha256((root / "data/big.bin").read_bytes()).digest() == hashlib.sha256(BIG).digest()
        assert (root / "etc/environment").read_text() == "PATH=/usr/bin:/bin\n"
    ranges = proxy.asked("GET", "/blobs/" + lazy_image["outcome"].blob)
    assert ranges, "the squashfs's bytes came through the registry"


@pytest.mark.registry
def test_a_corrupted_blob_is_an_eio_and_one_line_never_wrong_bytes(served: Path, proxy: FaultProxy) -> None:
    from cluster_runtimes import squashfs_mounted

    with squashfs_mounted(served) as root:
        assert (root / "data/small.txt").read_text() == "small\n"
        proxy.inject(Fault("GET", r"/blobs/", corrupt=True, times=None))
        with pytest.raises(OSError) as raised:
            (root / "data/big.bin").read_bytes()
        assert raised.value.errno == errno.EIO
    lines = (work_folder(served) / "log").read_text().splitlines()
    assert any(line.startswith("error: chunk ") and "arrived with sha256" in line for line in lines), lines


@pytest.mark.registry
def test_lazy_reads_an_artifact_without_a_chunk_table_whole_and_says_so(lazy_image: dict, upstream: str,
                                                                        tmp_path: Path) -> None:
    _need_tools()
    repository = "imagebuilder-test/lazy-old"
    digest = push_image(upstream, repository, "old", [([E("old.txt", data="old\n")], "gzip")], {"Env": []})
    squashfs = tmp_path / "old.sqfs"
    subprocess.run(["mksquashfs", str(REPO_ROOT / "contrib"), str(squashfs), "-quiet", "-no-progress"], check=True)
    data = squashfs.read_bytes()
    blob = "sha256:" + hashlib.sha256(data).hexdigest()
    push_artifact(lazy_image["registry"], f"{upstream}/{repository}@{digest}", io.BytesIO(data), blob, len(data), {})
    output = tmp_path / "out.sqfs"
    done = CliRunner().invoke(cli, ["squashfs", f"{upstream}/{repository}:old", "-o", str(output), "--lazy"])
    assert done.exit_code == 0, done.output
    assert "published without a chunk table" in done.output and "downloading it whole" in done.output
    assert output.read_bytes() == data and not work_folder(output).exists()


@pytest.mark.registry
def test_the_pyxis_importer_serves_lazily_with_imagebuilder_lazy(lazy_image: dict, upstream: str,
                                                                tmp_path: Path) -> None:
    _need_tools()
    env = {**os.environ, "IMAGEBUILDER_LAZY": "1", "IMAGEBUILDER_SQUASHFS_DIR": str(tmp_path),
           "IMAGEBUILDER": f"{sys.executable} -m imagebuilder", "PYTHONPATH": str(REPO_ROOT),
           "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}
    importer = str(REPO_ROOT / "contrib" / "pyxis-importer")
    got = subprocess.run([importer, "get", f"docker://{upstream}#{lazy_image['repository']}:runtime"], env=env,
                         capture_output=True, text=True, timeout=120)
    path = Path(got.stdout.strip())
    try:
        assert got.returncode == 0, got.stderr
        assert path == tmp_path / "7.0.squashfs" and "chunks are fetched as they are read" in got.stderr
        with open(path, "rb") as f:
            assert f.read(4) == b"hsqs"
        assert subprocess.run(["findmnt", str(path)], capture_output=True).returncode == 0  # nbdfuse's mount
    finally:
        released = subprocess.run([importer, "release"], env=env, capture_output=True, text=True, timeout=120)
    assert released.returncode == 0, released.stderr
    assert not path.exists() and not work_folder(path).exists()
