"""`scan_image()`: an image's packages against the fixes its OS published (and an OSV file).

Every dependency is handed in: the image's files (`ImageFiles`, the engine at the command's edge),
the mirror (`get`, a URL -> bytes), what to say while it works. The image is read, never run.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Protocol

from packaging.version import Version

from ..errors import ImageBuilderError
from ..build.image_contents import SBOM_PATH
from . import debfile
from .allowlist import Allowlist
from .debian import DebVersion, Package, vulnerability_ids_between, installed
from .mirror import Get, download, packages_index
from .osv import Record, load_osv, matches
from .release import OsRelease, Suite, os_release, security_suite
from .report import Finding, ScanReport, Vulnerability

DPKG_STATUS = "/var/lib/dpkg/status"
OS_RELEASE = "/etc/os-release"
DOWNLOADS = 4  # .debs fetched at once
TRIES = 3  # .debs of one source tried for its changelog (a binary's doc folder may link another's)


class ImageFiles(Protocol):
    def read_file(self, image: str, path: str, *, platform: str | None = None) -> bytes | None: ...


class CannotScan(ImageBuilderError):
    """Exit 2: no verdict (the image cannot be read), not a finding."""

    exit_code = 2
    template = "{image}: cannot scan: {reason}"


@dataclass(frozen=True)
class ScanRequest:
    image: str
    allowlist: Allowlist = Allowlist()
    mirror: str | None = None
    osv: Path | None = None
    today: date = field(default_factory=date.today)


def _read(files: ImageFiles, image: str, path: str) -> bytes | None:
    try:
        return files.read_file(image, path)
    except CannotScan:
        raise
    except ImageBuilderError as e:  # the engine's: no such image, no daemon
        raise CannotScan(image=image, reason=str(e)) from e


@dataclass(frozen=True)
class _Fix:
    source: str
    installed: tuple[Package, ...]  # the image's binaries of the source that have a newer version
    offered: tuple[Package, ...]  # the index's binaries of the source at the fixed version, smallest first
    suite: Suite

    @property
    def installed_version(self) -> DebVersion:
        return min(p.source_version for p in self.installed)

    @property
    def fixed_version(self) -> DebVersion:
        return max(p.source_version for p in self.offered)


def _fixes(packages: list[Package], indexes: dict[str, tuple[Suite, dict[tuple[str, str], Package]]]) -> list[_Fix]:
    """The image's packages the security suites have newer, grouped by source package."""
    newer: dict[str, list[Package]] = {}
    where: dict[str, str] = {}  # source -> the key of the index that has its fix
    for package in packages:
        for key, (_, index) in indexes.items():
            candidate = index.get((package.name, package.arch))
            if candidate is not None:
                if package.version < candidate.version:
                    newer.setdefault(package.source, []).append(package)
                    where.setdefault(package.source, key)
                break
    fixes = []
    for source, binaries in sorted(newer.items()):
        suite, index = indexes[where[source]]
        fixed = max(index[(p.name, p.arch)].source_version for p in binaries if (p.name, p.arch) in index)
        offered = sorted((p for p in index.values() if p.source == source and p.source_version == fixed),
                         key=lambda p: (p.size, p.name))
        fixes.append(_Fix(source, tuple(binaries), tuple(offered), suite))
    return fixes


def _changelog(get: Get, fix: _Fix) -> str | None:
    for package in fix.offered[:TRIES]:
        text = debfile.changelog(download(get, fix.suite, package), package.filename,
                                 native=not package.source_version.revision)
        if text is not None:
            return text
    return None


def _changelogs(get: Get, fixes: list[_Fix], say: Callable[[str], None]) -> dict[str, str | None]:
    """Each fix's changelog, DOWNLOADS at a time, a line as each arrives. The downloads run on
    daemon threads: Ctrl-C (or a failed download) ends the scan at once, not after the others."""
    out: dict[str, str | None] = {}
    if not fixes:
        return out
    say(f"reading the changelogs of {len(fixes)} fixed source package(s) from their .debs")
    todo: queue.SimpleQueue[_Fix] = queue.SimpleQueue()
    for fix in fixes:
        todo.put(fix)
    done: queue.SimpleQueue[tuple[str, str | None | Exception]] = queue.SimpleQueue()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                fix = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((fix.source, _changelog(get, fix)))
            except Exception as e:  # noqa: BLE001 - handed to the scan's thread, which raises it
                done.put((fix.source, e))

    for n in range(min(DOWNLOADS, len(fixes))):
        threading.Thread(target=work, name=f"scan-deb-{n}", daemon=True).start()
    try:
        while len(out) < len(fixes):
            source, got = done.get()
            if isinstance(got, Exception):
                raise got
            out[source] = got
            say(f"  {len(out)}/{len(fixes)} {source}")
    finally:
        stop.set()
    return out


