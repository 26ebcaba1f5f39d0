"""`scan` against package mirrors made in the test (dpkg-deb's .debs, a Packages index, http.server):
a finding and the ids its changelog names, a fix that appears overnight, Ubuntu, the exit codes
through the CLI, and what a broken mirror says. No network, no engine: the image's files are data
(tests/test_scan_real.py reads real images)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import date

import pytest
from click.testing import CliRunner
from support.apt_repo import UBUNTU_24, AptRepo, ImageFiles, changelog_text, debian_image, debian_release, served

from imagebuilder.cli import cli
from imagebuilder.scan.allowlist import parse_allowlist
from imagebuilder.scan.mirror import HttpMirror, MirrorError
from imagebuilder.scan.release import NotDebian
from imagebuilder.scan.report import ScanReport
from imagebuilder.scan.run import CannotScan, ScanRequest, scan_image

FOO_FIX = "1.0-1+deb12u1"
FOO_LOG = changelog_text("foo", [
    (FOO_FIX, "Fix CVE-2026-1111 (heap overflow) and CVE-2026-22222; see GHSA-23cf-ghjm-pqrv."),
    ("1.0-1", "New upstream release; fixes CVE-2020-0001."),  # the installed version's own: not a finding
])
IMAGE = "example/app:1"
INSTALLED = [("libfoo1", "1.0-1", "foo", "amd64"), ("bar", "2.0-1", "", "amd64"), ("tool", "3.1", "", "amd64"),
             ("base-files", "12.4", "", "amd64"), ("tzdata", "2026a-0+deb12u1", "", "all")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AptRepo, str]]:
    """Every .deb the tests' suites list, built once; each test publishes the suite it needs."""
    apt = AptRepo(tmp_path_factory.mktemp("mirror"))
    apt.add("foo-doc", FOO_FIX, source="foo", arch="all")  # the smallest, and its doc folder is foo's: no changelog
    apt.add("libfoo1", FOO_FIX, source="foo", changelog=FOO_LOG, padding=300)
    apt.add("bar", "2.0-1", changelog=changelog_text("bar", [("2.0-1", "CVE-2026-9999")]))  # what the image has
    apt.add("tool", "3.2", native=True, changelog=changelog_text("tool", [  # native: changelog.gz, like apt's
        ("3.2", "Fix CVE-2026-3333."), ("3.1", "Fix CVE-2025-0001.")]))
    apt.add("tzdata", "2026f-0+deb12u1", arch="all", changelog=changelog_text("tzdata", [
        ("2026f-0+deb12u1", "New upstream release: new time zone rules.")]))
    apt.add("libubu1", "1.0-1ubuntu1.1", source="ubu", compression="zstd", changelog=changelog_text("ubu", [
        ("1.0-1ubuntu1.1", "SECURITY UPDATE: CVE-2026-4444"), ("1.0-1ubuntu1", "Merge from Debian.")],
        dist="noble-security"))
    apt.add("libfoo1", FOO_FIX, source="foo", arch="arm64", changelog=FOO_LOG)
    with served(apt.root) as url:
        yield apt, url


def _scan(url: str, files: ImageFiles, **request: object) -> tuple[ScanReport, list[str]]:
    said: list[str] = []
    report = scan_image(ScanRequest(files.image, mirror=url, **request), files, HttpMirror(said.append).get,  # type: ignore[arg-type]
                        said.append)
    return report, said


def _debian(codename: str, installed: list[tuple[str, str, str, str]] = INSTALLED) -> ImageFiles:
    return debian_image(IMAGE, debian_release(codename), installed)


