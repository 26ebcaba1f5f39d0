"""Pure: the image's OS step takes its packages from the OS's security suite too (issue 56).

For that RUN only, apt's sources get the security suite (at --security-mirror, or the OS's own);
the base's packages that the suite has fixed are upgraded (`--only-upgrade`, by name), the
packages the step installs come at their newest, fixed, versions anyway; and the step checks
that every fixed package the image holds has at least the version the plan found (scan/fixes.py).
The list is in the Dockerfile, so in the inputs hash: a new fix that reaches the image changes
it, a night without one does not.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ..matrix.resolve import BuildSpec
from ..platforms import DEFAULT_PLATFORM
from ..scan.fixes import Fixes, fixes_for
from ..scan.release import COMPONENT, security_base
from .platforms import arch
from .render_options import Target

SOURCES_FILE = "/etc/apt/sources.list.d/imagebuilder-security.list"
# The suite by the image's own codename: Ubuntu (and its derivatives) name theirs in UBUNTU_CODENAME.
_SUITE = '$(. /etc/os-release && echo "${UBUNTU_CODENAME:-$VERSION_CODENAME}")-security'


@dataclass(frozen=True)
class SecurityStep:
    mirror: str
    add_source: str  # the shell command that adds the suite to apt's sources
    sources_file: str
    upgrades: tuple[str, ...]  # the base's packages to upgrade from the suite
    check: str | None  # the shell loop that refuses a fixed package below its fixed version
    fixes: Fixes


def _check(expected: Sequence[tuple[str, str]]) -> str | None:
    if not expected:
        return None
    listed = " ".join(shlex.quote(f"{name}={version}") for name, version in expected)
    return (f"for fixed in {listed}; do"
            " have=$(dpkg-query -W -f='${db:Status-Status} ${Version}' \"${fixed%%=*}\" 2>/dev/null || true);"
            " [ \"${have%% *}\" != installed ] || dpkg --compare-versions \"${have#* }\" ge \"${fixed#*=}\""
            " || { echo \"${fixed%%=*} ${have#* } lacks the security fix ${fixed#*=}\" >&2; exit 1; }; done")


def fixes_label(expected: Sequence[tuple[str, str]]) -> str:
    """The fixes as the image's label carries them (labels.SECURITY_FIXES): name=version, space-separated."""
    return " ".join(f"{name}={version}" for name, version in expected)


def security_step(spec: BuildSpec, target: Target, security_mirror: str | None,
                  packages: Sequence[str]) -> SecurityStep:
    """The security suite's part of the image's apt RUN (at `security_mirror`; None: the OS's own);
    the fixes are those target.os_states found for its base (none where nothing was read: `render`)."""
    mirror = security_base(spec.os.family, arch(target.platform or DEFAULT_PLATFORM), security_mirror)
    state = target.os_states.get(spec.base_image)
    fixes = fixes_for(state, packages) if state is not None else Fixes()
    return SecurityStep(mirror, f'echo "deb {mirror} {_SUITE} {COMPONENT}" > {SOURCES_FILE}', SOURCES_FILE,
                        fixes.upgrades, _check(fixes.expected), fixes)