def _deb_findings(get: Get, fixes: list[_Fix], say: Callable[[str], None]) -> list[Finding]:
    changelogs = _changelogs(get, fixes, say)
    findings = []
    for fix in fixes:
        text = changelogs.get(fix.source)
        ids = vulnerability_ids_between(text, fix.installed_version, fix.fixed_version) if text is not None else ()
        note = ("" if ids else "its changelog names no CVE or GHSA id" if text is not None
                else f"no changelog in the first {TRIES} .debs of {fix.source}")
        findings.append(Finding("deb", fix.source, str(fix.installed_version), str(fix.fixed_version),
                                tuple(Vulnerability((cve,)) for cve in ids),
                                tuple(sorted({p.name for p in fix.installed})), note))
    return findings


def _python_packages(files: ImageFiles, image: str) -> list[tuple[str, str]] | None:
    """(name, version) of each Python distribution the image's SBOM lists; None without an SBOM."""
    data = _read(files, image, SBOM_PATH)
    if data is None:
        return None
    try:
        components = json.loads(data).get("components") or []
        return [(c["name"], c["version"]) for c in components
                if isinstance(c, dict) and str(c.get("purl", "")).startswith("pkg:pypi/")
                and isinstance(c.get("name"), str) and isinstance(c.get("version"), str)]
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise CannotScan(image=image, reason=f"its SBOM {SBOM_PATH} is not CycloneDX JSON ({e})") from e


def _python_findings(records: dict[str, list[Record]], packages: list[tuple[str, str]]) -> list[Finding]:
    findings = []
    for name, text in sorted(packages):
        try:
            version = Version(text)
        except ValueError:  # InvalidVersion, or a number too long for int()
            continue
        hits = matches(records, name, version)
        if hits:
            fixes = [m.fixed for m in hits if m.fixed is not None]
            findings.append(Finding("pypi", name, text, str(max(fixes)) if fixes else "-",
                                    tuple(Vulnerability((m.record.id, *m.record.aliases)) for m in hits),
                                    note="" if len(fixes) == len(hits) else "a record names no fixed version"))
    return findings


def _release(files: ImageFiles, image: str) -> OsRelease:
    data = _read(files, image, OS_RELEASE)
    return os_release(image, (data or b"").decode("utf-8", "replace"))


def scan_image(request: ScanRequest, files: ImageFiles, get: Get, say: Callable[[str], None]) -> ScanReport:
    """The image's fixable packages, each with the vulnerabilities its fix names."""
    records = None
    if request.osv is not None:  # before the image and the mirror: a wrong file is refused at once
        say(f"reading OSV records from {request.osv}")
        records = load_osv(request.osv)
    release = _release(files, request.image)
    status = _read(files, request.image, DPKG_STATUS)
    if status is None:
        raise CannotScan(image=request.image, reason=f"it has no {DPKG_STATUS}")
    packages = installed(status.decode("utf-8", "replace"))
    arches = sorted({p.arch for p in packages} - {"all", ""})
    indexes = {}
    for arch in arches:
        suite = security_suite(release, arch, request.mirror)
        say(f"reading the Packages index of {suite}")
        indexes[suite.suite + "/" + arch] = (suite, packages_index(get, suite))
    # An Architecture: all package is in every architecture's index: _fixes takes the first that has it.
    findings = _deb_findings(get, _fixes(packages, indexes), say)
    sources = [f"{suite.suite}/{suite.component} ({', '.join(arches)}) at {suite.base}"
               for suite, _ in list(indexes.values())[:1]]
    notes = []
    checked = len(packages)
    if records is not None:
        python = _python_packages(files, request.image)
        if python is None:
            notes.append(f"note: no SBOM at {SBOM_PATH}: the image's Python packages were not checked against {request.osv}")
        else:
            findings += _python_findings(records, python)
            checked += len(python)
            sources.append(f"OSV records in {request.osv}")
    return ScanReport(request.image, release.pretty_name, tuple(sources), checked, tuple(findings),
                      request.allowlist, request.today, tuple(notes))