def test_a_fix_in_the_security_suite_is_a_finding_with_the_ids_its_changelog_names(repo):
    apt, url = repo
    apt.publish("bookworm-security", [d for d in apt.debs if d.arch in ("amd64", "all")])
    report, said = _scan(url, _debian("bookworm"))
    by_package = {f.package: f for f in report.findings}
    assert sorted(by_package) == ["foo", "tool", "tzdata"]  # bar is at the suite's version
    foo = by_package["foo"]
    assert (foo.installed, foo.fixed, foo.binaries) == ("1.0-1", FOO_FIX, ("libfoo1",))
    # The entries after 1.0-1 up to the fix; foo-doc (tried first, the smallest) has no changelog.
    assert [v.ids for v in foo.vulnerabilities] == [("CVE-2026-1111",), ("CVE-2026-22222",), ("GHSA-23cf-ghjm-pqrv",)]
    assert [v.ids for v in by_package["tool"].vulnerabilities] == [("CVE-2026-3333",)]
    assert by_package["tzdata"].vulnerabilities == () and "names no CVE" in by_package["tzdata"].note
    assert len(report.failing()) == 3
    assert any("bookworm-security/main amd64" in line for line in said), said
    text = report.format()
    assert "CVE-2026-1111, CVE-2026-22222, GHSA-23cf-ghjm-pqrv" in text and "CVE-2020-0001" not in text
    assert "3 finding(s): 3 not allowlisted" in text


def test_a_fix_that_appears_overnight_turns_a_clean_scan_into_a_finding(repo):
    apt, url = repo
    today = [d for d in apt.debs if d.package == "bar"]
    apt.publish("overnight-security", today)
    report, _ = _scan(url, _debian("overnight"))
    assert report.findings == () and not report.to_json()["vulnerable"]
    report.raise_if_vulnerable()  # exit 0
    apt.publish("overnight-security", today + [d for d in apt.debs if d.package == "libfoo1" and d.arch == "amd64"])
    report, _ = _scan(url, _debian("overnight"))
    assert [(f.package, f.fixed) for f in report.findings] == [("foo", FOO_FIX)]
    assert report.to_json()["vulnerable"]


def test_ubuntu_reads_its_own_suite_and_zstd_debs(repo):
    apt, url = repo
    apt.publish("noble-security", [d for d in apt.debs if d.package == "libubu1"])
    files = debian_image(IMAGE, UBUNTU_24, [("libubu1", "1.0-1ubuntu1", "ubu", "amd64"), ("bar", "2.0-1", "", "amd64")])
    report, said = _scan(url, files)
    assert report.os == "Ubuntu 24.04.3 LTS"
    assert any("noble-security/main amd64" in line for line in said), said
    assert [(f.package, f.installed, f.fixed, [v.ids for v in f.vulnerabilities]) for f in report.findings] == [
        ("ubu", "1.0-1ubuntu1", "1.0-1ubuntu1.1", [("CVE-2026-4444",)])]


def test_the_images_architecture_picks_the_index(repo):
    apt, url = repo
    apt.publish("armsuite-security", arch="arm64")
    report, said = _scan(url, _debian("armsuite", [("libfoo1", "1.0-1", "foo", "arm64")]))
    assert any("armsuite-security/main arm64" in line for line in said)
    assert [f.package for f in report.findings] == ["foo"]


def test_allowlisted_ids_clear_a_finding_and_an_expired_entry_does_not(repo):
    apt, url = repo
    apt.publish("allow-security", [d for d in apt.debs if d.package == "libfoo1" and d.arch == "amd64"])
    entries = "".join(f"- id: {cve}\n  reason: not reachable in this image\n  expires: {day}\n"
                      for cve, day in (("CVE-2026-1111", "2099-01-01"), ("CVE-2026-22222", "2099-01-01"),
                                       ("GHSA-23cf-ghjm-pqrv", "2026-12-06")))
    files = _debian("allow", [("libfoo1", "1.0-1", "foo", "amd64")])
    report, _ = _scan(url, files, allowlist=parse_allowlist(entries, "allow.yaml"), today=date(2026, 12, 6))
    assert report.failing() == []  # expires is the last day it holds
    report.raise_if_vulnerable()
    assert "0 not allowlisted, 1 allowlisted" in report.format()
    report, _ = _scan(url, files, allowlist=parse_allowlist(entries, "allow.yaml"), today=date(2026, 12, 7))
    assert [f.status(report.allowlist, report.today) for f in report.findings] == ["expired"]
    assert "GHSA-23cf-ghjm-pqrv [expired]" in report.format()
    with pytest.raises(Exception, match=r"foo 1\.0-1\+deb12u1 \(expired\)"):
        report.raise_if_vulnerable()
    partial = parse_allowlist(entries.split("- id: CVE-2026-22222")[0], "allow.yaml")  # one id of three
    report, _ = _scan(url, files, allowlist=partial, today=date(2026, 12, 6))
    assert [f.status(report.allowlist, report.today) for f in report.findings] == ["open"]


