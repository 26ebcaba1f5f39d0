"""publish --scan: each image scanned after its smoke tests and before its push, over the publish
runner's canned engine and registry (support.canned_engine, canned_registry) and a mirror made in the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from support.apt_repo import AptRepo, ImageFiles, changelog_text, debian_image, debian_release, served
from support.canned_engine import CannedEngine
from support.canned_publish import images, run
from support.canned_registry import CannedRegistry

from imagebuilder.cli import cli
from imagebuilder.publish.plan import FAILED, PUSHED, VERIFIED, plan
from imagebuilder.scan.allowlist import parse_allowlist
from imagebuilder.scan.gate import ScanGate
from imagebuilder.scan.mirror import HttpMirror


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    apt = AptRepo(tmp_path_factory.mktemp("mirror"))
    apt.add("libfoo1", "1.0-1+deb12u1", source="foo", changelog=changelog_text("foo", [
        ("1.0-1+deb12u1", "Fix CVE-2026-1111."), ("1.0-1", "Initial.")]))
    apt.publish("bookworm-security")
    with served(apt.root) as url:
        yield url


def _files(ref: str, foo: str) -> ImageFiles:
    return debian_image(ref, debian_release(), [("libfoo1", foo, "foo", "amd64")])


def _gate(url: str, files: ImageFiles, **kwargs: object) -> ScanGate:
    said: list[str] = []
    return ScanGate(files, HttpMirror(said.append).get, said.append, mirror=url, **kwargs)  # type: ignore[arg-type]


def test_an_image_with_a_finding_is_not_pushed_and_its_outcome_names_it(mirror):
    (image,) = images()
    engine = CannedEngine()
    (outcome,) = run(plan([image], {}), engine, CannedRegistry(engine=engine), scan=_gate(mirror, _files(image.ref, "1.0-1")))
    assert outcome.status == FAILED and engine.pushed == [] and outcome.pushed == {}
    assert outcome.reason == "not pushed: 1 finding(s) not allowlisted (docs/scan.md): foo 1.0-1+deb12u1 (CVE-2026-1111)"
    assert "scan_s" in outcome.timings


@pytest.mark.parametrize(("installed", "options", "said"), [
    ("1.0-1+deb12u1", {}, "scanned: no findings"),
    ("1.0-1", {"allowlist": parse_allowlist("- {id: CVE-2026-1111, reason: r, expires: 2099-01-01}", "a.yaml")},
     "scanned: no findings (1 allowlisted)"),
    ("1.0-1", {"allow_vulnerable": True},
     "--allow-vulnerable: pushed with 1 finding(s) not allowlisted: foo 1.0-1+deb12u1 (CVE-2026-1111)"),
])
def test_a_clean_allowlisted_or_allowed_image_is_pushed_and_says_so(mirror, installed, options, said):
    (image,) = images()
    engine = CannedEngine()
    (outcome,) = run(plan([image], {}), engine, CannedRegistry(engine=engine),
                     scan=_gate(mirror, _files(image.ref, installed), **options))
    assert outcome.status == PUSHED and set(engine.pushed) == set(image.refs)
    assert outcome.reason.endswith(f"; {said}"), outcome.reason


def test_a_scan_that_cannot_decide_pushes_nothing(mirror):
    (image,) = images()
    engine = CannedEngine()
    (outcome,) = run(plan([image], {}), engine, CannedRegistry(engine=engine),
                     scan=_gate("http://127.0.0.1:9", _files(image.ref, "1.0-1")))
    assert outcome.status == FAILED and outcome.reason.startswith("scan failed: http://127.0.0.1:9/dists/")
    assert engine.pushed == []


def test_no_push_scans_too(mirror):
    (image,) = images()
    engine = CannedEngine()
    (outcome,) = run(plan([image], {}), engine, CannedRegistry(engine=engine), push=False,
                     scan=_gate(mirror, _files(image.ref, "1.0-1+deb12u1")))
    assert outcome.status == VERIFIED and outcome.reason.endswith("; scanned: no findings")


def test_the_allowlist_and_allow_vulnerable_are_for_scan():
    for extra in (["--allowlist", "a.yaml"], ["--allow-vulnerable"]):
        result = CliRunner().invoke(cli, ["publish", "--registry", "127.0.0.1:5999/ml", "--dry-run", *extra])
        assert result.exit_code == 2 and "--allowlist and --allow-vulnerable are for --scan" in result.stderr
