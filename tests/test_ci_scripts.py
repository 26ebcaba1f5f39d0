"""The CI's shell scripts (.ci/) parse, and shellcheck finds nothing at warning level or above:
setup runs before every test, so a script error there costs a whole CI run. shellcheck is a
Debian package that .ci/setup installs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parent.parent / ".ci"
SCRIPTS = sorted([*CI.glob("*.sh"), CI / "setup", CI / "run"])


def test_the_ci_has_its_scripts():
    assert {p.name for p in SCRIPTS} >= {"setup", "run", "docker-up.sh", "stargz-install.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_ci_script_parses(script):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_shellcheck_finds_no_warning_in_the_ci_scripts():
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: apt-get install shellcheck (.ci/setup installs it)"
    done = subprocess.run([shellcheck, "--severity=warning", *map(str, SCRIPTS)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-4000:]
