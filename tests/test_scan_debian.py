"""Pure parts of `scan`: dpkg's version order (a table, and the real `dpkg --compare-versions` on
generated pairs), deb822, changelogs, os-release and the security suite, the .deb reader."""

from __future__ import annotations

import gzip
import io
import random
import shlex
import shutil
import subprocess
import tarfile
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis import settings
from support.fuzz import fuzz_examples
from support.unavailable import _unavailable

from imagebuilder.scan.debfile import BadDeb, changelog
from imagebuilder.scan.debian import (BadDebVersion, DebVersion, available, changelog_entries, installed,
                                      vulnerability_ids_between)
from imagebuilder.scan.release import NotDebian, os_release, security_suite

# (a, b, sign of compare(a, b)), as dpkg's own tests and Debian policy 5.6.12 order them.
ORDER = [
    ("1.0", "1.0", 0), ("1.0", "1.0-0", 0), ("1.00", "1.0", 0), ("0:1.0", "1.0", 0), ("1.0-1", "1.0-01", 0),
    ("1.0~rc1", "1.0", -1), ("1.0~~", "1.0~", -1), ("1.0~", "1.0", -1), ("1.0", "1.0+b1", -1),
    ("1.0", "1.0a", -1), ("1.0a", "1.0+", -1), ("1.0", "1.0.", -1), ("1.0a", "1.0.", -1),
    ("1:0.1", "2.0", 1), ("2.0", "10.0", -1), ("1.2.3", "1.2.10", -1), ("1.0-1", "1.0-1.1", -1),
    ("1.0-1", "1.0-1ubuntu1", -1), ("1.0-1ubuntu1", "1.0-2", -1), ("3.0.15-1~deb12u1", "3.0.15-1", -1),
    ("5.4.1-1+deb12u1", "5.4.1-1+deb12u2", -1), ("1:1.2.13.dfsg-1", "1:1.2.13.dfsg-1+deb12u1", -1),
    ("2.6.1", "2.6.2", -1), ("1.0-a", "1.0-A", 1), ("9", "10", -1), ("a", "b", -1), ("1.0-1-1", "1.0-1", 1),
]


def _sign(n: int) -> int:
    return (n > 0) - (n < 0)


@pytest.mark.parametrize(("a", "b", "want"), ORDER)
def test_dpkgs_order(a, b, want):
    assert _sign(DebVersion.parse(a).compare(DebVersion.parse(b))) == want
    assert _sign(DebVersion.parse(b).compare(DebVersion.parse(a))) == -want
    assert (DebVersion.parse(a) == DebVersion.parse(b)) == (want == 0)


def _generated(rng: random.Random) -> str:
    chars = "0123456789abzAZ.+~"
    epoch = f"{rng.randint(0, 2)}:" if rng.random() < 0.2 else ""
    upstream = rng.choice("0123456789") + "".join(rng.choice(chars) for _ in range(rng.randint(0, 6)))
    if rng.random() < 0.3:
        upstream += "-" + rng.choice("0123456789")  # a '-' in upstream (the revision is after the last)
    revision = "-" + "".join(rng.choice(chars) for _ in range(rng.randint(1, 5))) if rng.random() < 0.7 else ""
    return epoch + upstream + revision


def _near(rng: random.Random, version: str) -> str:
    """A version that differs from `version` in one place: where orders are decided."""
    i = rng.randrange(len(version) + 1)
    return version[:i] + rng.choice(["~", "", "0", "1", "a", "+", "."]) + version[i + 1:]


