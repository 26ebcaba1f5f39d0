"""The one platform table: each platform imagebuilder builds for, with its names in every
vocabulary that needs one (docker's os/arch and arch, the kernel's machine, the wheels' tags).
Pure data; every package reads platforms from here (matrix.yaml's `platforms`, locks, the
package index's wheel tags, `--platform`, the -ARCH tag suffix)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The manylinux tags a glibc-2.35 host (ubuntu22.04, the oldest OS we build) accepts.
_GLIBC = range(17, 36)


@dataclass(frozen=True)
class Platform:
    name: str
    """docker's os/arch: linux/amd64."""
    machine: str
    """The kernel's (uname -m) and the wheels' name: x86_64."""
    aliases: tuple[str, ...]
    """Other names a host's machine goes by (platform.machine(), lowercased)."""
    wheel_tags: tuple[str, ...]
    """The manylinux tags pip accepts for it."""

    @property
    def arch(self) -> str:
        """docker's arch, the suffix of a platform image's tags: amd64."""
        return self.name.rpartition("/")[2]

    @property
    def uv_platform(self) -> str:
        """uv's --python-platform: every OS of the matrix has glibc >= 2.35, and torch's own wheels
        need 2.28 (2.9+) or less."""
        return f"{self.machine}-manylinux_2_28"


AMD64 = Platform("linux/amd64", "x86_64", ("amd64",),
                 ("manylinux1_x86_64", "manylinux2014_x86_64", *(f"manylinux_2_{n}_x86_64" for n in _GLIBC)))
ARM64 = Platform("linux/arm64", "aarch64", ("arm64",),
                 ("manylinux2014_aarch64", *(f"manylinux_2_{n}_aarch64" for n in _GLIBC)))

PLATFORMS: Mapping[str, Platform] = {p.name: p for p in (AMD64, ARM64)}
DEFAULT_PLATFORM = AMD64.name
"""Where a platform is not said: matrix.yaml's releases, locks without a suffix, an index's image."""


def platform_of_arch(arch: str) -> Platform | None:
    """docker's arch (amd64, arm64: Debian's names too) -> its platform; None: not one we build for."""
    return next((p for p in PLATFORMS.values() if p.arch == arch), None)


def platform_of_machine(machine: str) -> str | None:
    """A host's machine (x86_64, arm64, ...) -> its platform's name; None: not one we build for."""
    machine = machine.lower()
    return next((p.name for p in PLATFORMS.values() if machine == p.machine or machine in p.aliases), None)
