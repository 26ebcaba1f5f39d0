"""Every documented bad input, run as a user would: `python tests/battery.py`.

The commands are the table under "## The battery" in docs/exit-codes.md, so the page and this
run cannot drift apart. Each runs in an empty folder of its own, with DOCKER_HOST pointing at no
daemon (unless the line sets it) and a HOME outside that folder (`{data}` in a line is the
suite's tests/data), and must:
exit with the documented code, print exactly one `error:` line and no traceback, print nothing
on stdout, and leave its folder empty. Exit 0 when every line did; else 1, naming each failure.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC = REPO_ROOT / "docs" / "exit-codes.md"
NO_DAEMON = "unix:///nonexistent/docker.sock"
ROW = re.compile(r"^\| (\d+) \| `(.+)` \|$")
TIMEOUT_S = 120


@dataclass(frozen=True)
class Case:
    code: int
    command: str


def documented_cases(doc: Path = DOC) -> list[Case]:
    """The lines of the table under "## The battery"."""
    text = doc.read_text(encoding="utf-8")
    section = text.split("## The battery", 1)[1].split("\n## ", 1)[0]
    return [Case(int(m.group(1)), m.group(2)) for line in section.splitlines() if (m := ROW.match(line.strip()))]


def run_case(case: Case) -> str | None:
    """None when the command behaved as documented, else why not."""
    words = shlex.split(case.command.replace("{data}", str(REPO_ROOT / "tests" / "data")))
    env = {**os.environ, "DOCKER_HOST": NO_DAEMON, "PYTHONPATH": str(REPO_ROOT)}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[0] == "imagebuilder", case.command
    with tempfile.TemporaryDirectory(prefix="battery-") as scratch, \
            tempfile.TemporaryDirectory(prefix="battery-home-") as home:
        env["HOME"] = home
        try:
            done = subprocess.run([sys.executable, "-m", "imagebuilder", *words[1:]], cwd=scratch, env=env,
                                  capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"did not finish within {TIMEOUT_S} s"
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        left = sorted(os.listdir(scratch))
    if "Traceback" in done.stderr or "Traceback" in done.stdout:
        return "printed a traceback: " + done.stderr.strip().splitlines()[-1]
    if done.returncode != case.code:
        return f"exit {done.returncode}, not {case.code}: {done.stderr.strip()[-300:]}"
    if len(errors) != 1:
        return f"{len(errors)} error: lines, not one: {done.stderr.strip()[-300:]}"
    if done.stdout:
        return f"printed on stdout: {done.stdout.strip()[:200]}"
    if left:
        return f"wrote {', '.join(left)}"
    return None


def run_battery(cases: list[Case] | None = None, workers: int = 4) -> list[tuple[Case, str | None]]:
    cases = documented_cases() if cases is None else cases
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(zip(cases, pool.map(run_case, cases)))


def main() -> int:
    results = run_battery()
    for case, problem in results:
        print(f"{'ok  ' if problem is None else 'FAIL'}  {case.code}  {case.command}"
              + (f"\n      {problem}" if problem else ""))
    failed = sum(problem is not None for _, problem in results)
    print(f"{len(results) - failed} of {len(results)} documented bad inputs behave as documented")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
