"""`lock` and `matrix add` on a file system that refuses the write (issue 45, part 5): one line,
exit 1, success claimed only after the write, no empty folder left.

The fault is raised at the OS boundary (the temporary file atomic.py makes beside the target, as a
read-only or full file system refuses it): the suite runs as root, for whom a read-only folder is
writable, and a read-only bind or a full tmpfs needs privileges it must not ask for."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.version import Version

from imagebuilder.cli import cli
from imagebuilder.lock.lockfile import Lock, LocksUnwritable, write_locks

SMALL = Path(__file__).parent / "data" / "matrix-small.yaml"


def _refuse(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def mkstemp(prefix: str = "", suffix: str = "", dir: str | Path | None = None) -> tuple[int, str]:
        raise OSError(code, os.strerror(code), str(Path(dir or ".") / f"{prefix}x{suffix}"))
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_locks_that_cannot_be_written_leave_no_empty_folder_and_say_so(tmp_path, monkeypatch, code) -> None:
    _refuse(monkeypatch, code)
    directory = tmp_path / "locks"
    lock = Lock("x", ("torch==2.6.0",), "x86_64-manylinux_2_28", "3.11", ())
    with pytest.raises(LocksUnwritable) as raised:
        write_locks(directory, [lock], {})
    message = str(raised.value)
    assert raised.value.exit_code == 1 and "\n" not in message
    assert message.startswith(f"could not write the locks into {directory} (") and "nothing was written" in message
    assert ("Read-only file system" if code == errno.EROFS else "No space left on device") in message
    assert list(tmp_path.iterdir()) == []  # no empty locks/


def test_a_locks_folder_that_was_there_stays(tmp_path, monkeypatch) -> None:
    directory = tmp_path / "locks"
    directory.mkdir()
    _refuse(monkeypatch, errno.EROFS)
    with pytest.raises(LocksUnwritable):
        write_locks(directory, [Lock("x", (), "", "", ())], {})
    assert directory.is_dir()


def test_the_progress_line_claims_a_resolution_not_a_lock() -> None:
    """`lock` printed "locked, 29 packages" and then failed to write; `wrote PATH` is the claim."""
    from imagebuilder.lock.command import outcome_line

    line = outcome_line("x", Lock("x", (), "", "", ()))
    assert line == "x: resolved, 0 packages"


def test_matrix_add_on_a_full_file_system_is_one_line_and_leaves_the_matrix(tmp_path, monkeypatch) -> None:
    from imagebuilder.lock import matrix_add
    from imagebuilder.lock.matrix_add import NewRelease, Variant

    variant = Variant("cu128", Version("12.8.90"), Version("9.10.2.21"), Version("2.27.5"),
                      "https://download.pytorch.org/whl/cu128", "test: Requires-Dist")
    new = NewRelease(Version("2.9.1"), Version("0.24.1"), Version("2.8.0"), Version("3.5.1"),
                     (Version("3.10"), Version("3.11")), ("linux/amd64",), variant, (), "test source", ())
    monkeypatch.setattr(matrix_add, "read_release", lambda index, version, cuda_variants=(): new)
    path = tmp_path / "m.yaml"
    path.write_text(SMALL.read_text())
    _refuse(monkeypatch, errno.ENOSPC)
    result = CliRunner().invoke(cli, ["--matrix", str(path), "matrix", "add", "--torch", "2.9.1",
                                      "--index-url", "http://127.0.0.1:9/simple/"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines == [f"error: could not write torch {Version('2.9.1')} into {path} (No space left on device: "
                     f"{tmp_path}/.m.yaml.x.tmp); it is unchanged: make it writable or make room, and add again"], lines
    assert "added" not in result.output and path.read_text() == SMALL.read_text()
    assert list(tmp_path.iterdir()) == [path]