def test_a_deb_that_is_not_the_indexs_is_refused_in_one_line(repo, tmp_path):
    apt, _ = repo
    tampered = AptRepo(tmp_path)
    (tmp_path / "pool").symlink_to(apt.root / "pool")
    deb = next(d for d in apt.debs if d.package == "libfoo1" and d.arch == "amd64")
    tampered.debs = [type(deb)(**{**deb.__dict__, "sha256": "0" * 64})]
    tampered.publish("bookworm-security")
    with served(tmp_path) as url, pytest.raises(MirrorError, match=r"libfoo1_1\.0-1\+deb12u1_amd64\.deb: its sha256 is not"):
        _scan(url, _debian("bookworm", [("libfoo1", "1.0-1", "foo", "amd64")]))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("files", "error", "line"), [
    (ImageFiles(IMAGE, {}), NotDebian, "it has no /etc/os-release"),
    (ImageFiles(IMAGE, {"/etc/os-release": b"ID=alpine\nPRETTY_NAME=Alpine Linux v3.20\n"}), NotDebian,
     "its OS is Alpine Linux v3.20"),
    (ImageFiles(IMAGE, {"/etc/os-release": b"ID=debian\nPRETTY_NAME=Debian trixie/sid\n"}), NotDebian,
     "names no VERSION_CODENAME"),
    (ImageFiles(IMAGE, {"/etc/os-release": debian_release().encode()}), CannotScan, "it has no /var/lib/dpkg/status"),
])
def test_an_image_scan_cannot_read_is_refused_in_one_line(files, error, line):
    with pytest.raises(error, match=line) as caught:
        _scan("http://127.0.0.1:9", files)
    assert caught.value.exit_status == 2 and "\n" not in str(caught.value)


def test_a_mirror_that_does_not_answer_or_lacks_the_suite_is_one_line(repo):
    _, url = repo
    files = _debian("bookworm")
    with pytest.raises(MirrorError, match=r"unreachable \(.*refused") as caught:
        _scan(f"http://127.0.0.1:{_closed_port()}", files)
    assert caught.value.exit_status == 2
    with pytest.raises(MirrorError, match=r"no Packages index: does the mirror carry nosuch-security/main\?"):
        _scan(url, _debian("nosuch"))


# --- the command line: exit codes, --json, the allowlist's errors (the engine replaced by the files) ------


@pytest.fixture
def as_engine(monkeypatch: pytest.MonkeyPatch) -> ImageFiles:
    files = _debian("cli", [("libfoo1", "1.0-1", "foo", "amd64"), ("bar", "2.0-1", "", "amd64")])
    monkeypatch.setattr("imagebuilder.engine.docker.DockerEngine", lambda: files)
    return files


def _cli(args: list[str], url: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["scan", IMAGE, *args], env={"IMAGEBUILDER_SECURITY_MIRROR": url})
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout, result.stderr


