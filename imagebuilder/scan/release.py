"""Pure: which OS an image is (its /etc/os-release) and where that OS publishes its security fixes.

Debian: `CODENAME-security` (`CODENAME/updates` before bullseye) at the security mirror; Ubuntu:
`CODENAME-security` at its archive (ports.ubuntu.com for architectures other than amd64 and i386).
The mirror is the user's to choose (--mirror, IMAGEBUILDER_SECURITY_MIRROR) for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadRequest

DEBIAN_SECURITY = "http://deb.debian.org/debian-security"
UBUNTU_ARCHIVE = "http://archive.ubuntu.com/ubuntu"
UBUNTU_PORTS = "http://ports.ubuntu.com/ubuntu-ports"
UBUNTU_ARCHIVE_ARCHES = frozenset({"amd64", "i386"})
DEBIAN_OLD_SUITES = frozenset({"squeeze", "wheezy", "jessie", "stretch", "buster"})  # CODENAME/updates
COMPONENT = "main"


class NotDebian(BadRequest):
    template = "{image}: {reason}; scan reads Debian and Ubuntu images (their /etc/os-release and dpkg status)"


@dataclass(frozen=True)
class OsRelease:
    id: str
    codename: str
    pretty_name: str
    id_like: tuple[str, ...] = ()

    @property
    def family(self) -> str:
        """debian or ubuntu (an Ubuntu derivative is ubuntu, any other Debian derivative debian)."""
        return "ubuntu" if "ubuntu" in (self.id, *self.id_like) else "debian"


def parse_os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            out[key.strip()] = value.strip().strip("'\"")
    return out


def os_release(image: str, text: str) -> OsRelease:
    """The image's OS, refused unless it is Debian or Ubuntu (or says it is like one) with a codename."""
    fields = parse_os_release(text)
    if not fields:
        raise NotDebian(image=image, reason="it has no /etc/os-release")
    os_id, like = fields.get("ID", "").lower(), tuple(fields.get("ID_LIKE", "").lower().split())
    if os_id not in ("debian", "ubuntu") and not {"debian", "ubuntu"} & set(like):
        raise NotDebian(image=image, reason=f"its OS is {fields.get('PRETTY_NAME') or os_id or 'unnamed'}")
    # An Ubuntu derivative (Mint: VERSION_CODENAME=wilma) names the Ubuntu it is built on in UBUNTU_CODENAME.
    is_ubuntu = "ubuntu" in (os_id, *like)
    codename = (fields.get("UBUNTU_CODENAME") if is_ubuntu else None) or fields.get("VERSION_CODENAME") or ""
    if not codename:
        raise NotDebian(image=image, reason=f"its /etc/os-release names no VERSION_CODENAME ("
                                            f"{fields.get('PRETTY_NAME', os_id)}: a testing or unstable "
                                            "Debian has no security suite)")
    return OsRelease(os_id, codename, fields.get("PRETTY_NAME", f"{os_id} {codename}"), like)


@dataclass(frozen=True)
class Suite:
    """One Packages index: BASE/dists/SUITE/COMPONENT/binary-ARCH/Packages(.xz|.gz)."""

    base: str
    suite: str
    component: str
    arch: str

    @property
    def index(self) -> str:
        return f"{self.base}/dists/{self.suite}/{self.component}/binary-{self.arch}/Packages"

    def pool(self, filename: str) -> str:
        return f"{self.base}/{filename}"

    def __str__(self) -> str:
        return f"{self.suite}/{self.component} {self.arch} at {self.base}"


def security_base(family: str, arch: str, mirror: str | None = None) -> str:
    """The URL of the mirror that carries the OS family's security suite for `arch`."""
    if mirror:
        return mirror.rstrip("/")
    if family == "ubuntu":
        return UBUNTU_ARCHIVE if arch in UBUNTU_ARCHIVE_ARCHES else UBUNTU_PORTS
    return DEBIAN_SECURITY


def security_suite(release: OsRelease, arch: str, mirror: str | None = None) -> Suite:
    base = security_base(release.family, arch, mirror)
    if release.family == "ubuntu":
        return Suite(base, f"{release.codename}-security", COMPONENT, arch)
    name = f"{release.codename}/updates" if release.codename in DEBIAN_OLD_SUITES else f"{release.codename}-security"
    return Suite(base, name, COMPONENT, arch)
