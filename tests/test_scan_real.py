"""`scan` on real images through the real engine: an image made here (docker import of an
os-release and a dpkg status) against a mirror made in the test; and the suite's debootstrap base
(bookworm main, no security suite) against the real Debian security mirror, scanned once."""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from support.apt_repo import AptRepo, changelog_text, debian_release, dpkg_status, served

from imagebuilder.cli import cli
from imagebuilder.scan.debian import DebVersion

CVE = re.compile(r"CVE-\d{4}-\d{4,}")


def _scan(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["scan", *args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout, result.stderr


def _containers_of(docker_engine: Any, image: str) -> list[str]:
    return [c["Id"] for c in docker_engine.client.api.containers(all=True, filters={"ancestor": image})]


def _import(docker_engine: Any, ref: str, files: dict[str, bytes], links: dict[str, str]) -> None:
    """An image of just these files and symbolic links (docker import: no registry, no build)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for path, target in links.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    repository, _, tag = ref.rpartition(":")
    docker_engine.client.api.import_image_from_data(buffer.getvalue(), repository=repository, tag=tag)


@pytest.mark.docker
def test_the_engine_reads_an_images_packages_and_leaves_no_container(docker_engine, image_repo, tmp_path):
    apt = AptRepo(tmp_path)
    apt.add("libfoo1", "1.0-1+deb12u1", source="foo", changelog=changelog_text("foo", [
        ("1.0-1+deb12u1", "Fix CVE-2026-1111."), ("1.0-1", "CVE-2020-0001")]))
    apt.publish("bookworm-security")
    ref = f"{image_repo}:debian"
    # /etc/os-release a link, as Debian ships it: the engine follows it.
    _import(docker_engine, ref, {"/usr/lib/os-release": debian_release().encode(),
                                 "/var/lib/dpkg/status": dpkg_status([("libfoo1", "1.0-1", "foo", "amd64")]).encode()},
            {"/etc/os-release": "../usr/lib/os-release"})
    with served(tmp_path) as url:
        code, out, err = _scan(ref, "--mirror", url, "--json")
    assert code == 1, err
    report = json.loads(out)
    assert report["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert [(f["package"], f["fixed"], f["vulnerabilities"]) for f in report["findings"]] == [
        ("foo", "1.0-1+deb12u1", [{"ids": ["CVE-2026-1111"], "status": "open"}])]
    assert _containers_of(docker_engine, ref) == []  # each read's container is removed
    code, _, err = _scan(f"{image_repo}:absent", "--mirror", "http://127.0.0.1:9")
    assert code == 2 and err.splitlines()[-1].startswith(f"error: {image_repo}:absent: cannot scan: image ")


@pytest.fixture(scope="module")
def real_scan(base_image: str) -> Iterator[tuple[int, dict[str, Any], str]]:
    """The debootstrap base against deb.debian.org's bookworm-security, once for the module."""
    code, out, err = _scan(base_image, "--json")
    yield code, (json.loads(out) if out else {}), err


@pytest.mark.docker
@pytest.mark.network
def test_the_debootstrap_base_has_real_fixes_with_real_cve_ids(real_scan):
    code, report, err = real_scan
    assert code == 1, err[-2000:]
    assert report["vulnerable"] and "bookworm-security/main (amd64) at http://deb.debian.org/debian-security" in \
        report["sources"][0]
    findings = report["findings"]
    with_cves = {f["package"]: [i for v in f["vulnerabilities"] for i in v["ids"]] for f in findings
                 if any(CVE.fullmatch(i) for v in f["vulnerabilities"] for i in v["ids"])}
    assert with_cves, findings  # bookworm main's minbase always trails its security suite (pam, perl, zlib, ... 2026-12)
    for f in findings:
        assert DebVersion.parse(f["installed"]) < DebVersion.parse(f["fixed"]) and f["binaries"], f
    assert err.splitlines()[-1].startswith(f"error: {report['image']}: {len(findings)} finding(s) not allowlisted: ")


@pytest.mark.docker
@pytest.mark.network
def test_allowlisting_every_id_of_the_real_findings_leaves_only_those_without_ids(real_scan, base_image, tmp_path):
    """The same scan with each id it found allowlisted: what stays is a fix that names no id (tzdata's
    new rules, say), which no entry can accept."""
    _, report, _ = real_scan
    ids = sorted({v["ids"][0] for f in report["findings"] for v in f["vulnerabilities"]})
    allow = tmp_path / "allow.yaml"
    allow.write_text("".join(f"- id: {i}\n  reason: test\n  expires: 2099-01-01\n" for i in ids))
    code, out, _ = _scan(base_image, "--json", "--allowlist", str(allow))
    again = json.loads(out)
    left = [f["package"] for f in again["findings"] if f["status"] != "allowlisted"]
    assert left == [f["package"] for f in report["findings"] if not f["vulnerabilities"]]
    assert code == (1 if left else 0)
