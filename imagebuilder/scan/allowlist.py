"""The allowlist: vulnerabilities a person accepted for a while, each with a reason and an expiry.

    - id: CVE-2025-4802          # a CVE id, or an OSV id (GHSA-..., PYSEC-..., DSA-...)
      reason: glibc's static setuid binaries; none in this image
      expires: 2027-03-31        # YYYY-MM-DD: accepted up to and including this day

A file that is not such a list is refused whole, every problem named with its entry and line in
one line (AllowlistError, exit 2): an allowlist half read would accept what nobody wrote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import yaml

from ..errors import BadRequest

KEYS = ("id", "reason", "expires")
CVE = re.compile(r"CVE-\d{4}-\d{4,}")
OSV_ID = re.compile(r"[A-Z][A-Z0-9]*(-[A-Za-z0-9._:]+)+")
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


class AllowlistError(BadRequest):
    template = "{path}: {problems}"


@dataclass(frozen=True)
class Entry:
    id: str
    reason: str
    expires: date
    line: int

    def expired(self, today: date) -> bool:
        return self.expires < today


@dataclass(frozen=True)
class Allowlist:
    entries: tuple[Entry, ...] = ()

    def entry(self, vulnerability_id: str) -> Entry | None:
        return next((e for e in self.entries if e.id == vulnerability_id), None)


def _entry(node: yaml.Node, where: str, problems: list[str]) -> Entry | None:
    if not isinstance(node, yaml.MappingNode):
        problems.append(f"{where}: not a mapping of {', '.join(KEYS)}")
        return None
    values: dict[str, str] = {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if key not in KEYS:
            problems.append(f"{where}: unknown key {key!r} (the keys are {', '.join(KEYS)})")
        elif key in values:
            problems.append(f"{where}: {key!r} twice")
        elif not isinstance(value_node, yaml.ScalarNode) or not str(value_node.value).strip():
            problems.append(f"{where}: {key!r} is not a plain non-empty value")
            values[key] = ""
        else:
            values[key] = str(value_node.value).strip()
    missing = [key for key in KEYS if key not in values]
    if missing:
        problems.append(f"{where}: missing {', '.join(repr(k) for k in missing)}")
    if missing or not all(values.values()):
        return None
    ok = True
    if not (CVE.fullmatch(values["id"]) if values["id"].startswith("CVE-") else OSV_ID.fullmatch(values["id"])):
        problems.append(f"{where}: id {values['id']!r} is not a CVE id (CVE-YYYY-NNNN) or an OSV id (GHSA-..., PYSEC-...)")
        ok = False
    expires = None
    if DAY.fullmatch(values["expires"]):
        try:
            expires = date.fromisoformat(values["expires"])
        except ValueError:
            pass
    if expires is None:
        problems.append(f"{where}: expires {values['expires']!r} is not a date YYYY-MM-DD")
    if not ok or expires is None:
        return None
    return Entry(values["id"], values["reason"], expires, node.start_mark.line + 1)


def parse_allowlist(text: str, path: str) -> Allowlist:
    """The allowlist in `text` (read from `path`), or AllowlistError naming every problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise AllowlistError(path=path, problems=f"not YAML{where}: {problem}") from e
    except (ValueError, RecursionError) as e:  # a NUL byte, nesting deeper than the parser goes
        raise AllowlistError(path=path, problems=f"not YAML: {type(e).__name__}") from e
    if root is None:
        return Allowlist()
    if not isinstance(root, yaml.SequenceNode):
        raise AllowlistError(path=path, problems="not a list of entries (- id: ..., reason: ..., expires: YYYY-MM-DD)")
    problems: list[str] = []
    entries: list[Entry] = []
    first: dict[str, int] = {}
    for index, node in enumerate(root.value, start=1):
        where = f"entry {index} (line {node.start_mark.line + 1})"
        entry = _entry(node, where, problems)
        if entry is None:
            continue
        if entry.id in first:
            problems.append(f"{where}: id {entry.id} again (first in entry {first[entry.id]})")
            continue
        first[entry.id] = index
        entries.append(entry)
    if problems:
        raise AllowlistError(path=path, problems="; ".join(problems))
    return Allowlist(tuple(entries))


def load_allowlist(path: Path | None) -> Allowlist:
    """The allowlist in the file at `path`; an empty one for None."""
    if path is None:
        return Allowlist()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AllowlistError(path=str(path), problems=f"cannot be read ({type(e).__name__}: "
                                                      f"{getattr(e, 'strerror', None) or e})") from e
    return parse_allowlist(text, str(path))


def statuses(allowlist: Allowlist, ids: tuple[str, ...], today: date) -> Mapping[str, str]:
    """Each id -> "allowlisted", "expired" (its entry's day has passed) or "open"."""
    out = {}
    for vulnerability_id in ids:
        entry = allowlist.entry(vulnerability_id)
        out[vulnerability_id] = "open" if entry is None else "expired" if entry.expired(today) else "allowlisted"
    return out
