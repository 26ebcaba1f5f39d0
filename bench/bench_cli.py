"""Benchmark: `imagebuilder --help` start-up and `render --all` over the packaged matrix.

Targets (issue: the core): render --all under 1 s for the whole matrix, --help under 0.3 s.
Prints the numbers and their ratio to the target; exits 0 either way (a benchmark reports,
it does not judge). Run: .venv/bin/python bench/bench_cli.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXE = [sys.executable, "-m", "imagebuilder"]


def timed(cmd: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "all"
        render_all = timed([*EXE, "render", "--all", "-o", str(out)], args.repeat)
        images = sum(1 for _ in out.glob("*/Dockerfile"))
        help_times = timed([*EXE, "--help"], args.repeat)
        modules = subprocess.run([*EXE.__getitem__(slice(0, 1)), "-c",
                                  "import sys, imagebuilder.cli; print('docker' in sys.modules)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    rows = [
        ("render --all (whole matrix)", statistics.median(render_all), 1.0, f"{images} images"),
        ("imagebuilder --help", statistics.median(help_times), 0.3, f"docker imported: {modules}"),
    ]
    print(f"{'what':32} {'median s':>9} {'target s':>9} {'ratio':>6}  notes")
    for name, value, target, notes in rows:
        print(f"{name:32} {value:9.3f} {target:9.2f} {value / target:6.2f}  {notes}")
    print(f"(median of {args.repeat} runs each, as subprocesses, Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