def test_the_order_is_dpkgs_on_generated_pairs():
    """400 pairs (half of them near misses) against `dpkg --compare-versions`, in one shell."""
    if shutil.which("dpkg") is None:
        _unavailable("dpkg is missing (apt-get install dpkg)")
    rng = random.Random(56)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < 400:
        a = _generated(rng)
        b = _near(rng, a) if len(pairs) % 2 else _generated(rng)
        try:
            parsed = DebVersion.parse(b)
        except BadDebVersion:
            continue
        if parsed.upstream[:1].isdigit():  # dpkg warns on an upstream version not starting with a digit
            pairs.append((a, b))
    script = "\n".join(f"if dpkg --compare-versions {shlex.quote(a)} lt {shlex.quote(b)}; then echo -1; "
                       f"elif dpkg --compare-versions {shlex.quote(a)} eq {shlex.quote(b)}; then echo 0; else echo 1; fi"
                       for a, b in pairs)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr[:2000]
    said = [int(line) for line in done.stdout.split()]
    assert len(said) == len(pairs)
    wrong = [(a, b, theirs) for (a, b), theirs in zip(pairs, said)
             if _sign(DebVersion.parse(a).compare(DebVersion.parse(b))) != theirs]
    assert wrong == [], wrong[:10]
    assert len(set(said)) == 3  # the pairs cover all three answers


@pytest.mark.parametrize("text", ["", " ", "a:1.0", "1.0-", "-1", "1 0", ":1.0", "1:"])
def test_what_is_no_version_is_refused(text):
    with pytest.raises(BadDebVersion):
        DebVersion.parse(text)


@settings(max_examples=fuzz_examples(300))
@given(st.text(max_size=30))
def test_any_text_is_a_version_or_bad_deb_version_and_the_order_is_total(text):
    try:
        v = DebVersion.parse(text)
    except BadDebVersion:
        return
    assert v == v and not v < v and _sign(v.compare(DebVersion.parse("1.0"))) == -_sign(DebVersion.parse("1.0").compare(v))


STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc (2.36-9+deb12u4)
Version: 2.36-9+deb12u4
Description: GNU C Library
 multi-line
 .
 more

Package: removed
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0-1

Package: libfoo1
Status: install ok installed
Architecture: amd64
Source: foo (1.0-1)
Version: 1.0-1+b2

Package: broken
Status: install ok installed
Version: not a version
"""


def test_dpkg_status_gives_installed_packages_and_their_sources():
    got = [(p.name, str(p.version), p.source, str(p.source_version), p.arch) for p in installed(STATUS)]
    assert got == [("libc6", "2.36-9+deb12u4", "glibc", "2.36-9+deb12u4", "amd64"),
                   ("libfoo1", "1.0-1+b2", "foo", "1.0-1", "amd64")]


def test_a_packages_index_keeps_the_newest_of_each_package():
    index = "\n".join(f"Package: foo\nVersion: {v}\nArchitecture: amd64\nFilename: pool/foo_{v}.deb\nSize: 1\n"
                      for v in ("1.0-2", "1.0-10", "1.0-9"))
    assert str(available(index)[("foo", "amd64")].version) == "1.0-10"


LOG = """foo (1.0-3) bookworm-security; urgency=high

  * CVE-2026-0003, and CVE-2026-0010 again: CVE-2026-0010.

 -- A <a@example.org>  Sun, 06 Dec 2026 00:00:00 +0000

foo (1.0-2) bookworm; urgency=medium

  * Fix GHSA-23cf-ghjm-pqrv (CVE-2026-0002); not GHSA-1111-1111-1111 (1 is no GHSA letter).
    foo (this is not a header)

 -- A <a@example.org>  Sat, 05 Dec 2026 00:00:00 +0000

foo (1.0-1) unstable; urgency=medium

  * CVE-2025-0001.

 -- A <a@example.org>  Fri, 04 Dec 2026 00:00:00 +0000
