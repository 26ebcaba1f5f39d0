"""The main suite's dependency graph kept on disk (imagebuilder/scan/graph_cache.py): a second
command reads the suite's Release and the kept graph, not the 9 MB index; a new point release
(another SHA256 in the Release) is read anew and replaces the old graph; an index that is not the
one the Release names is refused; a folder that cannot be written costs only the time. Over a
mirror made in the test: no network, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.apt_repo import AptRepo, debian_image, debian_release, served

from imagebuilder.scan.fixes import dependency_graph
from imagebuilder.scan.graph_cache import MainGraphs, cache_folder
from imagebuilder.scan.mirror import HttpMirror, MirrorError, index_text
from imagebuilder.scan.release import Suite
from imagebuilder.scan.updates import OsStates

BASE = "base:bookworm"
MAIN_INDEX = "/dists/bookworm/main/binary-amd64/Packages.xz"


def _repo(root: Path) -> AptRepo:
    repo = AptRepo(root)
    repo.publish("bookworm", [repo.add("python3", "3.11.2-1+b1", depends="libpython3-stdlib"),
                              repo.add("libpython3-stdlib", "3.11.2-1+b1", depends="libssl3 | libssl1.1"),
                              repo.add("libssl3", "3.0.11-1~deb12u2", source="openssl",
                                       depends="libc6 (>= 2.34)")], release=True)
    repo.publish("bookworm-security", [repo.add("libssl3", "3.0.15-1~deb12u1", source="openssl",
                                                depends="libc6 (>= 2.36), libzstd1")])
    return repo


def _state(url: str, folder: Path, fetched: list[str]):
    base = debian_image(BASE, debian_release(), [("libssl3", "3.0.11-1~deb12u2", "openssl", "amd64")])
    mirror = HttpMirror(print)

    def get(address: str) -> bytes:
        fetched.append(address.removeprefix(url))
        return mirror.get(address)

    return OsStates(base, get, url, print, MainGraphs(get, folder))(BASE, "amd64")


def _one_pass(url: str):
    get = HttpMirror(print).get
    return dependency_graph((index_text(get, Suite(url, "bookworm", "main", "amd64")),
                             index_text(get, Suite(url, "bookworm-security", "main", "amd64"))), "amd64")


def test_a_second_command_reads_the_kept_graph_not_the_index(tmp_path: Path) -> None:
    _repo(tmp_path / "mirror")
    with served(tmp_path / "mirror") as url:
        first: list[str] = []
        state = _state(url, tmp_path / "cache", first)
        again: list[str] = []
        kept = _state(url, tmp_path / "cache", again)
        expected = _one_pass(url)
    assert MAIN_INDEX in first and MAIN_INDEX not in again, (first, again)
    assert "/dists/bookworm/Release" in again  # what says the kept graph is the index's
    assert state.graph == kept.graph == expected
    # The security suite's own dependencies are in it: it is read anew every time.
    assert state.graph.depends["libssl3"] == {"libc6", "libzstd1"}
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [
        f"bookworm-amd64-v1-{_release_sha(tmp_path / 'mirror')}.json"]


def _release_sha(root: Path) -> str:
    line = next(line for line in (root / "dists/bookworm/Release").read_text().splitlines()
                if line.endswith("Packages.xz"))
    return line.split()[0]


def test_a_new_point_release_is_read_anew_and_replaces_the_kept_graph(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "mirror")
    with served(tmp_path / "mirror") as url:
        _state(url, tmp_path / "cache", [])
        old = _release_sha(tmp_path / "mirror")
        repo.publish("bookworm", [*repo.debs, repo.add("libzstd1", "1.5.4-2", source="libzstd",
                                                       depends="libc6 (>= 2.14)")], release=True)
        fetched: list[str] = []
        state = _state(url, tmp_path / "cache", fetched)
    assert MAIN_INDEX in fetched and state.graph.depends["libzstd1"] == {"libc6"}
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [
        f"bookworm-amd64-v1-{_release_sha(tmp_path / 'mirror')}.json"] != [f"bookworm-amd64-v1-{old}.json"]


def test_an_index_that_is_not_the_one_the_release_names_is_refused(tmp_path: Path) -> None:
    _repo(tmp_path / "mirror")
    release = tmp_path / "mirror/dists/bookworm/Release"
    release.write_text(release.read_text().replace(_release_sha(tmp_path / "mirror"), "ab" * 32))
    with served(tmp_path / "mirror") as url, pytest.raises(MirrorError) as refused:
        _state(url, tmp_path / "cache", [])
    assert str(refused.value).startswith(f"{url}{MAIN_INDEX}: its sha256 is not the one the suite's Release names")
    assert "\n" not in str(refused.value) and not (tmp_path / "cache").exists()


def test_a_folder_that_cannot_be_written_costs_only_the_time(tmp_path: Path) -> None:
    _repo(tmp_path / "mirror")
    (tmp_path / "not-a-folder").write_text("a file where the cache folder would be")
    with served(tmp_path / "mirror") as url:
        fetched: list[str] = []
        state = _state(url, tmp_path / "not-a-folder" / "graphs", fetched)
        expected = _one_pass(url)
    assert state.graph == expected and MAIN_INDEX in fetched


def test_a_mirror_without_a_release_is_read_every_time(tmp_path: Path) -> None:
    _repo(tmp_path / "mirror")
    (tmp_path / "mirror/dists/bookworm/Release").unlink()
    with served(tmp_path / "mirror") as url:
        for _ in range(2):
            fetched: list[str] = []
            _state(url, tmp_path / "cache", fetched)
            assert MAIN_INDEX in fetched
    assert not (tmp_path / "cache").exists()


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IMAGEBUILDER_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "mine"
    monkeypatch.delenv("IMAGEBUILDER_CACHE_DIR")
    assert cache_folder() == tmp_path / "xdg" / "imagebuilder"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder() == tmp_path / "home" / ".cache" / "imagebuilder"
