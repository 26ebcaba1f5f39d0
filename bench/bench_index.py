"""Benchmark: `matrix check --online` reads the index without downloading wheels.

Target (issue 20.3): under 60 s and under 200 MB received for the packaged matrix. Prints the
time, the bytes the index reader received (page bodies as sent, compressed where the index
compresses, and every range of a wheel it read), and the requests' count; exits 0 either way
(a benchmark reports, it does not judge). Run: .venv/bin/python bench/bench_index.py [--index-url URL]
"""

from __future__ import annotations

import argparse
import time

from imagebuilder.lock.drift import check_drift
from imagebuilder.lock.index import PackageIndex
from imagebuilder.matrix.load import load_matrix
from imagebuilder.resources import default_matrix_path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index-url")
    args = parser.parse_args()
    index = PackageIndex(args.index_url)
    start = time.perf_counter()
    drifts = check_drift(index, load_matrix(default_matrix_path()))
    seconds = time.perf_counter() - start
    mb = index.received / 1e6
    print(f"matrix check --online: {seconds:.1f} s (target 60 s, {seconds / 60:.2f}x), "
          f"{mb:.1f} MB received (target 200 MB, {mb / 200:.2f}x), {index.requests} requests, "
          f"{len(drifts)} drifts")


if __name__ == "__main__":
    main()
