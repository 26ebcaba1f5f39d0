"""Benchmark: the main job (`imagebuilder build --torch 2.6 --cuda 12.1`) against the floors of
the same lock, real builds on the local Docker Engine (BuildKit, containerd image store), one run.

Measured back to back, BuildKit's records pruned between the cold builds (only the records this
run added; the floors download every wheel with `uv --no-cache`):
  1. the zstd floor: the runtime lock installed by uv on the base, nothing else, exported zstd
     into the image store (`--output type=image,compression=zstd,force-compression=true`);
  2. the compile-capable zstd floor: the same plus the image's own apt packages (g++,
     python3-dev, tini), what a runtime image that runs `torch.compile` cannot do without;
  3. the plain `docker buildx build --load` of floor 1 (what a user's own Dockerfile costs);
  4. the main job, cold (the README's command);
  5. the jupyter image of the same release after it (the issue asks for devel, but a CUDA 12.1
     devel image needs nvidia/cuda's nvcc in its base, and no registry serving it is reachable
     here: JupyterLab's layer on the runtime image is the second image this host can build);
  6. a no-change rebuild of 4.
Each row's step times come from the build's own log. Targets: 4 <= 1.10x floor 2 and <= 0.5x
build 3. Removes what it built and the build records it added. Needs a running daemon,
imagebuilder-base:bookworm (.ci/setup) and, behind a TLS-intercepting proxy, SSL_CERT_FILE.
About 15 minutes on 2 cores.

Run: .venv/bin/python bench/bench_build.py
"""

from __future__ import annotations

import json
import os
import re
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

from bench.floor import LOCK_FLOOR_DOCKERFILE as FLOOR  # noqa: E402
from build_records import build_cache_records, prune_records  # noqa: E402
from imagebuilder.lock.lockfile import load_locks  # noqa: E402
from imagebuilder.matrix.load import load_matrix  # noqa: E402
from imagebuilder.matrix.resolve import Request, resolve  # noqa: E402
from imagebuilder.resources import default_matrix_path  # noqa: E402

BASE = "imagebuilder-base:bookworm"
TORCH, CUDA, OS = "2.6", "12.1", "debian12"
RUN = uuid.uuid4().hex[:6]
REPOSITORY = f"imagebuilder-bench-build-{RUN}"
PLAIN_PACKAGES = "python3 python3-venv"
COMPILE_PACKAGES = "ca-certificates g++ python3 python3-dev python3-venv tini"
ZSTD = "type=image,name={tag},compression=zstd,force-compression=true,oci-mediatypes=true"
_DONE = re.compile(r"^#(\d+) (?:DONE|CACHED) ?([\d.]*)s?")
_NAME = re.compile(r"^#(\d+) (\S.*)$")
_TIMED = re.compile(r"^#\d+ (exporting layers|unpacking to \S+|exporting cache.*?) (\d+\.\d+)s done$")


def ca_bundle() -> Path:
    return Path(os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def steps_of(log: str) -> list[tuple[str, float]]:
    """(vertex name, seconds) of each step over a second, and the export's timed parts."""
    names: dict[str, str] = {}
    found: list[tuple[str, float]] = []
    for line in log.splitlines():
        if (timed := _TIMED.match(line)) is not None:
            found.append((timed[1][:60], float(timed[2])))
        elif (done := _DONE.match(line)) is not None:
            if done[2] and float(done[2]) >= 1.0:
                found.append((names.get(done[1], "?")[:60], float(done[2])))
        elif (named := _NAME.match(line)) is not None and done is None:
            names.setdefault(named[1], re.sub(r"--mount=\S+\s+", "", named[2]))
    return found


def floor(tag: str, packages: str, output: str) -> tuple[float, list[tuple[str, float]]]:
    matrix = load_matrix(default_matrix_path())
    spec = resolve(matrix, Request(TORCH, CUDA, variant="runtime", os=OS))
    lock = load_locks(default_matrix_path().parent / "locks").lock_for(spec, matrix)
    assert lock is not None, "no lock for the benchmark's image"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Dockerfile").write_text(FLOOR.format(base=BASE, uv=matrix.tools.uv, packages=packages))
        (Path(tmp) / "lock.txt").write_text(lock.text())
        argv = ["docker", "buildx", "build", "--no-cache", "--progress=plain", "--provenance=false",
                "--secret", f"id=ca,src={ca_bundle()}", *output.format(tag=tag).split(), tmp]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"the floor build failed:\n{done.stderr[-3000:]}")
    return seconds, steps_of(done.stderr)


def imagebuilder(*args: str) -> tuple[float, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "imagebuilder", "build", "--torch", TORCH, "--cuda", CUDA,
                               "--os", OS, "--base-image", BASE, "--ca-bundle", str(ca_bundle()),
                               "--repository", REPOSITORY, "--report", str(report), *args],
                              capture_output=True, text=True, cwd=ROOT)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"imagebuilder build {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        image: dict[str, Any] = json.loads(report.read_text())["images"][0]
    return seconds, image


