"""Issue 43: the published squashfs read lazily on a node (`imagebuilder squashfs --lazy`).

The chunk table (pure); publish's second blob; verified range reads through the chunk cache
from a real local registry, and through the fault proxy corrupting the blob; a real
nbdkit + nbdfuse serving the squashfs file, mounted by squashfuse and read, an EIO and one
line where the blob is corrupted after the mount; an artifact without a table read whole;
the pyxis importer with IMAGEBUILDER_LAZY=1. Seconds each: the squashfs is of ~12 MiB.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
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
from imagebuilder.squashfs.fetch import work_folder

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
    """With a venv activated (another python3 first on PATH), as on a login node."""
    _need_tools()
    env = {**os.environ, **_other_python(tmp_path), "IMAGEBUILDER_LAZY": "1", "IMAGEBUILDER_SQUASHFS_DIR": str(tmp_path),
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


# --- round five: what a new user met ------------------------------------------------------------


def _other_python(tmp_path: Path) -> dict[str, str]:
    """PATH with a venv of the test's interpreter first, whose home is a Python of nbdkit's
    version with a standard library that is not nbdkit's (as a pyenv's, a conda's or an HPC
    module's Python is): an activated venv, as a user has one."""
    version = subprocess.run(["nbdkit", "python", "--dump-plugin"], capture_output=True, text=True,
                             check=True).stdout.partition("python_version=")[2].split(".")[:2]
    home = tmp_path / "other-python"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "python3").symlink_to(sys.executable)
    stdlib = home / "lib" / f"python{'.'.join(version)}"
    stdlib.mkdir(parents=True)
    (stdlib / "os.py").write_text("raise ImportError('the standard library of another Python')\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").symlink_to(sys.executable)
    (venv / "pyvenv.cfg").write_text(f"home = {home / 'bin'}\ninclude-system-site-packages = false\n")
    return {"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}


@pytest.mark.registry
def test_lazy_serves_with_another_python_first_on_path(lazy_image: dict, upstream: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _need_tools()
    for name, value in _other_python(tmp_path).items():
        monkeypatch.setenv(name, value)
    output = tmp_path / "image.sqfs"
    done = CliRunner().invoke(cli, ["squashfs", f"{upstream}/{lazy_image['repository']}:runtime", "-o", str(output),
                                    "--lazy"])
    try:
        assert done.exit_code == 0, done.output
        with open(output, "rb") as f:
            assert f.read(4) == b"hsqs"
    finally:
        CliRunner().invoke(cli, ["squashfs-release", str(output)])


@pytest.mark.registry
def test_a_failed_mount_keeps_its_log_and_says_why(lazy_image: dict, proxy: FaultProxy, tmp_path: Path) -> None:
    _need_tools()
    proxy.inject(Fault("GET", "/blobs/" + lazy_image["outcome"].blob, status=404, times=None))
    output = tmp_path / "image.sqfs"
    done = CliRunner().invoke(cli, ["squashfs", f"{proxy.address}/{lazy_image['repository']}:runtime", "-o",
                                    str(output), "--lazy", "--registry-timeout", "5"])
    kept = tmp_path / ".image.sqfs.lazy.log"
    assert done.exit_code == 1, done.output
    assert f"(log: {kept})" in done.output and "server disconnected" not in done.output, done.output
    assert "error: " in kept.read_text(), done.output
    assert not output.exists() and not work_folder(output).exists()


def test_release_leaves_alone_what_lazy_did_not_serve(tmp_path: Path) -> None:
    _need_tools()
    plain = tmp_path / "plain.sqfs"
    plain.write_bytes(b"hsqs mine")
    done = CliRunner().invoke(cli, ["squashfs-release", str(plain)])
    assert done.exit_code == 0 and "nothing to release" in done.output and plain.read_bytes() == b"hsqs mine"
    other = tmp_path / "other-mount"  # another FUSE mount over a file: nbdfuse with nbdkit's memory disk
    other.touch()
    mounter = subprocess.Popen(["nbdfuse", str(other), "--command", "nbdkit", "-s", "memory", "1M"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if subprocess.run(["findmnt", str(other)], capture_output=True).returncode == 0:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        done = CliRunner().invoke(cli, ["squashfs-release", str(other)])
        assert done.exit_code == 0 and "nothing to release" in done.output, done.output
        assert subprocess.run(["findmnt", str(other)], capture_output=True).returncode == 0  # still mounted
    finally:
        subprocess.run(["fusermount3", "-u", str(other)], capture_output=True, check=False)
        mounter.wait(timeout=30)
    for bad in (str(tmp_path), ""):
        done = CliRunner().invoke(cli, ["squashfs-release", bad])
        assert done.exit_code == 2 and isinstance(done.exception, SystemExit), done.output
        assert done.output.count("\n") == 1 and "a folder, not a file" in done.output, done.output


@pytest.mark.registry
def test_release_of_another_user_s_served_file_is_one_line(served: Path) -> None:
    """As a user who may not enter the folder beside FILE: root without the capabilities that
    pass over file permissions, the folder made another user's for the while."""
    if os.getuid() != 0:
        _unavailable("the test makes the folder another user's: it runs as root (as CI does)")
    folder = work_folder(served)
    os.chown(folder, 65534, 65534)
    try:
        done = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner",
                               sys.executable, "-m", "imagebuilder", "squashfs-release", str(served)],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    finally:
        os.chown(folder, 0, 0)
    assert (done.returncode, done.stderr.count("\n")) == (1, 1), done.stderr
    assert f"cannot release {served}: Permission denied" in done.stderr and "Traceback" not in done.stderr
    assert subprocess.run(["findmnt", str(served)], capture_output=True).returncode == 0  # left as it was


def _serve(address: str, repository: str, output: Path, *options: str) -> None:
    done = CliRunner().invoke(cli, ["squashfs", f"{address}/{repository}:runtime", "-o", str(output), "--lazy",
                                    *options])
    assert done.exit_code == 0, done.output


@pytest.mark.registry
def test_lazy_reads_give_up_a_paused_registry_after_registry_timeout(lazy_image: dict, proxy: FaultProxy,
                                                                      tmp_path: Path) -> None:
    from cluster_runtimes import squashfs_mounted

    _need_tools()
    output = tmp_path / "image.sqfs"
    _serve(proxy.address, lazy_image["repository"], output, "--registry-timeout", "1")
    try:
        with squashfs_mounted(output) as root:
            proxy.inject(Fault("GET", "/blobs/" + lazy_image["outcome"].blob, stall_s=60, times=None))
            started = time.monotonic()
            with pytest.raises(OSError):
                (root / "data/big.bin").read_bytes()
            assert time.monotonic() - started < 20  # two tries of 1 s and a backoff, not 2 x 300 s
            log = (work_folder(output) / "log").read_text()
    finally:
        CliRunner().invoke(cli, ["squashfs-release", str(output)])
    assert any(line.startswith("error: ") and "within 1 s (2 tries)" in line for line in log.splitlines()), log


@pytest.mark.registry
def test_lazy_reads_outlive_a_registry_restart(lazy_image: dict, upstream: str, tmp_path: Path) -> None:
    """A refused connection (the registry restarting) is tried again, as a reset is."""
    from cluster_runtimes import squashfs_mounted

    _need_tools()
    output = tmp_path / "image.sqfs"
    first = FaultProxy(upstream).__enter__()
    port = int(first.address.rpartition(":")[2])
    _serve(first.address, lazy_image["repository"], output)
    try:
        with squashfs_mounted(output) as root:
            assert (root / "data/small.txt").read_text() == "small\n"
            first.__exit__(None, None, None)  # down: connections are refused
            restarted: list[FaultProxy] = []
            restart = threading.Timer(2.0, lambda: restarted.append(FaultProxy(upstream, port).__enter__()))
            restart.start()
            assert hashlib.sha256((root / "data/big.bin").read_bytes()).digest() == hashlib.sha256(BIG).digest()
            restart.join()
            log = (work_folder(output) / "log").read_text()
    finally:
        CliRunner().invoke(cli, ["squashfs-release", str(output)])
        for running in restarted:
            running.__exit__(None, None, None)
    assert "Connection refused" in log, log


@contextlib.contextmanager
def _small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `path`: a disk that fills."""
    if os.getuid() != 0:
        _unavailable("a small disk is a tmpfs mounted here: the test runs as root (as CI does)")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.mark.registry
@pytest.mark.parametrize("lazy", [[], ["--lazy"]], ids=["whole", "lazy"])
def test_a_disk_too_small_is_said_in_one_line_before_the_download(lazy_image: dict, upstream: str, tmp_path: Path,
                                                                  lazy: list[str]) -> None:
    _need_tools()
    with _small_disk(tmp_path / "disk", "4m") as disk:
        done = CliRunner().invoke(cli, ["squashfs", f"{upstream}/{lazy_image['repository']}:runtime", "-o",
                                        str(disk / "image.sqfs"), *lazy])
        assert done.exit_code == 1 and done.output.count("\n") == 1, done.output
        assert done.output.startswith(f"error: {disk} has 4.2 MB free, and the squashfs of ") and \
            "is 12.6 MB" in done.output, done.output
        assert list(disk.iterdir()) == []


@pytest.mark.registry
def test_a_lazy_cache_on_a_disk_that_fills_says_so_in_its_log(lazy_image: dict, upstream: str, tmp_path: Path) -> None:
    _need_tools()
    with _small_disk(tmp_path / "disk", "14m") as disk:
        output = disk / "image.sqfs"
        _serve(upstream, lazy_image["repository"], output)
        try:
            with open(disk / "filler", "wb") as filler:
                with pytest.raises(OSError):
                    while True:
                        filler.write(b"\0" * MIB)
                        filler.flush()
            with open(output, "rb") as served, pytest.raises(OSError) as raised:
                os.pread(served.fileno(), 100, 6 * MIB)  # a chunk not cached yet
            assert raised.value.errno == errno.EIO
            log = (work_folder(output) / "log").read_text()
        finally:
            CliRunner().invoke(cli, ["squashfs-release", str(output)])
    assert any(line.startswith("error: cannot write the lazy squashfs's cache ") and "No space left on device" in line
               for line in log.splitlines()), log


@pytest.mark.registry
def test_a_whole_fetch_onto_a_served_file_is_refused_before_the_registry(served: Path, lazy_image: dict,
                                                                          proxy: FaultProxy) -> None:
    proxy.inject()
    done = CliRunner().invoke(cli, ["squashfs", f"{proxy.address}/{lazy_image['repository']}:runtime", "-o",
                                    str(served)])
    assert done.exit_code == 1 and done.output.count("\n") == 1 and "is served already" in done.output, done.output
    assert proxy.seen == [] and subprocess.run(["findmnt", str(served)], capture_output=True).returncode == 0


def test_o_into_a_folder_the_user_cannot_write_is_one_line(tmp_path: Path) -> None:
    if os.getuid() != 0:
        _unavailable("the test runs as root without the capabilities that pass over permissions (as CI is root)")
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)
    for output in (folder / "image.sqfs", folder / "sub" / "image.sqfs"):
        done = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner",
                               sys.executable, "-m", "imagebuilder", "squashfs", "127.0.0.1:9/none:tag", "-o", str(output)],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr and "-o " in done.stderr
    os.chmod(folder, 0o700)
    done = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner",
                           sys.executable, "-m", "imagebuilder", "squashfs", "127.0.0.1:9/none:tag", "-o",
                           str(folder / "image.sqfs")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 2 and done.stderr.startswith(f"error: -o {folder / 'image.sqfs'}: cannot write in "), \
        done.stderr


@pytest.mark.registry
def test_ctrl_c_once_served_leaves_a_served_mount_and_exit_0(lazy_image: dict, upstream: str, tmp_path: Path) -> None:
    """The command said "served at": a Ctrl-C while it exits changes nothing (it was an exit 130
    with the mount left up)."""
    _need_tools()
    output = tmp_path / "image.sqfs"
    command = subprocess.Popen([sys.executable, "-m", "imagebuilder", "squashfs",
                                f"{upstream}/{lazy_image['repository']}:runtime", "-o", str(output), "--lazy"],
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        assert command.stderr is not None
        said = next(line for line in command.stderr if "is served at" in line or line.startswith("error"))
        command.send_signal(signal.SIGINT)  # while it exits (a tenth of a second)
        assert "is served at" in said, said
        assert command.wait(timeout=60) == 0, command.stderr.read()
    finally:
        command.wait(timeout=60)
        mounted = subprocess.run(["findmnt", str(output)], capture_output=True).returncode == 0
        CliRunner().invoke(cli, ["squashfs-release", str(output)])
    assert mounted
