"""Benchmark: BuildKit builds on the local Docker Engine, side by side with the floor built by
the same builder. Prints numbers and ratios; it is not a timed test.

Measured in one run, on one base (imagebuilder-base:bookworm):
  1. the floor (bench/floor) built cold by BuildKit;
  2. imagebuilder's 2.6 runtime image, cold (--no-cache), with --ca-bundle (a secret) and
     without (where SSL_CERT_FILE is unset the two are the same build);
  3. the devel image of the same torch: a second image that needs the same wheels, from
     the shared uv cache mount;
  4. a no-change rebuild of 2;
  5. with --arm64: the 2.11 runtime image for linux/arm64 under QEMU (.ci/arm64-base.sh).
Targets (issue 9): 2 <= 1.10x the floor, 3 <= 0.35x of 2, 4 <= 5 s.

"Cold" means no layer cache. uv's cache mount is shared by every image on the host and is
not emptied here (it is the point of 3), so after any earlier BuildKit build of the same
wheels the cold image build finds them there; the floor, installing with `uv --no-cache`,
downloads them every time. The first line of the output says whether the mount was warm.

Run: .venv/bin/python bench/bench_buildkit.py [--arm64]
Needs the daemon, a BuildKit docker CLI, imagebuilder-base:bookworm (.ci/setup) and, behind a
TLS-intercepting proxy, SSL_CERT_FILE. Takes 30-60 minutes on 2 cores; removes what it built.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.floor import build_floor  # noqa: E402
from imagebuilder.engine import DockerEngine  # noqa: E402
from imagebuilder.engine.select import decide, make_builder  # noqa: E402
from imagebuilder.matrix.load import load_matrix  # noqa: E402
from imagebuilder.resources import default_matrix_path  # noqa: E402

BASE = "imagebuilder-base:bookworm"
ARM64_BASE = "imagebuilder-base:bookworm-arm64"
REPO = f"imagebuilder-bench/buildkit-{uuid.uuid4().hex[:6]}"


def build(*args: str) -> tuple[float, dict[str, Any]]:
    """The CLI with BuildKit; (wall seconds, the report's image entry)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "imagebuilder", "build", "--builder", "buildkit",
                               "--base-image", BASE, "--os", "debian12", *args, "--repository", REPO,
                               "--report", str(report), "--quiet"], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"imagebuilder build {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return wall, json.loads(report.read_text())["images"][0]


def downloads(log: str) -> int:
    return sum(1 for line in Path(log).read_text().splitlines() if " Downloaded " in line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arm64", action="store_true", help="also build the 2.11 runtime for linux/arm64 under QEMU")
    args = parser.parse_args()
    engine = DockerEngine()
    builder = make_builder(decide("buildkit"), engine)
    print(f"builder: {builder.describe()}")
    ca = os.environ.get("SSL_CERT_FILE")
    ca_args = ["--ca-bundle", ca] if ca else []
    rows: list[tuple[str, float, str]] = []
    try:
        start = time.perf_counter()
        build_floor(builder, load_matrix(default_matrix_path()), "2.6", BASE, f"{REPO}:floor",
                    Path(ca) if ca else None)
        floor = time.perf_counter() - start
        rows.append(("floor (BuildKit, uv --no-cache)", floor, "1.00x floor"))
        cold_ca, runtime = build("--torch", "2.6", "--cuda", "12.1", "--no-cache", *ca_args)
        print(f"uv cache mount was {'warm' if downloads(runtime['log']) == 0 else 'cold'} for the cold build "
              f"({downloads(runtime['log'])} wheels downloaded)")
        rows.append(("runtime cold, --ca-bundle secret", cold_ca, f"{cold_ca / floor:.2f}x floor"))
        if ca:
            cold, _ = build("--torch", "2.6", "--cuda", "12.1", "--no-cache")
            rows.append(("runtime cold, no --ca-bundle (pip must reach the index)", cold, f"{cold / floor:.2f}x floor"))
        second, devel = build("--torch", "2.6", "--cuda", "12.1", "--variant", "devel", *ca_args)
        rows.append((f"devel, same wheels ({downloads(devel['log'])} downloaded)", second,
                     f"{second / cold_ca:.2f}x cold runtime"))
        again, rebuilt = build("--torch", "2.6", "--cuda", "12.1", *ca_args)
        rows.append((f"no-change rebuild (build {rebuilt['seconds']:.1f}s of it)", again, ""))
        if args.arm64:
            arm, _ = build("--torch", "2.11", "--cuda", "13.0", "--platform", "linux/arm64",
                           "--base-image", f"linux/arm64={ARM64_BASE}", *ca_args)
            rows.append(("arm64 2.11 runtime under QEMU", arm, ""))
    finally:
        subprocess.run(f"docker images --format '{{{{.Repository}}}}:{{{{.Tag}}}}' | grep '^{REPO}' "
                       "| xargs -r docker rmi", shell=True, check=False, capture_output=True)
    width = max(len(name) for name, _, _ in rows)
    for name, seconds, ratio in rows:
        print(f"{name.ljust(width)}  {seconds:8.1f}s  {ratio}")


if __name__ == "__main__":
    main()
