"""Benchmark: real builds on the local Docker Engine, side by side with the floor.

The floor (bench/floor/Dockerfile) is the least a torch image can be: a venv and the same
pinned wheels on the same base, installed the same way (uv), nothing else. Measured in one
run:
  1. cold build of the floor;
  2. cold build of imagebuilder's runtime image with --ca-bundle (two stages: the CA stays in
     the first, so the venv crosses a stage boundary once);
  3. cold build of the runtime image on a base that already trusts the CA (one stage, the
     path of every site without a TLS-intercepting proxy);
  4. a no-change rebuild of 3;
  5. `--variant all` (runtime, devel, jupyter) against the sum of separate builds, and how
     much the jupyter image adds over the runtime image whose layers it reuses.
Targets: cold ratio < 1.15, size ratio < 1.10, rebuild < 5 s. Prints a table; removes what
it built. Needs a running daemon, imagebuilder-base:bookworm (.ci/setup) and, behind a
TLS-intercepting proxy, SSL_CERT_FILE. Takes 20-40 minutes on 2 cores.

Run: .venv/bin/python bench/bench_build.py [--skip-all-variants]
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
from imagebuilder.engine.classic import ClassicBuilder  # noqa: E402
from imagebuilder.matrix import load_matrix  # noqa: E402
from imagebuilder.resources import default_matrix_path  # noqa: E402

BASE = "imagebuilder-base:bookworm"
CA_BASE = "imagebuilder-base:bookworm-ca"
REPO = f"imagebuilder-bench/{uuid.uuid4().hex[:6]}"


def cli(*args: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        start = time.perf_counter()
        # The classic builder, as the floor here is built: bench_buildkit.py measures BuildKit.
        done = subprocess.run([sys.executable, "-m", "imagebuilder", *args, "--repository", REPO,
                               "--report", str(report), "--quiet"], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "IMAGEBUILDER_BUILDER": "classic"})
        wall = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"imagebuilder {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        doc: dict[str, Any] = json.loads(report.read_text())
    doc["wall"] = wall
    return doc


def floor(engine: DockerEngine, ca: str | None) -> tuple[float, int, str]:
    ref = f"{REPO}:floor"
    start = time.perf_counter()
    result = build_floor(ClassicBuilder(engine), load_matrix(default_matrix_path()), "2.6", BASE, ref,
                         Path(ca) if ca else None)
    return time.perf_counter() - start, result.size, ref


def layers(ref: str) -> list[str]:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref],
                         capture_output=True, text=True, check=True).stdout
    found: list[str] = json.loads(out)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-all-variants", action="store_true", help="skip measurement 5 (the longest)")
    args = parser.parse_args()
    engine = DockerEngine()
    ca = os.environ.get("SSL_CERT_FILE")
    if ca:
        subprocess.run(["bash", str(ROOT / ".ci" / "ca-base-image.sh"), CA_BASE, BASE, ca], check=True,
                       capture_output=True)
    common = ["--torch", "2.6", "--cuda", "12.4", "--os", "debian12", "--variant", "runtime"]
    rows: list[tuple[str, str, str, str]] = []
    built: list[str] = []
    try:
        floor_s, floor_size, floor_ref = floor(engine, ca)
        built.append(floor_ref)
        rows.append(("floor: venv + pinned wheels (uv)", f"{floor_s:.1f} s", f"{floor_size / 1e9:.2f} GB", "1.00 / 1.00"))

        two = cli("build", *common, "--base-image", BASE, "--no-cache", *(["--ca-bundle", ca] if ca else []))
        img = two["images"][0]
        built += img["tags"]
        rows.append(("runtime, --ca-bundle (2 stages)", f"{two['wall']:.1f} s", f"{img['size_bytes'] / 1e9:.2f} GB",
                     f"{two['wall'] / floor_s:.2f} / {img['size_bytes'] / floor_size:.2f}"))
        for ref in img["tags"]:
            engine.remove_image(ref)

        one = cli("build", *common, "--base-image", CA_BASE if ca else BASE, "--no-cache")
        img = one["images"][0]
        built += img["tags"]
        rows.append(("runtime, CA-trusting base (1 stage)", f"{one['wall']:.1f} s", f"{img['size_bytes'] / 1e9:.2f} GB",
                     f"{one['wall'] / floor_s:.2f} / {img['size_bytes'] / floor_size:.2f}"))

        again = cli("build", *common, "--base-image", CA_BASE if ca else BASE)
        a = again["images"][0]
        rows.append(("no-change rebuild (1 stage)", f"{again['wall']:.1f} s", "",
                     f"{a['cached_steps']}/{a['steps']} steps cached, same id: {a['image_id'] == img['image_id']}"))

        if not args.skip_all_variants:
            all_common = ["--torch", "2.12", "--cuda", "13.0", "--os", "debian12", "--base-image",
                          CA_BASE if ca else BASE]
            together = cli("build", *all_common, "--variant", "all", "--no-cache")
            refs = {i["spec"]["variant"]: i["tags"][0] for i in together["images"]}
            built += [t for i in together["images"] for t in i["tags"]]
            runtime_layers, jupyter_layers = layers(refs["runtime"]), layers(refs["jupyter"])
            shared = jupyter_layers[: len(runtime_layers)] == runtime_layers
            sizes = {i["spec"]["variant"]: i["size_bytes"] for i in together["images"]}
            for ref in built[-len([t for i in together["images"] for t in i["tags"]]):]:
                engine.remove_image(ref)
            separate = 0.0
            for variant in ("runtime", "devel", "jupyter"):
                doc = cli("build", *all_common, "--variant", variant, "--no-cache")
                separate += doc["wall"]
                built += [t for i in doc["images"] for t in i["tags"]]
            rows.append(("--variant all (2.12, CUDA 13.0)", f"{together['wall']:.1f} s", "",
                         f"separately {separate:.1f} s, ratio {together['wall'] / separate:.2f}"))
            rows.append(("jupyter over its runtime image", "", f"+{(sizes['jupyter'] - sizes['runtime']) / 1e6:.0f} MB",
                         f"runtime layers reused: {shared}"))
    finally:
        for ref in set(built):
            engine.remove_image(ref)
    print(f"{'measurement':40} {'time':>9} {'size':>9}  ratio to floor (time / size) or notes")
    for name, t, size, note in rows:
        print(f"{name:40} {t:>9} {size:>9}  {note}")
    print("targets: cold time ratio < 1.15, size ratio < 1.10, no-change rebuild < 5 s")


if __name__ == "__main__":
    main()