def log_steps(image: dict[str, Any]) -> list[tuple[str, float]]:
    log = Path(image["log"])
    sbom = log.with_name(log.stem + "-sbom.log")
    return steps_of(log.read_text()) + [(f"(label build) {n}", s) for n, s in
                                        (steps_of(sbom.read_text()) if sbom.is_file() else [])]


def uv_cache_warm() -> bool:
    """Whether imagebuilder's uv cache mount is there from before this run (pruning it is not
    this run's to do): then the wheels it holds are not downloaded, on either platform."""
    done = subprocess.run(["docker", "system", "df", "-v", "--format", "{{json .BuildCache}}"],
                          capture_output=True, text=True, timeout=120)
    records = json.loads(done.stdout or "null") or []
    return any("/var/cache/imagebuilder/uv" in str(r.get("Description", "")) for r in records)


def remove(*refs: str) -> None:
    for ref in refs:
        subprocess.run(["docker", "image", "rm", ref], capture_output=True)


def main() -> None:
    before = build_cache_records("docker")
    say("uv's cache mount is " + ("WARM (from before this run: the main job downloads none of its wheels)"
                                  if uv_cache_warm() else "cold: every build downloads every wheel"))
    rows: list[tuple[str, float, str]] = []
    details: list[tuple[str, list[tuple[str, float]]]] = []
    made: list[str] = []

    def cold() -> None:
        prune_records("docker", before, keep_cache_mounts=False)

    try:
        for name, packages, output in (
                ("zstd floor (uv --no-cache, the lock on the base)", PLAIN_PACKAGES, "--output " + ZSTD),
                ("compile-capable zstd floor (+ g++ python3-dev tini)", COMPILE_PACKAGES, "--output " + ZSTD),
                ("plain docker buildx build --load (floor 1, gzip)", PLAIN_PACKAGES, "--tag {tag} --load")):
            cold()
            tag = f"{REPOSITORY}:floor-{len(rows)}"
            say(f"building: {name}")
            seconds, steps = floor(tag, packages, output)
            made.append(tag)
            remove(tag)
            rows.append((name, seconds, ""))
            details.append((name, steps))
        cold()
        say("building: the main job, cold")
        main_s, runtime = imagebuilder()
        made += runtime["tags"]
        rows.append(("main job cold (imagebuilder build --torch 2.6 --cuda 12.1)", main_s,
                     f"export {runtime['export_seconds'] or 0:.1f}s"))
        details.append(("main job cold", log_steps(runtime)))
        say("building: jupyter after it")
        second_s, second = imagebuilder("--variant", "jupyter")
        made += second["tags"]
        shared = set(layers(runtime["tags"][0])) & set(layers(second["tags"][0]))
        rows.append(("jupyter after it", second_s, f"export {second['export_seconds'] or 0:.1f}s; "
                     f"{len(shared)} layers shared with runtime"))
        details.append(("jupyter after it", log_steps(second)))
        say("building: no-change rebuild")
        again_s, again = imagebuilder()
        rows.append(("no-change rebuild of the main job", again_s,
                     f"{again['cached_steps']}/{again['steps']} steps cached, same image: "
                     f"{again['image_id'] == runtime['image_id']}"))
    finally:
        remove(*made)
        prune_records("docker", before, keep_cache_mounts=False)
        report(rows, details)


def report(rows: list[tuple[str, float, str]], details: list[tuple[str, list[tuple[str, float]]]]) -> None:
    """The table (what was measured, also when a later build failed) and each build's steps."""
    if len(rows) < 3:
        for name, seconds, note in rows:
            print(f"{name:62} {seconds:8.1f}  {note}")
        return
    floor_zstd, floor_compile, plain = rows[0][1], rows[1][1], rows[2][1]
    print(f"\n{'build':62} {'seconds':>8} {'/floor1':>8} {'/floor2':>8} {'/load':>7}  notes")
    for name, seconds, note in rows:
        print(f"{name:62} {seconds:8.1f} {seconds / floor_zstd:8.2f} {seconds / floor_compile:8.2f} "
              f"{seconds / plain:7.2f}  {note}")
    if len(rows) > 3:
        main_s = rows[3][1]
        print(f"\ntargets: main job <= 1.10x the compile-capable floor ({main_s / floor_compile:.2f}x) and <= 0.5x "
              f"the plain --load build ({main_s / plain:.2f}x)")
    for name, steps in details:
        print(f"\n{name}: steps over 1 s, from its build log")
        for step, seconds in steps:
            print(f"  {seconds:7.1f}s  {step}")


def layers(ref: str) -> list[str]:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref],
                         capture_output=True, text=True, check=True).stdout
    found: list[str] = json.loads(out)
    return found


if __name__ == "__main__":
    main()
