"""Pure: what Debian's and Ubuntu's own files say, read as dpkg and apt read them.

- `DebVersion`: a package version ordered exactly as `dpkg --compare-versions` orders it
  (epoch, then upstream and revision by dpkg's `verrevcmp`: `~` before everything, even the end;
  letters before other characters; digit runs as numbers);
- `paragraphs()`: deb822 text (dpkg's status, a Packages index) as one dict per paragraph;
- `installed()`, `available()`: the packages an image's dpkg status holds, and those a Packages
  index offers, with the source package each was built from;
- `changelog_entries()`, `vulnerability_ids_between()`: a changelog.Debian's entries, and the CVE
  (and GHSA) ids the entries after an installed version and up to a fixed one name.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ImageBuilderError


class BadDebVersion(ImageBuilderError, ValueError):
    template = "{text!r} is not a Debian version: {reason}"


_ZERO, _NINE, _TILDE = ord("0"), ord("9"), ord("~")


def _digit(c: int) -> bool:
    return _ZERO <= c <= _NINE


def _order(c: int) -> int:
    """dpkg's weight of one byte of a non-digit run (-1 is the end of the string)."""
    if c < 0 or _digit(c):
        return 0
    if ord("a") <= c <= ord("z") or ord("A") <= c <= ord("Z"):
        return c
    if c == _TILDE:
        return -1
    return c + 256


def _verrevcmp(left: str, right: str) -> int:
    """dpkg's lib/dpkg/version.c verrevcmp(), line for line over the bytes: <0, 0 or >0."""
    a, b = left.encode(), right.encode()

    def at(s: bytes, k: int) -> int:
        return s[k] if k < len(s) else -1

    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not _digit(a[i])) or (j < len(b) and not _digit(b[j])):
            ac, bc = _order(at(a, i)), _order(at(b, j))
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while at(a, i) == _ZERO:
            i += 1
        while at(b, j) == _ZERO:
            j += 1
        while _digit(at(a, i)) and _digit(at(b, j)):
            if not first_diff:
                first_diff = a[i] - b[j]
            i += 1
            j += 1
        if _digit(at(a, i)):
            return 1
        if _digit(at(b, j)):
            return -1
        if first_diff:
            return first_diff
    return 0


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class DebVersion:
    """[epoch:]upstream[-revision], compared as dpkg compares it (so "1.0" == "1.0-0" == "0:1.00")."""

    epoch: int
    upstream: str
    revision: str
    text: str

    @classmethod
    def parse(cls, text: str) -> DebVersion:
        stripped = text.strip()
        if not stripped or any(c.isspace() for c in stripped):
            raise BadDebVersion(text=text, reason="empty or with spaces")
        epoch, colon, rest = stripped.partition(":")
        if not colon:
            epoch, rest = "0", stripped
        if not (epoch.isascii() and epoch.isdigit()):
            raise BadDebVersion(text=text, reason="the epoch is not a number")
        upstream, dash, revision = rest.rpartition("-")
        if not dash:
            upstream, revision = rest, ""
        if not upstream or (dash and not revision):
            raise BadDebVersion(text=text, reason="nothing before or after its last '-' or its ':'")
        return cls(int(epoch), upstream, revision, stripped)

    def compare(self, other: DebVersion) -> int:
        """<0, 0 or >0 as `dpkg --compare-versions self lt|eq|gt other` says."""
        if self.epoch != other.epoch:
            return self.epoch - other.epoch
        return _verrevcmp(self.upstream, other.upstream) or _verrevcmp(self.revision, other.revision)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DebVersion) and self.compare(other) == 0

    def __lt__(self, other: DebVersion) -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:  # equal versions can be spelled apart ("1.0", "1.00-0"): the epoch is all they share
        return hash(self.epoch)

    def __str__(self) -> str:
        return self.text


