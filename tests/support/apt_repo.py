"""A Debian or Ubuntu package mirror made in the test: .debs built with dpkg-deb (each carrying a
changelog.Debian.gz), a suite's Packages index, served by http.server on a thread; and an
image's files (os-release, dpkg status) as plain data, for `scan` to read without an engine."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import lzma
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from support.unavailable import _unavailable



def debian_release(codename: str = "bookworm") -> str:
    """/etc/os-release of a Debian 12 (whose codename the test may rename: a suite per test)."""
    return (f'PRETTY_NAME="Debian GNU/Linux 12 ({codename})"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\n'
            f'VERSION_CODENAME={codename}\nID=debian\n')


UBUNTU_24 = 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n' \
            'ID=ubuntu\nID_LIKE=debian\nUBUNTU_CODENAME=noble\n'


def dpkg_deb() -> str:
    program = shutil.which("dpkg-deb")
    if program is None:
        _unavailable("dpkg-deb is missing (apt-get install dpkg)")
    assert program is not None  # (_unavailable does not return)
    return program


@dataclass(frozen=True)
class Deb:
    package: str
    version: str
    source: str
    arch: str
    filename: str  # in the pool, relative to the mirror's root
    size: int
    sha256: str
    depends: str = ""

    def paragraph(self) -> str:
        source = self.source if self.source != self.package else ""
        return (f"Package: {self.package}\n" + (f"Source: {source}\n" if source else "")
                + f"Version: {self.version}\nArchitecture: {self.arch}\nMaintainer: Tester <t@example.org>\n"
                + (f"Depends: {self.depends}\n" if self.depends else "")
                + f"Description: {self.package} for the tests\nFilename: {self.filename}\nSize: {self.size}\n"
                f"SHA256: {self.sha256}\n")


def changelog_text(source: str, entries: list[tuple[str, str]], dist: str = "bookworm-security") -> str:
    """A Debian changelog of (version, text) entries, newest first."""
    return "".join(f"{source} ({version}) {dist}; urgency=medium\n\n  * {text}\n\n"
                   f" -- Tester <t@example.org>  Sun, 06 Dec 2026 00:00:00 +0000\n\n" for version, text in entries)


@dataclass
class AptRepo:
    """A mirror's tree under `root`: pool/ with the .debs, dists/SUITE/main/binary-ARCH/Packages.xz."""

    root: Path
    debs: list[Deb] = field(default_factory=list)

    def add(self, package: str, version: str, *, source: str | None = None, arch: str = "amd64",
            changelog: str | None = None, native: bool = False, compression: str = "xz",
            padding: int = 0, depends: str = "") -> Deb:
        """Build PACKAGE_VERSION_ARCH.deb with dpkg-deb; `changelog` (None: no doc folder, as a
        package whose doc links another's) as changelog.Debian.gz (native: changelog.gz)."""
        source = source or package
        tree = self.root / "build" / f"{package}_{version}_{arch}"
        (tree / "DEBIAN").mkdir(parents=True)
        (tree / "DEBIAN" / "control").write_text(
            f"Package: {package}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: Tester <t@example.org>\n"
            + (f"Source: {source}\n" if source != package else "") + (f"Depends: {depends}\n" if depends else "")
            + f"Description: {package} for the tests\n")
        if changelog is not None:
            doc = tree / "usr" / "share" / "doc" / package
            doc.mkdir(parents=True)
            (doc / ("changelog.gz" if native else "changelog.Debian.gz")).write_bytes(
                gzip.compress(changelog.encode(), mtime=0))
        if padding:  # a bigger .deb, so the scan tries the smaller one first
            (tree / "usr" / "lib").mkdir(parents=True, exist_ok=True)
            (tree / "usr" / "lib" / f"{package}.bin").write_bytes(hashlib.sha256(package.encode()).digest() * padding)
        filename = f"pool/updates/main/{source[0]}/{source}/{package}_{version.split(':')[-1]}_{arch}.deb"
        out = self.root / filename
        out.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([dpkg_deb(), f"-Z{compression}", "--root-owner-group", "--build", str(tree), str(out)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        data = out.read_bytes()
        deb = Deb(package, version, source, arch, filename, len(data), hashlib.sha256(data).hexdigest(), depends)
        self.debs.append(deb)
        return deb

    def publish(self, suite: str, debs: list[Deb] | None = None, arch: str = "amd64", *,
                release: bool = False) -> None:
        """Write the suite's Packages.xz over `debs` (default: every one added) for `arch`; with
        `release`, the suite's Release file naming its SHA256, as a real archive has one."""
        chosen = self.debs if debs is None else debs
        text = "\n".join(d.paragraph() for d in chosen if d.arch in (arch, "all"))
        folder = self.root / "dists" / suite / "main" / f"binary-{arch}"
        folder.mkdir(parents=True, exist_ok=True)
        data = lzma.compress(text.encode())
        (folder / "Packages.xz").write_bytes(data)
        if release:
            (self.root / "dists" / suite / "Release").write_text(
                f"Origin: Tests\nSuite: {suite}\nArchitectures: {arch}\nComponents: main\nSHA256:\n"
                f" {hashlib.sha256(data).hexdigest()} {len(data)} main/binary-{arch}/Packages.xz\n"
                f" {'0' * 64} 0 main/binary-{arch}/Release\n")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def served(root: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """http://HOST:PORT serving `root`, on a thread, until the block ends."""
    server = http.server.ThreadingHTTPServer((host, 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="served", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def dpkg_status(packages: list[tuple[str, str, str, str]]) -> str:
    """A dpkg status file of (package, version, source, arch), each installed."""
    return "\n".join(
        f"Package: {name}\nStatus: install ok installed\nPriority: optional\nArchitecture: {arch}\n"
        + (f"Source: {source}\n" if source and source != name else "")
        + f"Version: {version}\nDescription: {name}\n multi-line description\n .\n more\n"
        for name, version, source, arch in packages)


class ImageFiles:
    """An image's files as data: what `scan` reads through the engine, with no engine."""

    def __init__(self, image: str, files: dict[str, bytes]) -> None:
        self.image = image
        self.files = files
        self.read: list[str] = []
        self.platforms: list[str | None] = []  # the platform each read_file asked for

    def os_release(self, image: str) -> str:
        """As the engine's: the image's /etc/os-release text."""
        return (self.read_file(image, "/etc/os-release") or b"").decode()

    def read_file(self, image: str, path: str, *, platform: str | None = None) -> bytes | None:
        assert image == self.image, image
        self.read.append(path)
        self.platforms.append(platform)
        return self.files.get(path)


def debian_image(image: str, os_release: str, packages: list[tuple[str, str, str, str]],
                 extra: dict[str, bytes] | None = None) -> ImageFiles:
    return ImageFiles(image, {"/etc/os-release": os_release.encode(),
                              "/var/lib/dpkg/status": dpkg_status(packages).encode(), **(extra or {})})
