"""Benchmark (issue 31): the arm64 runtime image built on this amd64 host against the amd64 one
of the same release, both cold, one run. Real builds on the local Docker Engine (BuildKit,
containerd image store); BuildKit's records this run adds, cache mounts included, are pruned
before each build, so both download every wheel and every apt package.

  1. torch 2.11 / CUDA 13.0 runtime for linux/amd64 (the host's platform);
  2. the same for linux/arm64: the wheels installed natively by uv (--python-platform), apt and
     the SBOM under QEMU.
Target: 2 <= 1.5x 1. Each row's step times come from the build's own log (which steps ran
emulated shows there: the native-uv stage and uv in the wheel groups' RUNs are the host's). Removes what it built.
Needs the daemon, imagebuilder-base:bookworm and the multi-platform
imagebuilder-base:bookworm-arm64 (.ci/setup) and, behind a TLS-intercepting proxy,
SSL_CERT_FILE. About 10 minutes on 2 cores.

Run: .venv/bin/python bench/bench_arm64.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench.bench_build import ca_bundle, log_steps, remove, say, uv_cache_warm  # noqa: E402
from build_records import build_cache_records, prune_records  # noqa: E402

BASES = {"linux/amd64": "imagebuilder-base:bookworm", "linux/arm64": "imagebuilder-base:bookworm-arm64"}
REPOSITORY = f"imagebuilder-bench-arm64-{uuid.uuid4().hex[:6]}"


def build(platform: str) -> tuple[float, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        argv = [sys.executable, "-m", "imagebuilder", "build", "--torch", "2.11", "--cuda", "13.0", "--os", "debian12",
                "--variant", "runtime", "--builder", "buildkit", "--platform", platform,
                "--base-image", f"{platform}={BASES[platform]}", "--ca-bundle", str(ca_bundle()),
                "--repository", REPOSITORY, "--report", str(report)]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"the {platform} build failed:\n{done.stderr[-3000:]}")
        for line in done.stderr.splitlines():
            if "on a host of another platform" in line:
                say(line)
        image: dict[str, Any] = json.loads(report.read_text())["images"][0]
    return seconds, image


def main() -> None:
    before = build_cache_records("docker")
    say("uv's cache mount is " + ("WARM (from before this run: its wheels are not downloaded)" if uv_cache_warm()
                                  else "cold: every wheel is downloaded"))
    rows: list[tuple[str, float, dict[str, Any]]] = []
    made: list[str] = []
    try:
        for platform in ("linux/amd64", "linux/arm64"):
            prune_records("docker", before, keep_cache_mounts=False)
            say(f"building: 2.11 / 13.0 runtime for {platform}, cold")
            seconds, image = build(platform)
            made += image["tags"]
            remove(*image["tags"])
            rows.append((platform, seconds, image))
    finally:
        remove(*made)
        prune_records("docker", before, keep_cache_mounts=False)
    amd64 = rows[0][1]
    print(f"\n{'build (torch 2.11, CUDA 13.0, runtime, cold)':48} {'seconds':>8} {'/amd64':>7}  export")
    for platform, seconds, image in rows:
        print(f"{platform:48} {seconds:8.1f} {seconds / amd64:7.2f}  {image.get('export_seconds') or 0:.1f}s")
    print(f"\ntarget: arm64 <= 1.5x amd64 ({rows[1][1] / amd64:.2f}x)")
    for platform, _, image in rows:
        print(f"\n{platform}: steps over 1 s, from its build log")
        for step, seconds in log_steps(image):
            print(f"  {seconds:7.1f}s  {step}")


if __name__ == "__main__":
    main()
