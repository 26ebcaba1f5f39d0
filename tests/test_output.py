"""`-o` at a folder that exists: written into, the folder itself left alone (issue 29, item 1).

A shell standing in it, a mount point, a link to it, a group-shared folder with its own mode
and group, a folder under a parent its user cannot write: each keeps its inode, mode, owner
and group, and the files appear inside it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import certifi
import pytest
from click.testing import CliRunner

from imagebuilder import atomic
from imagebuilder.build import context_folder
from imagebuilder.build.context_folder import OUTPUT_LIST, write_tree
from imagebuilder.cli import cli

SMALL = Path(__file__).parent / "data" / "matrix-small.yaml"
RENDER = ("--matrix", str(SMALL), "render", "--torch", "2.6", "--cuda", "12.4", "--os", "debian12")


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_mode, st.st_uid, st.st_gid


def test_render_into_the_empty_folder_the_shell_stands_in_writes_into_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2770)
    os.chown(shared, os.getuid(), 100 if os.getuid() == 0 else os.getgid())  # a group of its own, where we may
    before = _identity(shared)
    monkeypatch.chdir(shared)
    result = CliRunner().invoke(cli, [*RENDER, "-o", "."])
    assert result.exit_code == 0, result.stderr
    assert _identity(shared) == before, "the folder was replaced or its mode, owner or group changed"
    assert (shared / "Dockerfile").is_file() and (shared / OUTPUT_LIST).is_file()
    assert "Dockerfile" in os.listdir(".")  # what the user's shell sees in its own directory
    entrypoint = shared / "rootfs" / "usr" / "local" / "bin" / "imagebuilder-entrypoint"
    assert os.access(entrypoint, os.X_OK), "a script written in place lost its executable bit"


def test_a_link_to_an_empty_folder_stays_a_link_and_its_folder_gets_the_files(tmp_path: Path) -> None:
    target, link = tmp_path / "target", tmp_path / "link"
    target.mkdir()
    link.symlink_to(target, target_is_directory=True)
    before = _identity(target)
    result = CliRunner().invoke(cli, [*RENDER, "-o", str(link)])
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and _identity(target) == before
    assert (target / "Dockerfile").is_file()


def test_an_empty_folder_under_a_parent_nobody_may_write_is_written_into(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # As root every folder is writable: the parent's refusal is the one a user would get.
    folder = tmp_path / "locked" / "out"
    folder.mkdir(parents=True)
    real_mkdtemp = tempfile.mkdtemp

    def parent_refuses(suffix: str | None = None, prefix: str | None = None, dir: str | Path | None = None) -> str:
        if dir is not None and Path(dir) == folder.parent:
            raise PermissionError(13, "Permission denied", str(dir))
        return real_mkdtemp(suffix, prefix, dir)

    monkeypatch.setattr(tempfile, "mkdtemp", parent_refuses)
    before = _identity(folder)
    write_tree(folder, {"Dockerfile": b"FROM x\n", "sub/run.sh": b"#!/bin/sh\n"})
    assert _identity(folder) == before
    assert (folder / "Dockerfile").read_bytes() == b"FROM x\n" and os.access(folder / "sub" / "run.sh", os.X_OK)


def test_an_interrupted_write_into_an_empty_folder_leaves_it_ours(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    written: list[Path] = []
    real = atomic.write_atomic

    def full_disk_after_two(path: Path, data: bytes | str, mode: int | None = None) -> Path:
        if len(written) == 2:
            raise OSError(28, "No space left on device", str(path))
        written.append(path)
        return real(path, data, mode)

    monkeypatch.setattr(context_folder, "write_atomic", full_disk_after_two)
    with pytest.raises(context_folder.OutputFailed):
        write_tree(folder, {"a": b"1", "b": b"2", "c": b"3"})
    monkeypatch.setattr(context_folder, "write_atomic", real)
    assert context_folder.owned_files(folder) == {"a", "b", "c"}, "the folder is no longer recognisably ours"
    write_tree(folder, {"a": b"1"})  # the next render takes it, and removes what it no longer writes
    assert sorted(p.name for p in folder.iterdir()) == [OUTPUT_LIST, "a"]


def test_render_all_says_which_contexts_of_an_earlier_render_it_removed(tmp_path: Path) -> None:
    out = tmp_path / "all"
    runner = CliRunner()
    everything = runner.invoke(cli, ["--matrix", str(SMALL), "render", "--all", "--torch", "2.6", "--os", "debian12",
                                     "-o", str(out)])
    assert everything.exit_code == 0, everything.stderr
    assert "removed" not in everything.stdout
    folders = {p.name for p in out.iterdir() if p.is_dir()}
    fewer = runner.invoke(cli, ["--matrix", str(SMALL), "render", "--all", "--torch", "2.6", "--os", "debian12",
                                "--variant", "runtime", "-o", str(out)])
    assert fewer.exit_code == 0, fewer.stderr
    kept = {p.name for p in out.iterdir() if p.is_dir()}
    assert kept < folders
    assert f"removed the build contexts of {len(folders - kept)} images an earlier render wrote there" in fewer.stdout


@pytest.mark.parametrize(("extra", "secret"), [
    ((), ""),
    (("--builder", "buildkit", "--index-url", "https://alice:s3cr3t@mirror.example.com/simple"),
     " --secret id=index-netrc,src=$HOME/.netrc"),
    (("--builder", "buildkit", "--ca-bundle", "{ca}"), " --build-context imagebuilder-ca='{out}/imagebuilder-ca'"),
])
def test_render_o_says_how_to_build_what_it_wrote(tmp_path: Path, extra: tuple[str, ...], secret: str) -> None:
    out = tmp_path / "my ctx"
    ca = tmp_path / "ca.pem"
    ca.write_bytes(Path(certifi.where()).read_bytes())
    result = CliRunner().invoke(cli, [*RENDER, *(a.format(ca=ca) for a in extra), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    ref = "pytorch:2.6.0-cuda12.4-cudnn9-debian12-runtime"
    assert result.stdout.splitlines()[-1] == f"build it: docker build -t {ref}{secret.format(out=out)} '{out}'"
    if "--ca-bundle" in extra:  # the named context it names is there, holding the bundle
        assert (out / "imagebuilder-ca" / "ca.pem").read_bytes() == ca.read_bytes()
    assert "s3cr3t" not in result.stdout


def test_a_refused_output_folder_is_the_only_thing_said(tmp_path: Path) -> None:
    """Refused before anything is rendered: no notes about the image it will not write."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "Dockerfile").write_text("FROM mine\n")
    result = CliRunner().invoke(cli, [*RENDER, "-o", str(folder)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {folder} is not empty and was not written by imagebuilder "
                                          f"(no {OUTPUT_LIST}); give -o a new or empty folder: nothing was written"]
    assert (folder / "Dockerfile").read_text() == "FROM mine\n" and len(list(folder.iterdir())) == 1
