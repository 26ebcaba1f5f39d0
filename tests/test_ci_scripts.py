"""The CI's shell scripts (.ci/) parse, shellcheck finds nothing at warning level or above, and
every function declares what it assigns `local`: setup runs before every test, so a script error
there costs a whole CI run. shellcheck is a Debian package that .ci/setup --tests installs.

The paths that only a new machine takes (a missing binary or stamp) run here too, into temp paths
beside what this machine has installed: CI's machines have taken them already, so nothing else
would run them before a new user does."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from support.bash_locals import undeclared
from support.registry import REGISTRY_BIN
from support.unavailable import _unavailable

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
    assert shellcheck, "shellcheck is missing: apt-get install shellcheck (.ci/setup --tests installs it)"
    done = subprocess.run([shellcheck, "--severity=warning", *map(str, SCRIPTS)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-4000:]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_function_declares_what_it_assigns_local(script):
    """bash's scoping is dynamic: a function's undeclared assignment lands in its caller's local of
    that name (issue 52: `answers` set `status` inside `step`'s, and a fresh machine's setup
    stopped). Only the script's own globals, assigned at its top level, are exempt."""
    assert undeclared(script.read_text()) == {}


@pytest.mark.parametrize("args", [["--test"], ["--tests", "extra"]], ids=["unknown", "two"])
def test_setup_refuses_bad_arguments_in_one_line_before_any_work(args):
    done = subprocess.run(["bash", str(CI / "setup"), *args], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done
    assert "usage:" in done.stderr and "[--tests]" in done.stderr


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


def _root_with(*tools: str) -> None:
    """A first install runs as root (apt) with the tools .ci/setup --tests installs; else _unavailable."""
    if os.geteuid() != 0:
        _unavailable("a first install runs apt: needs root")
    if missing := [tool for tool in tools if shutil.which(tool) is None]:
        _unavailable(f"{', '.join(missing)} missing: .ci/setup --tests installs them")


def _ci_script(name: str, *args: str, env: dict[str, str] | None = None,
               timeout: int) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", str(CI / name), *args], env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _answers(daemon: Path, where: Path) -> str:
    """What ctr reads from DAEMON's snapshots API on a socket of its own (an empty snapshotter
    answers with its own error, "bucket does not exist")."""
    sock = where / "s.sock"
    running = subprocess.Popen([str(daemon), "-address", str(sock), "-root", str(where / "root")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        done = subprocess.run(["ctr", "-a", str(sock), "snapshots", "--snapshotter", "stargz", "ls"],
                              capture_output=True, text=True, timeout=20)
        return f"exit {done.returncode}: {done.stdout}{done.stderr}"
    finally:
        running.kill()
        running.wait(timeout=10)


INSTALLED_STARGZ = Path("/usr/local/bin/containerd-stargz-grpc")


@pytest.mark.network
@pytest.mark.slow
def test_the_stargz_snapshotters_first_install_builds_a_daemon_that_answers(tmp_path):
    """The branch only a fresh machine takes (issue 52: its last step failed there, and CI never
    ran it): the Go sources' download, the build and the check that the daemon answers, into a
    temp binary and stamp, beside the installed daemon that other tests use; then a second run
    finds it built. 1-3 minutes: apt downloads ~240 -dev packages, then go build compiles them."""
    _root_with("go", "ctr", "apt-get")
    daemon, stamp = tmp_path / "bin" / "containerd-stargz-grpc", tmp_path / "stamp" / "stargz.sha256"
    env = {"STARGZ_BIN": str(daemon), "STARGZ_STAMP": str(stamp)}
    installed = INSTALLED_STARGZ.stat().st_mtime_ns if INSTALLED_STARGZ.exists() else None
    first = _ci_script("stargz-install.sh", env=env, timeout=900)
    assert f"installed {daemon}" in first.stdout
    assert len(stamp.read_text().strip()) == 64
    (tmp_path / "check").mkdir()
    answer = _answers(daemon, tmp_path / "check")
    assert answer.startswith("exit 0") or "bucket does not exist" in answer, answer
    again = _ci_script("stargz-install.sh", env=env, timeout=120)
    assert f"{daemon} already built from" in again.stdout and "it answers" in again.stdout
    assert (INSTALLED_STARGZ.stat().st_mtime_ns if INSTALLED_STARGZ.exists() else None) == installed


@pytest.mark.network
def test_docker_20_10_is_unpacked_into_an_empty_dir_and_kept_there(tmp_path):
    """docker-20.10.sh's download and unpack (a fresh machine's path; ~15 s), into a temp DIR
    beside the one tests/test_dual_compression.py uses; a second run keeps it."""
    if missing := [tool for tool in ("apt-get", "dpkg") if shutil.which(tool) is None]:
        _unavailable(f"{', '.join(missing)} missing: docker-20.10.sh unpacks Debian's package")
    dockerd = tmp_path / "docker-20.10" / "usr" / "sbin" / "dockerd"
    first = _ci_script("docker-20.10.sh", str(tmp_path / "docker-20.10"), timeout=600)
    assert first.stdout.splitlines()[-1] == str(dockerd) and "unpacked docker.io_20.10" in first.stderr
    version = subprocess.run([str(dockerd), "--version"], capture_output=True, text=True, timeout=30)
    assert version.stdout.startswith("Docker version 20.10."), version
    again = _ci_script("docker-20.10.sh", str(tmp_path / "docker-20.10"), timeout=60)
    assert (again.stdout, again.stderr) == (f"{dockerd}\n", "")


@pytest.mark.docker
def test_a_ca_base_image_is_derived_once_with_the_site_ca_in_it(base_image, image_repo, tmp_path):
    """ca-base-image.sh's build of a missing image (a fresh machine's path; seconds), under this
    test's own repository (removed after), then its second run does nothing."""
    ca = tmp_path / "site-ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot checked by the script\n-----END CERTIFICATE-----\n")
    image = f"{image_repo}:ca"
    first = _ci_script("ca-base-image.sh", image, base_image, str(ca), timeout=300)
    assert f"created {image} from {base_image}" in first.stdout
    copied = subprocess.run(["docker", "run", "--rm", image, "cat", "/usr/local/share/ca-certificates/site-ca.crt"],
                            capture_output=True, text=True, timeout=120)
    assert copied.stdout == ca.read_text(), copied.stderr
    again = _ci_script("ca-base-image.sh", image, base_image, str(ca), timeout=60)
    assert f"{image} already exists; nothing to do" in again.stdout


@pytest.mark.registry
def test_registry_sh_starts_a_registry_in_a_new_state_dir_and_stops_it(tmp_path, free_port):
    """registry.sh's start with no state yet (a new machine's, or a stopped one's; seconds), its
    state under a temp TMPDIR on a free port: it answers, a second start finds it, stop removes it.
    Its install of docker-registry is not run here: the machine has it."""
    if not REGISTRY_BIN.exists() or shutil.which("curl") is None:
        _unavailable(f"{REGISTRY_BIN} or curl is missing: .ci/setup --tests installs them")
    env, address = {"TMPDIR": str(tmp_path)}, f"127.0.0.1:{free_port}"
    started = _ci_script("registry.sh", "start", str(free_port), env=env, timeout=60)
    try:
        assert started.stdout.splitlines()[-1] == address
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=10) as answer:
            assert answer.status == 200
        again = _ci_script("registry.sh", "start", str(free_port), env=env, timeout=30)
        assert f"already running on {address}" in again.stderr
    finally:
        _ci_script("registry.sh", "stop", str(free_port), env=env, timeout=30)
    assert not (tmp_path / f"imagebuilder-registry-{free_port}").exists()
