"""Issue 43: an image's root as a squashfs, published beside it and fetched onto a node.

The layer logic on synthetic tars (whiteouts, opaque folders, links, modes); the squashfs of a
synthetic image in a real local registry, mounted by squashfuse; the artifact's round trip
(publish's hook, `imagebuilder squashfs`, the referrers fallback tag, signatures); the pyxis
importer script against that registry. The real torch image's squashfs is test_cluster_runtimes'.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from squashfs_images import E, layer_tar, push_image, push_index, sha256

from support.fakes import CannedLayerRegistry
from support.real_images import REPO_ROOT
from support.registry import throwaway_registry
from support.unavailable import _unavailable
from imagebuilder.cli import cli
from imagebuilder.publish.squashfs import SquashfsPublisher
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.squashfs.artifact import ARTIFACT_TYPE, IMAGE_DIGEST, fallback_tag, find_artifact
from imagebuilder.squashfs.enroot import enroot_files, rc_script
from imagebuilder.squashfs.layers import Applied, UnsafeLayer, apply_layer, entry_path, finish, whiteout
from imagebuilder.trust.signing import KeySigner

IMPORTER = REPO_ROOT / "contrib" / "pyxis-importer"

# --- pure decisions ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "path"), [
    ("./usr/bin/python", "usr/bin/python"), ("/etc/passwd", "etc/passwd"), ("./", ""), (".", ""),
    ("a/./b//c", "a/b/c"), ("a/b/../c", "a/c"),
])
def test_entry_paths_are_relative_to_the_root(name: str, path: str) -> None:
    assert entry_path(name) == path


@pytest.mark.parametrize("name", ["../etc/passwd", "a/../../b", "/.."])
def test_an_entry_that_leaves_the_root_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="leaves the root"):
        entry_path(name)


@pytest.mark.parametrize(("path", "mark"), [
    ("etc/.wh.a", ("remove", "etc/a")), (".wh.gone", ("remove", "gone")), ("opt/.wh..wh..opq", ("opaque", "opt")),
    (".wh..wh..opq", ("opaque", "")), ("etc/a.wh.b", None), ("etc/passwd", None),
])
def test_whiteouts(path: str, mark: tuple[str, str] | None) -> None:
    assert whiteout(path) == mark


CONFIG = {"config": {"Env": ["PATH=/opt/venv/bin:/usr/bin:/bin", "PYTORCH_VERSION=2.6.0"], "User": "1000:1000",
                     "WorkingDir": "/workspace", "Entrypoint": ["/usr/local/bin/entry.sh"], "Cmd": ["python", "-c", "x y"],
                     "Labels": {"org.opencontainers.image.version": "2.6.0"}, "Volumes": {"/data": {}}}}


def test_enroot_s_files_carry_the_image_config() -> None:
    files = enroot_files(CONFIG)
    assert files["etc/environment"] == "PATH=/opt/venv/bin:/usr/bin:/bin\nPYTORCH_VERSION=2.6.0\n"
    assert files["etc/fstab"] == "tmpfs /data tmpfs x-create=dir,rw,nosuid,nodev\n"
    assert files["etc/rc"].startswith("# org.opencontainers.image.version 2.6.0\n\ncd /workspace && unset OLDPWD")
    assert "exec /usr/local/bin/entry.sh \"$@\"\n" in files["etc/rc"]
    assert "exec /usr/local/bin/entry.sh python -c 'x y'\n" in files["etc/rc"]
    assert files["etc/rc.local"].startswith("# This file is sourced by /etc/rc")


@pytest.mark.parametrize(("settings", "args", "expected"), [
    ({"Entrypoint": ["echo", "E"], "Cmd": ["C 1"]}, [], "E C 1"),
    ({"Entrypoint": ["echo", "E"], "Cmd": ["C"]}, ["given", "two"], "E given two"),
    ({"Cmd": ["echo", "only cmd"]}, [], "only cmd"),
    ({"Cmd": ["echo", "only cmd"]}, ["echo", "args win"], "args win"),
])
def test_enroot_s_rc_runs_the_entrypoint_and_command_in_the_working_folder(settings, args, expected,
                                                                        tmp_path: Path) -> None:
    """/etc/rc as enroot's start runs it (`/etc/rc ARGS`), here with bash and no rc.local."""
    script = tmp_path / "rc"
    script.write_text(rc_script({**settings, "WorkingDir": str(tmp_path)}))
    done = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=30, cwd="/")
    assert (done.returncode, done.stdout) == (0, expected + "\n"), done.stderr
    script.write_text(rc_script({"Cmd": settings["Cmd"], "WorkingDir": str(tmp_path)}))
    pwd = subprocess.run(["bash", str(script), "pwd"], capture_output=True, text=True, timeout=30, cwd="/")
    assert pwd.stdout == f"{tmp_path}\n", pwd.stderr


