"""Find the C++ compiler torch.compile will use, the way Inductor looks for it."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional

NO_COMPILER = "no C++ compiler on PATH: torch.compile (Inductor) cannot build kernels; install g++"

# Inductor uses $CXX when set, else g++ (clang++ on macOS); c++ and clang++ cover
# images whose only compiler goes by another name.
CANDIDATES = ("g++", "c++", "clang++")


@dataclass(frozen=True)
class Compiler:
    path: str
    version: str  # first line of `--version`


@dataclass(frozen=True)
class CompilerProblem:
    reason: str


def find_cxx(env: Optional[Mapping[str, str]] = None) -> "Compiler | CompilerProblem":
    """The compiler Inductor would run, proven by running it with --version."""
    env = os.environ if env is None else env
    search_path = env.get("PATH", "")
    cxx = env.get("CXX", "").strip()
    if cxx:
        # CXX may carry flags ("ccache g++"); the first word is what must exist.
        program = shlex.split(cxx)[0]
        found = shutil.which(program, path=search_path)
        if found is None:
            return CompilerProblem(f"CXX={cxx!r} is not on PATH: torch.compile (Inductor) cannot build kernels")
        return _run_version(found)
    for name in CANDIDATES:
        found = shutil.which(name, path=search_path)
        if found is not None:
            return _run_version(found)
    return CompilerProblem(NO_COMPILER)


def _run_version(path: str) -> "Compiler | CompilerProblem":
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return CompilerProblem(f"C++ compiler {path} does not run: {e}")
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return CompilerProblem(f"C++ compiler {path} --version exited {done.returncode}: {last[0]}")
    first = (done.stdout.strip().splitlines() or [""])[0]
    return Compiler(path, first)
