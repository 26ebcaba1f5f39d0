"""ScanReport: what a scan found, for people (format) and machines (to_json);
`raise_if_vulnerable()` turns a finding that no unexpired allowlist entry covers into exit 1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from ..errors import ImageBuilderError
from ..build.table import format_table
from .allowlist import Allowlist

OPEN, EXPIRED, ALLOWLISTED = "open", "expired", "allowlisted"


class Vulnerable(ImageBuilderError):
    """Exit 1: a fix exists for something the image holds, and no allowlist entry covers it."""

    template = "{image}: {count} finding(s) not allowlisted: {packages}"


@dataclass(frozen=True)
class Vulnerability:
    """One vulnerability by all its names: a CVE id; or an OSV id and its aliases."""

    ids: tuple[str, ...]

    def status(self, allowlist: Allowlist, today: date) -> str:
        entries = [e for e in map(allowlist.entry, self.ids) if e is not None]
        if any(not e.expired(today) for e in entries):
            return ALLOWLISTED
        return EXPIRED if entries else OPEN


@dataclass(frozen=True)
class Finding:
    """A package the image holds at a version its fix is newer than.

    kind: "deb" (package is the source package, binaries the installed ones it built) or "pypi"."""

    kind: str
    package: str
    installed: str
    fixed: str
    vulnerabilities: tuple[Vulnerability, ...]
    binaries: tuple[str, ...] = ()
    note: str = ""

    def status(self, allowlist: Allowlist, today: date) -> str:
        """open unless every vulnerability is allowlisted (a fix that names none cannot be);
        expired when an expired entry is all that stood in the way."""
        found = {v.status(allowlist, today) for v in self.vulnerabilities}
        if not self.vulnerabilities or OPEN in found:
            return OPEN
        return EXPIRED if EXPIRED in found else ALLOWLISTED


@dataclass(frozen=True)
class ScanReport:
    image: str
    os: str
    sources: tuple[str, ...]  # where the facts came from: the security suites, the OSV file
    packages: int  # how many packages were checked, OS and Python
    findings: tuple[Finding, ...]
    allowlist: Allowlist
    today: date
    notes: tuple[str, ...] = field(default=())

    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.status(self.allowlist, self.today) != ALLOWLISTED]

    def format(self) -> str:
        lines = [f"{self.image}: {self.os}; {self.packages} packages checked against "
                 + ("; ".join(self.sources) or "nothing (no installed package has an architecture)")]
        if self.findings:
            rows = []
            for f in self.findings:
                ids = ", ".join(v.ids[0] + (f" [{v.status(self.allowlist, self.today)}]"
                                            if v.status(self.allowlist, self.today) != OPEN else "")
                                for v in f.vulnerabilities) or f.note or "-"
                rows.append((f.package, f.kind, f.installed, f.fixed, f.status(self.allowlist, self.today), ids))
            lines += ["", format_table(("PACKAGE", "KIND", "INSTALLED", "FIXED", "STATUS", "VULNERABILITIES"), rows)]
        lines += ["", *self.notes] if self.notes else []
        failing = self.failing()
        expired = sum(f.status(self.allowlist, self.today) == EXPIRED for f in failing)
        lines += ["", f"{len(self.findings)} finding(s): {len(failing)} not allowlisted"
                      + (f" ({expired} expired)" if expired else "")
                      + f", {len(self.findings) - len(failing)} allowlisted" if self.findings else "no findings"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        def vulnerability(v: Vulnerability) -> dict[str, Any]:
            entry = next((e for e in map(self.allowlist.entry, v.ids) if e is not None), None)
            return {"ids": list(v.ids), "status": v.status(self.allowlist, self.today),
                    **({"allowlist": {"id": entry.id, "reason": entry.reason, "expires": entry.expires.isoformat()}}
                       if entry else {})}

        return {
            "image": self.image, "os": self.os, "sources": list(self.sources), "packages": self.packages,
            "date": self.today.isoformat(), "vulnerable": bool(self.failing()),
            "findings": [{"kind": f.kind, "package": f.package, "binaries": list(f.binaries),
                          "installed": f.installed, "fixed": f.fixed, "status": f.status(self.allowlist, self.today),
                          "vulnerabilities": [vulnerability(v) for v in f.vulnerabilities],
                          **({"note": f.note} if f.note else {})} for f in self.findings],
            "notes": list(self.notes),
        }

    def raise_if_vulnerable(self) -> None:
        failing: Sequence[Finding] = self.failing()
        if failing:
            raise Vulnerable(image=self.image, count=len(failing),
                             packages=", ".join(f"{f.package} {f.fixed}" + (" (expired)" if f.status(
                                 self.allowlist, self.today) == EXPIRED else "") for f in failing))