def test_no_entrypoint_and_no_command_start_a_shell() -> None:
    assert "exec /bin/sh\n" in rc_script({})


# --- the layers applied -------------------------------------------------------------------------

BASE = [E("etc", "dir", mode=0o755), E("etc/keep", data="k"), E("etc/gone", data="g"), E("opt", "dir", mode=0o755),
        E("opt/old", data="old"), E("opt/sub", "dir"), E("opt/sub/deep", data="d"), E("var", "dir"),
        E("var/was-file", data="f"), E("var/was-dir", "dir"), E("var/was-dir/x", data="x"),
        E("bin", "dir"), E("bin/tool", data="#!/bin/sh\n", mode=0o4755), E("bin/tool-link", "hard", "bin/tool"),
        E("bin/sh-link", "sym", "tool"), E("private", "dir", mode=0o700), E("private/secret", data="s", mode=0o600),
        E("fifo", "fifo"), E("dev", "dir"), E("dev/null", data="not a device")]
TOP = [E("etc/.wh.gone"), E("opt/new", data="new"), E("opt/.wh..wh..opq"),  # the marker after a sibling
       E("var/was-file", "dir"), E("var/was-file/now", data="n"), E("var/was-dir", data="file now"),
       E("bin/tool", data="replaced"), E("readonly", "dir", mode=0o555), E("readonly/f", data="r")]


def apply(root: Path, *layers: list[E]) -> Applied:
    import io

    applied = Applied()
    for number, entries in enumerate(layers):
        apply_layer(io.BytesIO(layer_tar(entries)), root, applied, f"layer{number}")
    finish(root, applied)
    return applied


def assert_the_layers_applied(root: Path) -> None:
    """What BASE then TOP leave, read through any filesystem (a folder, a squashfuse mount)."""
    assert (root / "etc/keep").read_text() == "k" and not (root / "etc/gone").exists()
    assert sorted(p.name for p in (root / "opt").iterdir()) == ["new"]  # opaque: only this layer's entries
    assert (root / "var/was-file").is_dir() and (root / "var/was-file/now").read_text() == "n"
    assert (root / "var/was-dir").read_text() == "file now"
    # The replaced file is a new file: the hard link keeps the old one, as an overlay mount shows it.
    assert (root / "bin/tool").read_text() == "replaced" and (root / "bin/tool-link").read_text() == "#!/bin/sh\n"
    assert stat.S_IMODE((root / "bin/tool-link").stat().st_mode) == 0o4755
    assert os.readlink(root / "bin/sh-link") == "tool"
    assert stat.S_IMODE((root / "private").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "readonly").stat().st_mode) == 0o555 and (root / "readonly/f").read_text() == "r"
    assert stat.S_ISFIFO((root / "fifo").lstat().st_mode)
    assert (root / "dev").is_dir() and not any((root / "dev").iterdir())  # the runtime mounts its own /dev


def test_layers_apply_in_order_with_whiteouts_opaque_folders_links_and_modes(tmp_path: Path) -> None:
    applied = apply(tmp_path, BASE, TOP)
    assert_the_layers_applied(tmp_path)
    assert (root_link := tmp_path / "bin/tool-link").stat().st_nlink == 1, root_link  # its twin was replaced
    assert applied.files >= 10


def test_a_hard_link_shares_its_file(tmp_path: Path) -> None:
    apply(tmp_path, [E("a", data="same"), E("b", "hard", "a")])
    assert (tmp_path / "a").stat().st_ino == (tmp_path / "b").stat().st_ino


