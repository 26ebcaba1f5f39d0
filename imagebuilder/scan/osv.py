"""OSV records (https://ossf.github.io/osv-schema/) against an image's Python packages.

The records come from a file the user supplies (--osv): a zip of JSON records (PyPI's all.zip)
or a folder of them. A package version is affected by a record when the record lists it in
`versions`, or an ECOSYSTEM range's events (introduced, fixed, last_affected, in version order)
leave it affected; versions are packaging's `Version`s, never strings compared.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from ..errors import BadRequest

ECOSYSTEM = "PyPI"


class BadOsv(BadRequest):
    template = "{path}: {reason}"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version(text: object) -> Version | None:
    try:
        return Version(str(text))
    except ValueError:  # InvalidVersion, or a number too long for int()
        return None


@dataclass(frozen=True)
class Range:
    """An ECOSYSTEM range's events as (kind, version), in version order ("introduced" 0 first)."""

    events: tuple[tuple[str, Version], ...]

    def affects(self, version: Version) -> bool:
        affected = False
        for kind, at in self.events:
            if kind == "introduced" and version >= at:
                affected = True
            elif kind == "fixed" and version >= at:
                affected = False
            elif kind == "last_affected" and version > at:
                affected = False
        return affected

    def fixed_after(self, version: Version) -> Version | None:
        return next((at for kind, at in self.events if kind == "fixed" and at > version), None)


@dataclass(frozen=True)
class Affected:
    name: str  # canonical
    ranges: tuple[Range, ...]
    versions: frozenset[Version]


@dataclass(frozen=True)
class Record:
    id: str
    aliases: tuple[str, ...]
    affected: tuple[Affected, ...]


@dataclass(frozen=True)
class Match:
    record: Record
    fixed: Version | None  # the first fixed version above the installed one, when a range names one


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _range(raw: object) -> Range | None:
    if not isinstance(raw, dict) or raw.get("type") != "ECOSYSTEM" or not isinstance(raw.get("events"), list):
        return None
    events = []
    for event in _list(raw["events"]):
        if not isinstance(event, dict) or len(event) != 1:
            continue
        ((kind, value),) = event.items()
        if kind not in ("introduced", "fixed", "last_affected"):
            continue  # "limit" bounds a git range; an ECOSYSTEM range has none
        version = Version("0") if kind == "introduced" and value == "0" else _version(value)
        if version is None:  # an event we cannot place would make the whole range a guess
            return None
        events.append((kind, version))
    # Ties: at one version a fix ends what an introduction began only if it comes after it.
    order = {"introduced": 0, "last_affected": 1, "fixed": 2}
    return Range(tuple(sorted(events, key=lambda e: (e[1], order[e[0]]))))


def parse_record(raw: object, where: str) -> Record | None:
    """A record's PyPI facts, None for a withdrawn record or one about other ecosystems."""
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
        raise BadOsv(path=where, reason="not an OSV record (a JSON object with an `id`)")
    if raw.get("withdrawn"):
        return None
    affected = []
    for item in _list(raw.get("affected")):
        if not isinstance(item, dict):
            continue
        package = item.get("package")
        if not isinstance(package, dict) or package.get("ecosystem") != ECOSYSTEM or not isinstance(package.get("name"), str):
            continue
        ranges = tuple(r for r in map(_range, _list(item.get("ranges"))) if r is not None)
        versions = frozenset(v for v in map(_version, _list(item.get("versions"))) if v is not None)
        affected.append(Affected(canonical(package["name"]), ranges, versions))
    if not affected:
        return None
    aliases = tuple(a for a in _list(raw.get("aliases")) if isinstance(a, str))
    return Record(raw["id"], aliases, tuple(affected))


def _documents(path: Path) -> Iterator[tuple[str, bytes]]:
    if not path.exists():
        raise BadOsv(path=str(path), reason="no such file or folder; give a zip of OSV records (PyPI's all.zip) or a folder of them")
    if path.is_dir():
        for file in sorted(path.rglob("*.json")):
            yield str(file), file.read_bytes()
        return
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.filename.endswith(".json") and not info.is_dir():
                    yield f"{path}:{info.filename}", archive.read(info)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as e:
        raise BadOsv(path=str(path), reason=f"not a zip of OSV records nor a folder of them ({e})") from e


def load_osv(path: Path) -> dict[str, list[Record]]:
    """Canonical package name -> the records that name it, from a zip or a folder of OSV JSON."""
    out: dict[str, list[Record]] = {}
    try:
        for where, data in _documents(path):
            try:
                raw = json.loads(data)
            except (ValueError, RecursionError) as e:
                raise BadOsv(path=where, reason=f"not JSON ({type(e).__name__})") from e
            record = parse_record(raw, where)
            if record is not None:
                for name in {a.name for a in record.affected}:
                    out.setdefault(name, []).append(record)
    except OSError as e:
        raise BadOsv(path=str(path), reason=f"cannot be read ({getattr(e, 'strerror', None) or e})") from e
    return out


def matches(records: dict[str, list[Record]], name: str, version: Version) -> list[Match]:
    """The records that affect `name` at `version`."""
    out = []
    for record in records.get(canonical(name), []):
        for affected in record.affected:
            if affected.name != canonical(name):
                continue
            hit = [r for r in affected.ranges if r.affects(version)]
            if hit or version in affected.versions:
                fixes = [f for f in (r.fixed_after(version) for r in hit) if f is not None]
                out.append(Match(record, min(fixes) if fixes else None))
                break
    return out
