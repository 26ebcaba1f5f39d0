"""Child processes that run this very copy of smoke_tests (per-GPU work, NCCL workers).

Work that creates CUDA contexts runs in children: a context this process kept would lock
the NCCL workers out of GPUs in exclusive-process compute mode, and a child can be killed
at its deadline where a thread cannot.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

RESULT_PREFIX = "SMOKE_TESTS_RESULT "


def package_parent() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    # Children must import this very copy of smoke_tests, wherever it lives.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent(), env.get("PYTHONPATH")) if p)
    return env


def module_command(module: str, args: Sequence[str] = ()) -> List[str]:
    return [sys.executable, "-m", module, *args]


@dataclass(frozen=True)
class Finished:
    stdout: str
    stderr: str
    returncode: Optional[int]  # None: killed at the deadline

    def last_error_line(self) -> str:
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else "(no output)"

    def result_line(self) -> Optional[str]:
        """The JSON the child printed after RESULT_PREFIX, if it got that far."""
        for line in self.stdout.splitlines():
            if line.startswith(RESULT_PREFIX):
                return line[len(RESULT_PREFIX):]
        return None


def run_module(module: str, args: Sequence[str], timeout: float) -> Finished:
    """Run `python -m module args` to completion, killed at timeout."""
    process = subprocess.Popen(
        module_command(module, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        errors="replace", env=child_env(),
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        return Finished(stdout, stderr, None)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return Finished(stdout, stderr, process.returncode)
