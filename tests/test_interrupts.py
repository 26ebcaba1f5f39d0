"""Ctrl-C as the CLI takes it (imagebuilder/interrupts.py), with real signals to a real process:
the first runs the clean-up, a second one pressed during a slow clean-up exits at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.real_images import REPO_ROOT

# main() as cli.py runs it, around a command whose clean-up takes a minute (a daemon that is
# slow to remove a container): the first Ctrl-C starts it, the second must not wait for it.
SLOW_CLEAN_UP = """
import sys, time
from pathlib import Path
from imagebuilder import interrupts
interrupts.install()
marker = Path(sys.argv[1])
try:
    marker.write_text("working")
    time.sleep(60)
finally:
    marker.write_text("cleaning")
    time.sleep(60)
"""


def _wait_for(marker: Path, text: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while not (marker.is_file() and marker.read_text() == text):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)


def _start(marker: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SLOW_CLEAN_UP, str(marker)], cwd=REPO_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def test_a_second_ctrl_c_during_the_clean_up_exits_at_once_with_130(tmp_path: Path) -> None:
    marker = tmp_path / "state"
    process = _start(marker)
    try:
        _wait_for(marker, "working", process)
        os.killpg(process.pid, signal.SIGINT)  # as a terminal sends it: to the process group
        _wait_for(marker, "cleaning", process)
        pressed = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=10)
        assert time.monotonic() - pressed < 5
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130 and err == "interrupted\n" and out == "", (out, err)


def test_the_first_sigterm_runs_the_clean_up(tmp_path: Path) -> None:
    marker = tmp_path / "state"
    process = _start(marker)
    try:
        _wait_for(marker, "working", process)
        process.send_signal(signal.SIGTERM)  # what a CI timeout sends: handled as Ctrl-C
        _wait_for(marker, "cleaning", process)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# A command whose work is meant to outlive it (a lazy mount) settles, then exits: a Ctrl-C while
# the interpreter shuts down must change nothing. Python puts its own handlers back to the
# default during shutdown, so only a signal the OS ignores survives that window.
SETTLED_EXIT = """
import atexit, signal, sys, time
from pathlib import Path
from imagebuilder import interrupts
interrupts.install()
marker = Path(sys.argv[1])
interrupts.settle()
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
atexit.register(lambda: (marker.write_text("exiting"), time.sleep(1)))
"""


def test_a_ctrl_c_after_settle_while_the_interpreter_exits_leaves_exit_0(tmp_path: Path) -> None:
    marker = tmp_path / "state"
    process = subprocess.Popen([sys.executable, "-c", SETTLED_EXIT, str(marker)], cwd=REPO_ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        _wait_for(marker, "exiting", process)
        os.killpg(process.pid, signal.SIGINT)
        os.killpg(process.pid, signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0 and err == "", (process.returncode, err)