"""


def test_the_ids_between_the_installed_and_the_fixed_version():
    assert [str(v) for v, _ in changelog_entries(LOG)] == ["1.0-3", "1.0-2", "1.0-1"]
    between = vulnerability_ids_between
    assert between(LOG, DebVersion.parse("1.0-1"), DebVersion.parse("1.0-3")) == (
        "CVE-2026-0002", "CVE-2026-0003", "CVE-2026-0010", "GHSA-23cf-ghjm-pqrv")
    assert between(LOG, DebVersion.parse("1.0-2"), DebVersion.parse("1.0-2")) == ()
    assert between(LOG, DebVersion.parse("1.0-1"), DebVersion.parse("1.0-2")) == ("CVE-2026-0002", "GHSA-23cf-ghjm-pqrv")
    assert between("no header here CVE-2026-0001", DebVersion.parse("0"), DebVersion.parse("9")) == ()


DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_CODENAME=bookworm\n'


@pytest.mark.parametrize(("text", "arch", "mirror", "index"), [
    (DEBIAN, "amd64", None, "http://deb.debian.org/debian-security/dists/bookworm-security/main/binary-amd64/Packages"),
    (DEBIAN.replace("bookworm", "buster"), "arm64", None,
     "http://deb.debian.org/debian-security/dists/buster/updates/main/binary-arm64/Packages"),
    (DEBIAN, "amd64", "http://mirror.local/sec/", "http://mirror.local/sec/dists/bookworm-security/main/binary-amd64/Packages"),
    ("ID=ubuntu\nVERSION_CODENAME=jammy\n", "amd64", None,
     "http://archive.ubuntu.com/ubuntu/dists/jammy-security/main/binary-amd64/Packages"),
    ("ID=ubuntu\nVERSION_CODENAME=noble\n", "arm64", None,
     "http://ports.ubuntu.com/ubuntu-ports/dists/noble-security/main/binary-arm64/Packages"),
    ("ID=linuxmint\nID_LIKE='ubuntu debian'\nVERSION_CODENAME=wilma\nUBUNTU_CODENAME=noble\n", "amd64", None,
     "http://archive.ubuntu.com/ubuntu/dists/noble-security/main/binary-amd64/Packages"),
])
def test_the_security_suite_of_each_os(text, arch, mirror, index):
    assert security_suite(os_release("img", text), arch, mirror).index == index


@settings(max_examples=fuzz_examples(200))
@given(st.text(max_size=200))
def test_any_os_release_is_an_os_or_one_line_refusal(text):
    try:
        os_release("img", text)
    except NotDebian as e:
        assert "\n" not in str(e) and e.exit_status == 2


def _deb(members: dict[str, bytes]) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, data in members.items():
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{644:<8}{len(data):<10}`\n".encode() + data + (b"\n" if len(data) % 2 else b"")
    return bytes(out)


def _data_tar(files: dict[str, bytes], mode: Literal["w:gz", "w:xz"] = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_the_changelog_of_a_deb_and_its_absence():
    log = gzip.compress(b"foo (1.0-1) unstable; urgency=low\n")
    deb = _deb({"debian-binary": b"2.0\n", "control.tar.xz": b"", "data.tar.gz": _data_tar(
        {"./usr/share/doc/foo/changelog.gz": gzip.compress(b"upstream"), "./usr/share/doc/foo/changelog.Debian.gz": log})})
    assert changelog(deb, "foo.deb") == "foo (1.0-1) unstable; urgency=low\n"
    native = _deb({"debian-binary": b"2.0\n", "data.tar.xz": _data_tar({"./usr/share/doc/apt/changelog.gz": log}, "w:xz")})
    assert changelog(native, "apt.deb", native=True) is not None and changelog(native, "apt.deb") is None


@pytest.mark.parametrize(("data", "reason"), [
    (b"not a deb", "no ar magic"),
    (b"!<arch>\nshort", None),  # a truncated header: no members
    (_deb({"debian-binary": b"2.0\n"}), "no data.tar member"),
    (_deb({"data.tar.gz": b"garbage"}), "does not read"),
    (_deb({"data.tar.xz": b"\xfd7zXZ\x00garbage"}), "does not read"),
    (b"!<arch>\n" + b"x" * 58 + b"`\n", "a bad member size"),
])
def test_a_broken_deb_is_one_line(data, reason):
    with pytest.raises(BadDeb, match=reason or "no data.tar member") as caught:
        changelog(data, "pool/x.deb")
    assert "\n" not in str(caught.value)


@settings(max_examples=fuzz_examples(200))
@given(st.binary(max_size=300))
def test_any_bytes_are_a_changelog_none_or_bad_deb(data):
    try:
        changelog(b"!<arch>\n" + data, "x.deb")
    except BadDeb as e:
        assert "\n" not in str(e)
