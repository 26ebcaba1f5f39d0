"""The CI's shell scripts (.ci/) parse, and shellcheck finds nothing at warning level or above:
setup runs before every test, so a script error there costs a whole CI run. shellcheck is a
Debian package that .ci/setup installs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parent.parent / ".ci"
# The files under .ci/ that are not shell, each with what it is: anything else must be a script.
NOT_SHELL = {"stargz-grpc/main.go": "Go, built by stargz-install.sh"}


def _is_shell(path: Path) -> bool:
    """A shell script by its name (*.sh) or its first line (a bash or sh shebang, as setup and run have)."""
    with path.open("rb") as f:
        first = f.readline()
    return path.suffix == ".sh" or (first.startswith(b"#!") and (b"bash" in first or first.rstrip().endswith(b"/sh")))


FILES = sorted(p for p in CI.rglob("*") if p.is_file())
SCRIPTS = [p for p in FILES if _is_shell(p)]


def test_the_ci_has_its_scripts():
    assert {p.name for p in SCRIPTS} >= {"setup", "run", "docker-up.sh", "stargz-install.sh", "registry.sh"}


def test_every_file_under_ci_is_a_checked_script_or_a_listed_other():
    """Every script in .ci/ (by name or shebang, at any depth) is parsed and shellchecked below; a
    file that is not shell is listed, so a new script cannot escape the checks unnoticed."""
    others = {p.relative_to(CI).as_posix() for p in FILES if p not in SCRIPTS}
    assert others == set(NOT_SHELL), others


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