def test_the_command_exits_1_with_a_finding_0_when_allowlisted_and_1_when_expired(repo, as_engine, tmp_path):
    apt, url = repo
    apt.publish("cli-security", [d for d in apt.debs if d.package in ("libfoo1", "bar") and d.arch == "amd64"])
    code, out, err = _cli([], url)
    assert code == 1 and "foo" in out and "CVE-2026-1111, CVE-2026-22222, GHSA-23cf-ghjm-pqrv" in out, out
    assert err.splitlines()[-1] == f"error: {IMAGE}: 1 finding(s) not allowlisted: foo {FOO_FIX}"
    assert "reading the Packages index of cli-security/main amd64" in err
    allow = tmp_path / "allow.yaml"
    allow.write_text("".join(f"- id: {i}\n  reason: accepted\n  expires: 2099-12-31\n"
                             for i in ("CVE-2026-1111", "CVE-2026-22222", "GHSA-23cf-ghjm-pqrv")))
    code, out, err = _cli(["--allowlist", str(allow)], url)
    assert code == 0 and "0 not allowlisted, 1 allowlisted" in out and "error:" not in err, (out, err)
    allow.write_text(allow.read_text().replace("2099-12-31", "2020-01-01", 1))
    code, out, err = _cli(["--allowlist", str(allow), "--json"], url)
    report = json.loads(out)
    assert code == 1 and report["vulnerable"] and report["findings"][0]["status"] == "expired"
    assert report["findings"][0]["vulnerabilities"][0] == {
        "ids": ["CVE-2026-1111"], "status": "expired",
        "allowlist": {"id": "CVE-2026-1111", "reason": "accepted", "expires": "2020-01-01"}}
    assert err.splitlines()[-1].endswith("(expired)")


def test_the_command_refuses_a_malformed_allowlist_before_reading_the_image(as_engine, tmp_path):
    allow = tmp_path / "allow.yaml"
    allow.write_text("- id: CVE-2026-1\n  reason: r\n  expires: 2099-01-01\n")
    code, out, err = _cli(["--allowlist", str(allow)], "http://127.0.0.1:9")
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"error: {allow}: entry 1 (line 1): id 'CVE-2026-1' is not a CVE id (CVE-YYYY-NNNN) "
                                "or an OSV id (GHSA-..., PYSEC-...)"]
    assert as_engine.read == []


def test_the_command_says_an_unreachable_mirror_in_one_line(as_engine):
    code, out, err = _cli([], f"http://127.0.0.1:{_closed_port()}")
    assert code == 2 and out == ""
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.splitlines()[-1]]
    assert "unreachable" in err and "Traceback" not in err


def test_a_mirror_that_is_not_a_url_is_a_usage_error(as_engine):
    code, _, err = _cli(["--mirror", "deb.debian.org/debian-security"], "")
    assert code == 2 and "is not an http(s):// or file:// URL" in err


def test_osv_records_check_the_python_packages_the_sbom_lists(repo, as_engine, tmp_path):
    apt, url = repo
    apt.publish("cli-security", [d for d in apt.debs if d.package == "bar"])
    as_engine.files["/opt/imagebuilder/sbom.cdx.json"] = json.dumps({"components": [
        {"name": "requests", "version": "2.31.0", "purl": "pkg:pypi/requests@2.31.0"},
        {"name": "libfoo1", "version": "1.0-1", "purl": "pkg:deb/debian/libfoo1@1.0-1"}]}).encode()
    osv = tmp_path / "osv"
    osv.mkdir()
    (osv / "PYSEC-2024-1.json").write_text(json.dumps({
        "id": "GHSA-9wx4-h78v-vm56", "aliases": ["CVE-2024-35195"],
        "affected": [{"package": {"ecosystem": "PyPI", "name": "Requests"},
                      "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "2.32.0"}]}]}]}))
    code, out, err = _cli(["--osv", str(osv), "--json"], url)
    report = json.loads(out)
    assert code == 1, err
    assert [(f["kind"], f["package"], f["installed"], f["fixed"], f["vulnerabilities"][0]["ids"])
            for f in report["findings"]] == [("pypi", "requests", "2.31.0", "2.32.0", ["GHSA-9wx4-h78v-vm56", "CVE-2024-35195"])]
    code, _, err = _cli(["--osv", str(tmp_path / "all.zip")], url)
    assert code == 2 and err.splitlines()[-1].startswith(f"error: {tmp_path / 'all.zip'}: no such file or folder")
