"""The CI's shell scripts (.ci/) parse, shellcheck finds nothing at warning level or above, and
every function declares what it assigns `local`: setup runs before every test, so a script error
there costs a whole CI run. shellcheck is a Debian package that .ci/setup installs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from support.bash_locals import undeclared

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


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_function_declares_what_it_assigns_local(script):
    """bash's scoping is dynamic: a function's undeclared assignment lands in its caller's local of
    that name (issue 52: `answers` set `status` inside `step`'s, and a fresh machine's setup
    stopped). Only the script's own globals, assigned at its top level, are exempt."""
    assert undeclared(script.read_text()) == {}


# issue 52's bug, in small: `answers` sets its caller's `status`.
STEP_AND_ANSWERS = """
step() { local name=$1; shift; local status=0; "$@" || status=$?; [ "$status" -eq 0 ] || exit 1; }
answers() {
    local out
    out=$(ctr snapshots ls 2>&1) && status=0 || status=$?
    [ "$status" -eq 0 ] || echo "$out" | grep -q "bucket does not exist"
}
step "check that the built daemon answers" answers
"""


def test_the_local_check_finds_issue_52s_status_and_passes_its_fix():
    assert undeclared(STEP_AND_ANSWERS) == {"answers": ["status"]}
    assert undeclared(STEP_AND_ANSWERS.replace("local out", "local out status")) == {}


@pytest.mark.parametrize(("body", "names"), [
    ("n=1; m+=x; a[1]=y", ["a", "m", "n"]),
    ("IFS=, read -r a b <<< \"$x\"", ["a", "b"]),
    ("mapfile -t lines < <(ls | sort)", ["lines"]),
    ("for i in 1 2; do :; done; while getopts ab: opt; do :; done", ["i", "opt"]),
    ("printf -v out %s 1; (( n += 1 )); ((m++)); (( k == 1 ))", ["m", "n", "out"]),
    # Not assignments: a command's environment, quoted or commented text, a here-document, `_`.
    ("LC_ALL=C sort; echo 'a=1' \"b=2\"  # c=3\ncat <<EOF\nd=4\nEOF\nfor _ in 1; do :; done", []),
    ("local a=1 b; declare -A c; local -a d; a=2 b=3 c[x]=4 d+=(5)", []),
    ("g=1; pids+=($!)", []),  # the script's globals
], ids=["plain", "read", "mapfile", "for-getopts", "printf-arithmetic", "not-assignments", "declared",
        "globals"])
def test_the_local_check_reads_every_kind_of_assignment(body, names):
    script = f"g=0\npids=()\nf() {{\n{body}\n}}\n"
    assert undeclared(script) == ({"f": names} if names else {})

