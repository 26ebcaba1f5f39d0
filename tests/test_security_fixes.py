"""Issue 56: every image applies its OS's security suite, and the fixes it holds are in its
Dockerfile (so its inputs hash): a fix that appears overnight rebuilds it, a night without one
does not. Over a mirror made in the test (tests/support/apt_repo.py) and a base as data: no
network, no engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.apt_repo import AptRepo, Deb, ImageFiles, debian_image, debian_release, served
from support.canned_engine import CannedEngine
from support.canned_publish import images, run
from support.canned_registry import CannedRegistry

from imagebuilder.build.per_platform import Reading, each_platform, render_spec
from imagebuilder.build.render import RenderedImage
from imagebuilder.build.render_options import RenderOptions, Target
from imagebuilder.build.security_step import SOURCES_FILE
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve
from imagebuilder.matrix.selection import Selection
from imagebuilder.publish.plan import BUILD, PUSHED, SKIP, Remote, plan
from imagebuilder.scan.mirror import HttpMirror
from imagebuilder.scan.release import Suite
from imagebuilder.scan.run import CannotScan
from imagebuilder.scan.updates import OsStates, docker_platform, main_suite
from imagebuilder.scan.debian import DebVersion, Package
from imagebuilder.scan.fixes import Fixes, OsState, dependency_graph, fixes_for
from imagebuilder.scan.gate import Scanning, not_scanned
from imagebuilder.trust.labels import SECURITY_FIXES

HERE = Path(__file__).parent
M = load_matrix(HERE / "data" / "matrix-small.yaml")
REQUEST = Request("2.12", "13.0", variant="runtime", os="debian12")
SPEC = resolve(M, REQUEST)

MAIN = """\
Package: python3
Version: 3.11.2-1+b1
Architecture: amd64
Depends: libpython3-stdlib (>= 3.11.2-1+b1), python3.11:any

Package: libpython3-stdlib
Version: 3.11.2-1+b1
Architecture: amd64
Depends: libssl3 | libssl1.1, mime-support

Package: media-types
Version: 10.0.0
Architecture: all
Provides: mime-support

Package: python3.11
Version: 3.11.2-6+deb12u5
Architecture: amd64
Pre-Depends: libexpat1 (>= 2.1~beta3)

