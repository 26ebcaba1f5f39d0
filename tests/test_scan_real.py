"""`scan` on real images through the real engine: an image made here (docker import of an
os-release and a dpkg status) against a mirror made in the test; and the suite's debootstrap base
(bookworm main, no security suite) against the real Debian security mirror, scanned once."""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.apt_repo import AptRepo, changelog_text, debian_release, dpkg_status, served

from imagebuilder.cli import cli
from imagebuilder.scan.debian import DebVersion

# Containers of the base image and classic builds of tiny images on it, no BuildKit and no
# torch image of the session's: CI runs these beside the builds (.ci/run, beside_builds).
pytestmark = pytest.mark.beside_builds

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


class _HangingDebs(http.server.SimpleHTTPRequestHandler):
    """Serves the mirror, but a .deb only once `release` is set: a download that never ends."""

    release = threading.Event()

    def do_GET(self) -> None:
        if self.path.endswith(".deb"):
            self.release.wait(60)
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.docker
def test_ctrl_c_while_a_deb_downloads_ends_the_scan_at_once(docker_engine, image_repo, tmp_path):
    apt = AptRepo(tmp_path)
    apt.add("libfoo1", "1.0-1+deb12u1", source="foo", changelog=changelog_text("foo", [("1.0-1+deb12u1", "CVE-2026-1111")]))
    apt.publish("bookworm-security")
    ref = f"{image_repo}:debian"
    _import(docker_engine, ref, {"/etc/os-release": debian_release().encode(),
                                 "/var/lib/dpkg/status": dpkg_status([("libfoo1", "1.0-1", "foo", "amd64")]).encode()}, {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_HangingDebs, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    root = Path(__file__).resolve().parent.parent
    process = subprocess.Popen([sys.executable, "-m", "imagebuilder", "scan", ref, "--mirror",
                                f"http://127.0.0.1:{server.server_address[1]}"], cwd=tmp_path, text=True,
                               env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:  # up to the download that hangs
            lines.append(line)
            if "reading the changelogs" in line:
                break
        assert lines and "reading the changelogs" in lines[-1], lines
        started = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)  # as a terminal sends it
        rest = process.communicate(timeout=20)[1]
        assert process.returncode == 130 and "interrupted" in rest and "Traceback" not in rest, rest
        assert time.monotonic() - started < 5  # not after the download's 60 s
        assert _containers_of(docker_engine, ref) == []
    finally:
        _HangingDebs.release.set()
        if process.poll() is None:
            process.kill()
            process.wait()
        server.shutdown()
        server.server_close()


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