@pytest.mark.parametrize(("layers", "why"), [
    ([[E("etc", "sym", "/tmp")], [E("etc/passwd", data="x")]], "under the symbolic link etc"),
    ([[E("../escape", data="x")]], "leaves the root"),
    ([[E("link", "hard", "../../etc/passwd")]], "leaves the root"),
    ([[E("link", "hard", "missing")]], "which is no file here"),
])
def test_a_layer_that_would_write_outside_the_root_is_refused(layers, why: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(UnsafeLayer, match=why):
        apply(root, *layers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]


# --- a synthetic image in a real registry ------------------------------------------------------

ENV = ["PATH=/usr/bin:/bin", "PYTORCH_VERSION=2.6.0", "HOME=/home/torch"]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A registry with a two-layer image (gzip under zstd), its squashfs published by publish's
    hook; an index tag over it, and a second image without a squashfs."""
    if shutil.which("mksquashfs") is None or shutil.which("zstd") is None:
        _unavailable("these tests need Debian's squashfs-tools and zstd (.ci/setup --tests installs them)")
    with throwaway_registry() as host:
        repository = "imagebuilder-test/squashfs"
        config = {"Env": ENV, "User": "1000:1000", "WorkingDir": "/workspace", "Cmd": ["python3"]}
        digest = push_image(host, repository, "runtime", [(BASE, "gzip"), (TOP, "zstd")], config)
        bare = push_image(host, repository, "bare", [([E("only", data="1")], "none")], {"Env": ENV})
        registry = HttpRegistry(config={})
        found = registry.manifest(f"{host}/{repository}@{digest}")
        assert found is not None
        size = (registry.descriptor(f"{host}/{repository}@{digest}") or {})["size"]
        push_index(host, repository, "multi", digest, size)
        lines: list[str] = []
        publisher = SquashfsPublisher(registry, say=lines.append, workdir=tmp_path_factory.mktemp("work"))
        first = publisher.ensure(f"{host}/{repository}:runtime", "linux/amd64")
        again = publisher.ensure(f"{host}/{repository}:multi", "linux/amd64")
        yield {"host": host, "repository": repository, "digest": digest, "bare": bare, "registry": registry,
               "first": first, "again": again, "lines": lines, "publisher": publisher,
               "image": f"{host}/{repository}"}


@pytest.mark.registry
def test_publish_pushes_the_squashfs_once_per_image_digest(published: dict) -> None:
    first, again, image = published["first"], published["again"], published["image"]
    assert first.created and first.image == f"{image}@{published['digest']}"
    assert first.referrers_tag == f"{image}:{fallback_tag(published['digest'])}"  # registry 2.8: no referrers API
    assert (again.created, again.artifact, again.blob) == (False, first.artifact, first.blob)  # the index's image
    index = published["registry"].manifest(first.referrers_tag)[0]
    (entry,) = index["manifests"]
    assert entry["artifactType"] == ARTIFACT_TYPE and entry["annotations"][IMAGE_DIGEST] == published["digest"]
    manifest = published["registry"].manifest(first.artifact)[0]
    assert manifest["subject"]["digest"] == published["digest"]
    assert manifest["annotations"]["io.imagebuilder.squashfs.compression"] == "zstd:3"
    assert any("mksquashfs -all-root -comp zstd" in line for line in published["lines"])


@pytest.fixture
def mounted(published: dict, tmp_path: Path) -> Iterator[Path]:
    """The published squashfs fetched by the command, mounted by squashfuse."""
    from cluster_runtimes import squashfs_mounted

    if shutil.which("squashfuse") is None:
        _unavailable("squashfuse is missing (.ci/setup --tests installs it)")
    output = tmp_path / "image.sqfs"
    done = CliRunner().invoke(cli, ["squashfs", f"{published['image']}:runtime", "-o", str(output)])
    assert done.exit_code == 0, done.output
    assert sha256(output.read_bytes()) == published["first"].blob
    assert [p.name for p in tmp_path.iterdir()] == ["image.sqfs"]  # no temp file left beside it
    with squashfs_mounted(output) as root:
        yield root


@pytest.mark.registry
def test_the_fetched_squashfs_mounts_with_the_layers_applied_and_enroot_s_files(mounted: Path) -> None:
    assert_the_layers_applied(mounted)
    assert (mounted / "bin/tool").stat().st_uid == 0 and (mounted / "etc").stat().st_gid == 0  # -all-root
    assert (mounted / "etc/environment").read_text() == "".join(f"{item}\n" for item in ENV)
    assert "cd /workspace && unset OLDPWD" in (mounted / "etc/rc").read_text()
    assert "exec python3\n" in (mounted / "etc/rc").read_text()
    assert (mounted / "etc/hosts").read_text() == "" and (mounted / "etc/resolv.conf").exists()


@pytest.mark.registry
def test_fetching_replaces_a_file_atomically_and_takes_a_multi_platform_tag(published: dict, tmp_path: Path) -> None:
    output = tmp_path / "image.sqfs"
    output.write_text("an older squashfs")
    done = CliRunner().invoke(cli, ["squashfs", f"{published['image']}:multi", "-o", str(output)])
    assert done.exit_code == 0, done.output
    assert sha256(output.read_bytes()) == published["first"].blob
    assert f"the squashfs of {published['image']}@{published['digest']}" in done.output
    arm = CliRunner().invoke(cli, ["squashfs", f"{published['image']}:multi", "-o", str(tmp_path / "arm.sqfs"),
                                   "--platform", "linux/arm64"])
    assert arm.exit_code == 1 and "has no linux/arm64 image" in arm.output and not (tmp_path / "arm.sqfs").exists()


@pytest.mark.registry
def test_an_image_without_a_squashfs_says_so_in_one_line(published: dict, tmp_path: Path) -> None:
    done = CliRunner().invoke(cli, ["squashfs", f"{published['image']}:bare", "-o", str(tmp_path / "x.sqfs")])
    assert done.exit_code == 1
    assert done.output.strip().splitlines() == [
        f"error: no squashfs was published for {published['image']}:bare ({published['bare']}); publish it with "
        "`imagebuilder publish --squashfs`, or import the image with enroot"]
    assert list(tmp_path.iterdir()) == []
    missing = CliRunner().invoke(cli, ["squashfs", f"{published['image']}:nope", "-o", str(tmp_path / "x.sqfs")])
    assert missing.exit_code == 2 and "has no image" in missing.output  # as verify's: the request is wrong


@pytest.mark.parametrize(("args", "message"), [
    (["127.0.0.1:1/a/b:tag", "-o", "{tmp}"], "is a folder"),
    (["127.0.0.1:1/a/b:tag", "-o", "{tmp}/no/such/x.sqfs"], "does not exist"),
    (["127.0.0.1:1/A/b:tag", "-o", "{tmp}/x.sqfs"], "A/b"),
    (["127.0.0.1:1/a/b:tag", "-o", "{tmp}/x.sqfs", "--key", "{tmp}/missing.pub"], "missing.pub"),
    (["127.0.0.1:1/a/b:tag", "-o", "{tmp}/x.sqfs", "--platform", "linux"], "linux"),
])
def test_bad_input_is_refused_before_any_registry_is_asked(args: list[str], message: str, tmp_path: Path) -> None:
    """Port 1 answers nothing: a request would fail with exit 1, not 2."""
    done = CliRunner().invoke(cli, ["squashfs", *(a.format(tmp=tmp_path) for a in args)])
    assert done.exit_code == 2, done.output
    assert message in done.output and len(done.output.strip().splitlines()) == 1, done.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key", ["not-a-key", "private"])
def test_a_key_cosign_cannot_read_is_refused_before_any_registry_is_asked(key: str, signing_keys: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """As publish's --sign-key: exit 2 in one line, port 1 (which answers nothing) never asked."""
    path = signing_keys["key"] if key == "private" else tmp_path / "garbage.pub"
    if key == "not-a-key":
        path.write_text("not a key\n")
    done = CliRunner().invoke(cli, ["squashfs", "127.0.0.1:1/a/b:tag", "-o", str(tmp_path / "x.sqfs"),
                                    "--key", str(path)])
    assert done.exit_code == 2 and len(done.output.strip().splitlines()) == 1, done.output
    assert done.output.startswith(f"error: --key {path} is not a public key cosign can read: "), done.output
    assert not (tmp_path / "x.sqfs").exists()


@pytest.mark.registry
def test_a_signed_squashfs_is_checked_before_it_is_downloaded(published: dict, signing_keys: dict[str, Path],
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Signed as publish signs it (--sign-key): --key with its public key passes, another key
    fails with nothing written."""
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    registry, image = published["registry"], published["image"]
    digest = push_image(published["host"], published["repository"], "signed", [(BASE, "gzip")], {"Env": ENV})
    signer = KeySigner(str(signing_keys["key"]))
    signed = SquashfsPublisher(registry, signer, say=lambda line: None).ensure(f"{image}:signed", "linux/amd64")
    assert signed.signed is not None and signed.signed.digest == signed.artifact.partition("@")[2]
    assert find_artifact(registry, f"{image}@{digest}") is not None
    good = CliRunner().invoke(cli, ["squashfs", f"{image}:signed", "-o", str(tmp_path / "ok.sqfs"),
                                    "--key", str(signing_keys["pub"])])
    assert good.exit_code == 0, good.output
    assert "signature verified" in good.output
    bad = CliRunner().invoke(cli, ["squashfs", f"{image}:signed", "-o", str(tmp_path / "bad.sqfs"),
                                   "--key", str(signing_keys["other"])])
    assert bad.exit_code == 1 and not (tmp_path / "bad.sqfs").exists(), bad.output


# --- the pyxis importer ---------------------------------------------------------------------------


def importer(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = f"{sys.executable} -m imagebuilder"
    return subprocess.run([str(IMPORTER), *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "IMAGEBUILDER": command, **env})


@pytest.mark.registry
def test_the_pyxis_importer_gets_and_releases_the_squashfs(published: dict, tmp_path: Path) -> None:
    """As pyxis calls it: `get URI` prints the file's absolute path and nothing else on stdout;
    `release` removes it, twice without failing."""
    env = {"PYXIS_RUNTIME_PATH": str(tmp_path), "SLURM_JOB_UID": "4242", "SLURM_JOB_ID": "17", "SLURM_STEP_ID": "0"}
    uri = f"docker://someone@{published['host']}#{published['repository']}:runtime"
    got = importer("get", uri, env=env, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    path = Path(got.stdout.strip())
    assert got.stdout == f"{tmp_path}/4242/17.0.squashfs\n"
    assert sha256(path.read_bytes()) == published["first"].blob
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for _ in range(2):
        released = importer("release", env=env, cwd=tmp_path)
        assert released.returncode == 0, released.stderr
        assert not path.exists()


@pytest.mark.registry
def test_the_pyxis_importer_without_fallback_fails_where_none_was_published(published: dict, tmp_path: Path) -> None:
    env = {"PYXIS_RUNTIME_PATH": str(tmp_path), "SLURM_JOB_UID": "4242", "SLURM_JOB_ID": "18", "SLURM_STEP_ID": "1",
           "IMAGEBUILDER_FALLBACK": "none"}
    got = importer("get", f"docker://{published['host']}#{published['repository']}:bare", env=env, cwd=tmp_path)
    assert got.returncode == 1 and got.stdout == ""
    assert "no squashfs was published" in got.stderr
    assert list((tmp_path / "4242").iterdir()) == []
    wrong = importer("get", "dockerd://image", env=env, cwd=tmp_path)
    assert wrong.returncode == 1 and "docker:// images only" in wrong.stderr


def test_the_pyxis_importer_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        _unavailable("shellcheck is missing (.ci/setup --tests installs it)")
    done = subprocess.run(["shellcheck", str(IMPORTER)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout


# --- failures leave nothing behind -------------------------------------------------------------


def test_a_corrupt_blob_fails_in_one_line_and_leaves_no_temp_folder(tmp_path: Path) -> None:
    from imagebuilder.squashfs.make import BlobCorrupt, make_squashfs

    registry = CannedLayerRegistry(ENV, arrives=b"not the blob")
    with pytest.raises(BlobCorrupt, match=r"arrived with digest sha256:[0-9a-f]{64}; .* try again"):
        make_squashfs(registry, "127.0.0.1:1/a/b@sha256:" + "0" * 64, tmp_path / "out.sqfs", say=lambda line: None)
    assert list(tmp_path.iterdir()) == []


def test_too_little_disk_is_said_before_any_blob_is_fetched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from imagebuilder.squashfs import make

    registry = CannedLayerRegistry(ENV)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 100))
    with pytest.raises(make.NotEnoughDisk, match=r"has 100 B free, .* needs about"):
        make.make_squashfs(registry, "127.0.0.1:1/a/b@sha256:" + "0" * 64, tmp_path / "out.sqfs",
                           say=lambda line: None)
    assert registry.asked == [] and list(tmp_path.iterdir()) == []


def test_ctrl_c_while_unpacking_removes_the_temp_folder(tmp_path: Path) -> None:
    from imagebuilder.squashfs.make import make_squashfs

    class Interrupted(CannedLayerRegistry):
        def download_blob(self, ref: str, digest: str, out) -> None:
            out.write(self.blob[:10])
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        make_squashfs(Interrupted(ENV), "127.0.0.1:1/a/b@sha256:" + "0" * 64, tmp_path / "out.sqfs", say=lambda line: None)
    assert list(tmp_path.iterdir()) == []


# --- publish's hook --------------------------------------------------------------------------


def test_publish_s_hook_lists_the_squashfs_and_a_failed_one_fails_the_image_it_leaves_pushed() -> None:
    import functools

    from support.canned_engine import CannedEngine
    from support.canned_publish import images, run
    from support.canned_registry import CannedRegistry as Canned

    from imagebuilder.publish.plan import FAILED, PUSHED, plan
    from imagebuilder.publish.report import format_summary
    from imagebuilder.publish.squashfs import SquashfsOutcome, with_squashfs

    class Publisher(SquashfsPublisher):
        def ensure(self, ref: str, platform: str) -> SquashfsOutcome:
            if self.level == 0:
                raise UnsafeLayer(layer="sha256:ab", detail="x lies under the symbolic link y")
            return SquashfsOutcome(ref, ref.replace("@", "@art-"), "sha256:b1", 3_100_000_000, created=True)

    for level, status in ((3, PUSHED), (0, FAILED)):
        engine = CannedEngine()
        hook = functools.partial(with_squashfs, Publisher(HttpRegistry(config={}), level=level))  # never asked
        (outcome,) = run(plan(images(), {}), engine, Canned(engine=engine), squashfs=hook)
        assert outcome.status == status and outcome.pushed, outcome.reason
        if status == PUSHED:
            assert outcome.squashfs is not None and outcome.squashfs["size"] == 3_100_000_000
            assert outcome.to_json()["squashfs"]["image"].endswith("@" + next(iter(outcome.pushed.values())))
            summary = format_summary([outcome])
            assert "squashfs: 3.1 GB pushed" in summary, summary
        else:
            assert "published, but its squashfs failed: layer sha256:ab is unsafe" in outcome.reason


def test_long_work_is_never_silent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line every HEARTBEAT_S (here 0.05 s) while the layers come in, whatever their number."""
    import time

    from imagebuilder.squashfs import make

    class Slow(CannedLayerRegistry):
        def download_blob(self, ref: str, digest: str, out) -> None:
            time.sleep(0.3)
            super().download_blob(ref, digest, out)

    monkeypatch.setattr(make, "HEARTBEAT_S", 0.05)
    lines: list[str] = []
    made = make.make_squashfs(Slow(ENV), "127.0.0.1:1/a/b@sha256:" + "0" * 64, tmp_path / "out.sqfs", say=lines.append)
    assert made.path.stat().st_size > 0
    assert sum("127.0.0.1:1/a/b: layer 1/1" in line and "unpacked so far" in line for line in lines) >= 3, lines


H = "a" * 64


@pytest.mark.parametrize(("uri", "reference"), [
    ("docker://ubuntu:22.04", "ubuntu:22.04"),
    (f"docker://ubuntu@sha256:{H}", f"ubuntu@sha256:{H}"),
    (f"docker://alice@ubuntu@sha256:{H}", f"ubuntu@sha256:{H}"),
    ("docker://alice@ubuntu:22.04", "ubuntu:22.04"),
    (f"docker://alice@ghcr.io#acme/torch@sha256:{H}", f"ghcr.io/acme/torch@sha256:{H}"),
    (f"docker://127.0.0.1:5000#ml/torch:2.6@sha256:{H}", f"127.0.0.1:5000/ml/torch:2.6@sha256:{H}"),
])
def test_the_pyxis_importer_reads_enroot_s_uris(uri: str, reference: str) -> None:
    """The importer's own `reference` function (taken out of the script), as enroot's URIs come."""
    function = subprocess.run(["sed", "-n", "/^reference() {/,/^}/p", str(IMPORTER)], capture_output=True, text=True,
                              check=True).stdout
    done = subprocess.run(["bash", "-c", f'{function}\nreference "$1"', "bash", uri], capture_output=True, text=True,
                          timeout=30)
    assert (done.returncode, done.stdout) == (0, reference + "\n"), done.stderr


@pytest.mark.registry
@pytest.mark.parametrize("how", ["estargz", "zstd:chunked"])
def test_the_squashfs_of_a_lazy_format_image_leaves_out_its_toc_and_landmarks(published: dict, how: str,
                                                                               tmp_path: Path) -> None:
    from imagebuilder.squashfs.make import make_squashfs

    host, repository = published["host"], "imagebuilder-test/squashfs-" + how.replace(":", "-")
    digest = push_image(host, repository, "lazy", [([E("app", "dir"), E("app/main.py", data="print(1)\n")], how)],
                        {"Env": ENV})
    output = tmp_path / "image.sqfs"
    make_squashfs(published["registry"], f"{host}/{repository}@{digest}", output, say=lambda line: None)
    listed = subprocess.run(["unsquashfs", "-l", "-d", "", str(output)], capture_output=True, text=True,
                            check=True).stdout.split()
    assert "/app/main.py" in listed
    assert not {"/.prefetch.landmark", "/.no.prefetch.landmark", "/stargz.index.json"} & set(listed), listed
