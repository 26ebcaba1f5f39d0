"""publish's gate: each image scanned after its smoke tests and before its push (by default;
`--no-scan` leaves it out).

`ScanGate(ref)` -> (push it?, the line the publish report carries). A finding no unexpired allowlist
entry covers stops the push, naming each; `--allow-vulnerable` pushes anyway and says so in the line,
as `--no-scan` does in each image's line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .allowlist import Allowlist
from .mirror import Get
from .run import ImageFiles, ScanRequest, scan_image

Gate = Callable[[str], tuple[bool, str]]


@dataclass(frozen=True)
class ScanGate:
    files: ImageFiles
    get: Get
    say: Callable[[str], None]
    allowlist: Allowlist = Allowlist()
    allow_vulnerable: bool = False
    mirror: str | None = None

    def __call__(self, ref: str) -> tuple[bool, str]:
        report = scan_image(ScanRequest(ref, self.allowlist, mirror=self.mirror), self.files, self.get, self.say)
        failing = report.failing()
        if not failing:
            allowed = len(report.findings)
            return True, f"scanned: no findings{f' ({allowed} allowlisted)' if allowed else ''}"
        named = ", ".join(f"{f.package} {f.fixed}" + (f" ({', '.join(v.ids[0] for v in f.vulnerabilities)})"
                                                      if f.vulnerabilities else "") for f in failing)
        if self.allow_vulnerable:
            return True, f"--allow-vulnerable: pushed with {len(failing)} finding(s) not allowlisted: {named}"
        return False, f"{len(failing)} finding(s) not allowlisted (docs/scan.md): {named}"


def not_scanned(ref: str) -> tuple[bool, str]:
    return True, "not scanned (--no-scan)"


@dataclass(frozen=True)
class Scanning:
    """What publish was told of its scan: on (the default) or --no-scan, the allowlist, --allow-vulnerable."""

    scan: bool = True
    allowlist: Allowlist = Allowlist()
    allow_vulnerable: bool = False

    def gate(self, files: ImageFiles | None, get: Get, mirror: str | None, say: Callable[[str], None]) -> Gate | None:
        """The gate of a run over `files` (None: nothing is built, so nothing is scanned)."""
        if files is None:
            return None
        if not self.scan:
            return not_scanned
        return ScanGate(files, get, say, self.allowlist, allow_vulnerable=self.allow_vulnerable, mirror=mirror)