def paragraphs(text: str) -> Iterator[dict[str, str]]:
    """deb822 paragraphs: `Field: value`, continuation lines joined with newlines."""
    fields: dict[str, str] = {}
    last = None
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields, last = {}, None
        elif line[0] in " \t":
            if last is not None:
                fields[last] += "\n" + line.strip()
        else:
            name, colon, value = line.partition(":")
            if colon and name and not name.startswith("#"):
                last = name.strip()
                fields[last] = value.strip()
    if fields:
        yield fields


@dataclass(frozen=True)
class Package:
    """A binary package: installed in an image, or offered by an index (then `filename`, `size`
    and `sha256` say where its .deb is in the mirror's pool)."""

    name: str
    version: DebVersion
    arch: str
    source: str
    source_version: DebVersion
    filename: str = ""
    size: int = 0
    sha256: str = ""


def _package(fields: dict[str, str]) -> Package | None:
    name, version = fields.get("Package", ""), fields.get("Version", "")
    if not name or not version:
        return None
    try:
        parsed = DebVersion.parse(version)
        # "Source: openssl" or, when the binary's version is not its source's, "Source: glibc (2.36-9)"
        source, _, rest = fields.get("Source", name).partition(" ")
        source_version = DebVersion.parse(rest.strip(" ()")) if rest.strip(" ()") else parsed
        size = int(fields.get("Size", "0") or 0)
    except ValueError:  # a paragraph dpkg itself would refuse: not a package we can judge
        return None
    return Package(name, parsed, fields.get("Architecture", ""), source or name, source_version,
                   fields.get("Filename", ""), size, fields.get("SHA256", ""))


def installed(status: str) -> list[Package]:
    """The packages dpkg's status file says are installed ("install ok installed")."""
    out = []
    for fields in paragraphs(status):
        if fields.get("Status", "").split()[-1:] == ["installed"]:
            package = _package(fields)
            if package is not None:
                out.append(package)
    return out


def available(index: str) -> dict[tuple[str, str], Package]:
    """(name, arch) -> the newest version a Packages index offers of it."""
    out: dict[tuple[str, str], Package] = {}
    for fields in paragraphs(index):
        package = _package(fields)
        if package is None or not package.filename:
            continue
        key = (package.name, package.arch)
        if key not in out or out[key].version < package.version:
            out[key] = package
    return out


# "openssl (3.0.15-1~deb12u1) bookworm-security; urgency=medium"
_HEADER = re.compile(r"^(?P<source>[a-z0-9][a-z0-9+.-]*) \((?P<version>[^()\s]+)\)(?P<rest>.*)$")
# What a Debian changelog names a vulnerability by: CVE ids, and GitHub's advisories (OSV ids).
VULNERABILITY_ID = re.compile(r"\b(?:CVE-\d{4}-\d{4,}|GHSA(?:-[23456789cfghjmpqrvwx]{4}){3})\b")


def changelog_entries(text: str) -> list[tuple[DebVersion, str]]:
    """(version, the entry's text) for each entry of a Debian changelog, newest first."""
    entries: list[tuple[DebVersion, list[str]]] = []
    for line in text.splitlines():
        match = _HEADER.match(line)
        if match and ";" in match["rest"]:
            try:
                entries.append((DebVersion.parse(match["version"]), []))
                continue
            except BadDebVersion:
                pass
        if entries:
            entries[-1][1].append(line)
    return [(version, "\n".join(lines)) for version, lines in entries]


def _id_order(vulnerability_id: str) -> tuple[int, int, str]:
    kind, _, rest = vulnerability_id.partition("-")
    if kind == "CVE":
        year, _, number = rest.partition("-")
        return 0, int(year) * 10**12 + int(number), ""
    return 1, 0, vulnerability_id


def vulnerability_ids_between(changelog: str, installed_version: DebVersion, fixed: DebVersion) -> tuple[str, ...]:
    """The CVE (and GHSA) ids that the entries newer than `installed_version`, up to `fixed`,
    name: sorted, once each."""
    ids = {found for version, body in changelog_entries(changelog)
           if installed_version < version <= fixed for found in VULNERABILITY_ID.findall(body)}
    return tuple(sorted(ids, key=_id_order))