Package: chromium
Version: 120.0-1~deb12u1
Architecture: amd64
Depends: libexpat1
"""


def _package(name: str, version: str, arch: str = "amd64") -> Package:
    parsed = DebVersion.parse(version)
    return Package(name, parsed, arch, name, parsed, f"pool/{name}.deb")


def _state(security: dict[str, str], base: dict[str, str] | None = None) -> OsState:
    return OsState("bookworm-security", "amd64",
                   {name: DebVersion.parse(v) for name, v in (base or {"libzstd1": "1.5.4-2"}).items()},
                   {name: _package(name, v) for name, v in security.items()},
                   dependency_graph([MAIN], "amd64"))


@pytest.mark.parametrize(("security", "base", "packages", "fixes"), [
    # A fix of the base's package: upgraded from the suite, checked.
    ({"libzstd1": "1.5.4-2+deb12u1"}, None, [], Fixes(("libzstd1",), (("libzstd1", "1.5.4-2+deb12u1"),))),
    # The base has it already (or newer): nothing to do.
    ({"libzstd1": "1.5.4-2"}, None, ["python3"], Fixes()),
    # Reached through Depends, an alternative (libssl3 | libssl1.1), a virtual package
    # (mime-support), an arch-qualified name (python3.11:any) and Pre-Depends: installed from
    # the suite, checked, not upgraded (the base does not have it).
    ({"libssl3": "3.0.15-1~deb12u1", "media-types": "10.0.1", "libexpat1": "2.5.0-1+deb12u1"}, None, ["python3"],
     Fixes((), (("libexpat1", "2.5.0-1+deb12u1"), ("libssl3", "3.0.15-1~deb12u1"), ("media-types", "10.0.1")))),
    # A fix of a package the image never holds is not its fix.
    ({"chromium": "121.0-1~deb12u1"}, None, ["python3"], Fixes()),
])
def test_fixes_are_those_the_image_holds(security, base, packages, fixes):
    assert fixes_for(_state(security, base), packages) == fixes


def _render(state: OsState | None, mirror: str | None = None) -> RenderedImage:
    return render_spec(SPEC, M, RenderOptions(buildkit=True, security_mirror=mirror, target=Target(
        "linux/amd64", os_states={SPEC.base_image: state} if state else {})))


def test_the_apt_step_adds_the_suite_for_its_run_upgrades_and_checks_the_fixes():
    """Golden: UPDATE_GOLDEN=1 rewrites it after an intended template change; review the diff."""
    image = _render(_state({"libzstd1": "1.5.4-2+deb12u1", "libssl3": "3.0.15-1~deb12u1"}))
    path = HERE / "golden" / "buildkit-runtime-2.12-cuda13.0-debian12-fixes.Dockerfile"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(image.dockerfile)
    assert image.dockerfile == path.read_text()
    text = image.dockerfile
    assert ('echo "deb http://deb.debian.org/debian-security $(. /etc/os-release && echo '
            '"${UBUNTU_CODENAME:-$VERSION_CODENAME}")-security main" > ' + SOURCES_FILE) in text
    assert "--only-upgrade -o Dir::Cache::Archives=/var/cache/imagebuilder/apt " \
           "-o APT::Keep-Downloaded-Packages=true libzstd1 \\\n" in text
    # Quoted: bash would read "=~deb12u1" as a user's home directory.
    assert "for fixed in 'libssl3=3.0.15-1~deb12u1' libzstd1=1.5.4-2+deb12u1; do" in text
    assert f" && rm {SOURCES_FILE} \\\n" in text
    assert image.labels[SECURITY_FIXES] == "libssl3=3.0.15-1~deb12u1 libzstd1=1.5.4-2+deb12u1"


def test_the_fixes_and_the_mirror_decide_the_inputs_hash():
    fixed = _state({"libzstd1": "1.5.4-2+deb12u1"})
    first = _render(fixed)
    assert _render(_state({"libzstd1": "1.5.4-2+deb12u1"})).inputs_hash == first.inputs_hash  # same bytes
    assert _render(_state({"libzstd1": "1.5.4-2+deb12u1", "chromium": "121"})).inputs_hash == first.inputs_hash
    assert _render(_state({"libzstd1": "1.5.4-2+deb12u2"})).inputs_hash != first.inputs_hash
    assert _render(None).inputs_hash != first.inputs_hash
    mirrored = _render(fixed, "http://mirror.local/debian-security")
    assert "deb http://mirror.local/debian-security $(" in mirrored.dockerfile
    assert mirrored.inputs_hash != first.inputs_hash


def test_without_known_fixes_the_suite_is_still_applied_and_nothing_is_checked():
    text = _render(None).dockerfile
    assert SOURCES_FILE in text and "--only-upgrade" not in text and "for fixed in" not in text
    assert SECURITY_FIXES not in text


# --------------------------------------------------------------------------- overnight, over a mirror


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[tuple[AptRepo, str, Deb]]:
    """bookworm (main) and bookworm-security on one mirror, as a local mirror carries both."""
    repo = AptRepo(tmp_path / "mirror")
    repo.publish("bookworm", [
        repo.add("python3", "3.11.2-1+b1", depends="libpython3-stdlib"),
        repo.add("libpython3-stdlib", "3.11.2-1+b1", depends="libssl3 | libssl1.1"),
        repo.add("libssl3", "3.0.11-1~deb12u2", source="openssl"),
        repo.add("libzstd1", "1.5.4-2", source="libzstd")])
    repo.publish("bookworm-security", [zstd := repo.add("libzstd1", "1.5.4-2+deb12u1", source="libzstd")])
    with served(repo.root) as url:
        yield repo, url, zstd


def _base() -> ImageFiles:
    return debian_image(SPEC.base_image, debian_release(), [("libzstd1", "1.5.4-2", "libzstd", "amd64"),
                                                           ("libc6", "2.36-9+deb12u9", "glibc", "amd64")])


def _planned(url: str, registry: dict[str, Remote] | None = None):
    """A nightly's plan: the image rendered over what the mirror says tonight (a new OsStates,
    as each run reads the indexes once), against what the registry holds."""
    said: list[str] = []
    states = OsStates(_base(), HttpMirror(said.append).get, url, said.append)
    (selected,) = each_platform(M, Selection("2.12", "13.0", os="debian12", variant="runtime"),
                                RenderOptions(security_mirror=url), ["linux/amd64"], Reading(request=True),
                                read_os_release=None, note=said.append, host="linux/amd64", read_os_state=states)
    (image,) = selected.images
    return image, plan([image], registry or {})


def _published(image) -> dict[str, Remote]:
    return {image.ref: Remote({ref: "sha256:" + "1" * 64 for ref in image.refs}, image.inputs_hash,
                              security_fixes=image.security_fixes)}


def test_a_fix_that_appears_overnight_rebuilds_the_image_and_the_plan_names_it(archive):
    repo, url, zstd = archive
    image, (step,) = _planned(url)
    assert step.action == BUILD
    assert image.security_fixes == "libzstd1=1.5.4-2+deb12u1"
    registry = _published(image)

    # A night without a fix (the suite's index rewritten, the same fix in it): nothing to build.
    repo.publish("bookworm-security", [zstd])
    again, (step,) = _planned(url, registry)
    assert step.action == SKIP and again.inputs_hash == image.inputs_hash

    # Overnight, openssl's fix: python3 holds libssl3 through libpython3-stdlib.
    repo.publish("bookworm-security", [zstd, repo.add("libssl3", "3.0.15-1~deb12u1", source="openssl")])
    fixed, (step,) = _planned(url, registry)
    assert step.action == BUILD and fixed.inputs_hash != image.inputs_hash
    assert step.reason.endswith("; security fixes: libssl3 3.0.15-1~deb12u1"), step.reason
    assert "libssl3=3.0.15-1~deb12u1" in fixed.dockerfile


def test_no_scan_pushes_and_says_so_in_the_report():
    (image,) = images()
    engine = CannedEngine()
    (outcome,) = run(plan([image], {}), engine, CannedRegistry(engine=engine), scan=not_scanned)
    assert outcome.status == PUSHED and outcome.reason.endswith("; not scanned (--no-scan)"), outcome.reason


def test_the_scan_is_on_by_default_and_off_with_no_scan():
    files = ImageFiles("x", {})
    assert Scanning().gate(files, lambda url: b"", None, print) is not None
    assert Scanning().gate(files, lambda url: b"", None, print) is not not_scanned
    assert Scanning(scan=False).gate(files, lambda url: b"", None, print) is not_scanned
    assert Scanning().gate(None, lambda url: b"", None, print) is None  # nothing built, nothing scanned


@pytest.mark.parametrize(("security", "main"), [
    (Suite("http://deb.debian.org/debian-security", "bookworm-security", "main", "amd64"),
     Suite("http://deb.debian.org/debian", "bookworm", "main", "amd64")),
    (Suite("http://archive.ubuntu.com/ubuntu", "noble-security", "main", "amd64"),
     Suite("http://archive.ubuntu.com/ubuntu", "noble", "main", "amd64")),
    (Suite("http://127.0.0.1:8080", "bookworm-security", "main", "arm64"),
     Suite("http://127.0.0.1:8080", "bookworm", "main", "arm64")),
])
def test_the_dependency_graph_is_read_from_the_archive_the_security_mirror_names(security, main):
    assert main_suite(security) == main


def test_a_base_without_a_dpkg_status_cannot_have_its_fixes_read(archive):
    _, url, _ = archive
    base = ImageFiles(SPEC.base_image, {"/etc/os-release": debian_release().encode()})
    with pytest.raises(CannotScan, match="it has no /var/lib/dpkg/status"):
        OsStates(base, HttpMirror(print).get, url, print)(SPEC.base_image, "amd64")


def test_the_base_is_read_in_the_variant_of_the_images_architecture(archive):
    """A base tag may hold several platforms (imagebuilder-base:bookworm-arm64 holds amd64 and
    arm64): the host's variant's packages are another architecture's, and the arm64 image lacked
    every fix but those of `Architecture: all` packages. The engine is asked for the arch's variant."""
    _, url, _ = archive
    base = _base()
    state = OsStates(base, HttpMirror(print).get, url, print)(SPEC.base_image, "amd64")
    assert dict(zip(base.read, base.platforms))["/var/lib/dpkg/status"] == "linux/amd64" and "libzstd1" in state.installed
    assert (docker_platform("amd64"), docker_platform("arm64"), docker_platform("riscv64")) == (
        "linux/amd64", "linux/arm64", None)
