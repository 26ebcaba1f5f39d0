"""Benchmark: publishing at the speed of the build (issue 21). Prints numbers and ratios, one run.

On one base (imagebuilder-base:bookworm) and one lock (torch 2.12, CUDA 13.0, Debian 12, whose
runtime and devel images share the torch layer), with BuildKit on the local Docker Engine
(containerd image store) and a local registry (.ci/registry.sh):

  1. the floor: the runtime lock installed by uv (--no-cache: every wheel downloaded) on the
     same base by the same BuildKit, cold (--no-cache), exported to the image store as zstd;
  2. a cold publish of the runtime image (--no-cache; zstd): its build_s, verify_s, push_s and
     pushed_bytes from `publish --report`, and the bytes of its registry cache: the cache's
     export (a cache-only build beside verify: cache_export_s) uploads the image's blobs, and
     the push (after waiting for it, inside push_s) mounts them from there;
  3. the same image published with --compression gzip (another namespace): build, push and the
     registry's bytes of the image;
  4. the devel image of the same lock published beside it: the registry's bytes of runtime +
     devel against runtime alone (the torch layer is stored once);
  5. a republish of identical content (--force): blob bytes uploaded;
  6. a cold pull of the zstd and of the gzip image, each by a new, empty Docker Engine (its own
     network namespace and data root: tests/remote_engine.py), as a fresh GPU node pulls.

Targets: push <= 0.5x the floor; build + push <= 1.3x the floor (issue 26); runtime + devel <= 1.3x the
bytes of runtime alone; republish uploads 0 blob bytes; zstd cold pull <= 0.6x the gzip one.

"Cold" is the layer cache. uv's cache mount (imagebuilder-uv) is shared by every BuildKit
build on the host and kept, so the cold publish may find the wheels there (the output says how
many it downloaded); the floor downloads all of them.

Run: .venv/bin/python bench/bench_publish.py
Needs root (the empty engines of the cold pulls), the daemon with the containerd image store,
buildx, imagebuilder-base:bookworm, docker-registry and, behind a TLS-intercepting proxy,
SSL_CERT_FILE. Removes what it made (its images, registry and BuildKit cache records).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # remote_engine (the cold pulls' empty engines), build_records

from bench.floor import LOCK_FLOOR_DOCKERFILE  # noqa: E402
from imagebuilder.engine.export import cache_ref  # noqa: E402
from imagebuilder.lock.lockfile import load_locks  # noqa: E402
from imagebuilder.matrix.load import load_matrix  # noqa: E402
from imagebuilder.matrix.resolve import Request, resolve  # noqa: E402
from imagebuilder.registry.client import HttpRegistry  # noqa: E402
from imagebuilder.registry.reference import RegistryTarget  # noqa: E402
from imagebuilder.resources import default_matrix_path  # noqa: E402
from build_records import build_cache_records, prune_records  # noqa: E402
from remote_engine import remote_engine  # noqa: E402

BASE = "imagebuilder-base:bookworm"
TORCH, CUDA, OS = "2.12", "13.0", "debian12"
RUN = uuid.uuid4().hex[:6]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def sh(*argv: str, env: Mapping[str, str] | None = None, timeout: float | None = None,
       progress: Callable[[], str] = lambda: "") -> subprocess.CompletedProcess[str]:
    """Run argv, ending the run if it fails; a line every 15 s while it runs (no silence longer
    than that; `progress` adds to it)."""
    import threading

    stop = threading.Event()
    started = time.perf_counter()
    name = " ".join(argv[:4])

    def tick() -> None:
        while not stop.wait(15):
            say(f"  ... {name} still running ({time.perf_counter() - started:.0f}s{progress()})")

    threading.Thread(target=tick, daemon=True).start()
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    finally:
        stop.set()
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done


def timed(*argv: str) -> float:
    start = time.perf_counter()
    sh(*argv)
    return time.perf_counter() - start


def ca_bundle() -> Path:
    return Path(os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")


def floor(tag: str) -> float:
    matrix = load_matrix(default_matrix_path())
    spec = resolve(matrix, Request(TORCH, CUDA, variant="runtime", os=OS))
    lock = load_locks(default_matrix_path().parent / "locks").lock_for(spec, matrix)
    assert lock is not None, "no lock for the benchmark's image"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Dockerfile").write_text(LOCK_FLOOR_DOCKERFILE.format(base=BASE, uv=matrix.tools.uv, packages="python3 python3-venv"))
        (Path(tmp) / "lock.txt").write_text(lock.text())
        return timed("docker", "buildx", "build", "--no-cache", "--progress=plain", "--provenance=false",
                     "--secret", f"id=ca,src={ca_bundle()}", "--output",
                     f"type=image,name={tag},compression=zstd,force-compression=true,oci-mediatypes=true", tmp)


def publish(registry: str, *args: str) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        start = time.perf_counter()
        sh(sys.executable, "-m", "imagebuilder", "publish", "--torch", TORCH, "--cuda", CUDA, "--os", OS,
           "--base-image", BASE, "--ca-bundle", str(ca_bundle()), "--builder", "buildkit", "--allow-no-gpu",
           "--registry", registry, "--report", str(report), "--quiet",
           *(() if "--compression" in args else ("--compression", "zstd")), *args,
           env={**os.environ, "GITHUB_SHA": "0" * 40})
        wall = time.perf_counter() - start
        return wall, json.loads(report.read_text())["images"][0]


def stored_bytes(refs: list[str]) -> int:
    """The registry's bytes for these images, each blob once (what it stores for them)."""
    registry = HttpRegistry(config={})
    blobs: dict[str, int] = {}
    for ref in refs:
        blobs.update({digest: size for digest, (size, _) in registry.blobs(ref).items()})
    return sum(blobs.values())


def cold_pull(ref: str, registry_port: int) -> float:
    """Seconds a fresh engine takes to pull `ref`: a second Docker Engine (tests/remote_engine.py:
    its own network namespace, data root and bridge, the registry forwarded into it), empty, torn
    down after. This engine cannot be made cold: its pushes' leases keep their blobs for an hour
    after the images are removed (a "cold" pull here took 0.1 s)."""
    with remote_engine(registry_port) as engine:
        start = time.perf_counter()
        sh("docker", "pull", "-q", ref, env=engine.env())
        return time.perf_counter() - start


def downloads(log: str) -> int:
    return len(re.findall(r"Download(?:ed|ing) (?:torch|nvidia)", Path(log).read_text()))


def cache_export_s(image: dict) -> float:
    """Seconds the registry cache's export ran: a cache-only build started after the image's
    build, beside verify (imagebuilder/build/cache_export.py); its log sits beside the build's
    (-cache.log)."""
    log = Path(image["build"]["log"])
    if image.get("cache_export_s") is None:
        sys.exit(f"the publish reported no cache export (see {log.stem}-cache.log)")
    if not re.search(r"^#\d+ exporting cache to registry$", log.with_name(log.stem + "-cache.log").read_text(), re.M):
        sys.exit(f"no cache export in {log.stem}-cache.log")
    return float(image["cache_export_s"])


def remove_ours() -> None:
    """Remove every local image this run tagged (their names carry RUN)."""
    listing = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                             capture_output=True, text=True, check=False).stdout.split()
    ours = [ref for ref in listing if RUN in ref]
    if ours:
        subprocess.run(["docker", "rmi", "-f", *ours], capture_output=True, check=False)


def main() -> None:
    before = build_cache_records("docker")
    port = free_port()
    address = sh(str(ROOT / ".ci" / "registry.sh"), "start", str(port)).stdout.strip().splitlines()[-1]
    zstd_ns, gzip_ns = f"{address}/bench-{RUN}", f"{address}/bench-gzip-{RUN}"
    rows: list[tuple[str, str]] = []
    try:
        say("the floor")
        floor_s = floor(f"imagebuilder-bench/floor-{RUN}:x")
        # The floor's image and records share nothing the publishes use: gone now, the disk
        # must hold a runtime and a devel image, twice compressed, with their records.
        remove_ours()
        prune_records("docker", before, keep_cache_mounts=False)
        rows.append(("floor: runtime lock, uv --no-cache, BuildKit --no-cache, zstd into the store", f"{floor_s:.1f}s"))
        say("a cold publish of the runtime image (zstd)")
        wall, cold = publish(zstd_ns, "--variant", "runtime", "--no-cache")
        build_s, verify_s, push_s = cold["build_s"], cold["verify_s"], cold["push_s"]
        print(f"cold publish downloaded {downloads(cold['build']['log'])} torch/nvidia wheels "
              "(uv's shared cache mount may hold them)")
        rows += [("cold publish, zstd: wall", f"{wall:.1f}s"),
                 ("  build_s", f"{build_s:.1f}s ({build_s / floor_s:.2f}x floor)"),
                 ("  verify_s", f"{verify_s:.1f}s"),
                 ("  push_s", f"{push_s:.1f}s ({push_s / floor_s:.2f}x floor; target <= 0.5x)"),
                 ("  build + push", f"{build_s + push_s:.1f}s ({(build_s + push_s) / floor_s:.2f}x floor; "
                                    "target <= 1.3x)"),
                 ("  pushed_bytes (blobs the push uploaded)", f"{cold['pushed_bytes']:,}"),
                 # The cache export uploads the image's own blobs (mode=min) beside verify; the
                 # push waits for it (inside push_s) and then mounts them from the cache's repository.
                 ("  registry cache bytes (uploaded beside verify)",
                  f"{stored_bytes([cache_ref(RegistryTarget.parse(zstd_ns), cold['image'])]):,}"),
                 ("  the cache export (that upload), beside verify", f"{cache_export_s(cold):.1f}s"),
                 ("  build + verify + push", f"{build_s + verify_s + push_s:.1f}s")]
        alone = stored_bytes([cold["ref"]])
        say("the runtime image with gzip")
        _, gz = publish(gzip_ns, "--variant", "runtime", "--compression", "gzip")
        gzip_bytes = stored_bytes([gz["ref"]])
        rows += [("gzip publish: build_s (gzip export of the layers)", f"{gz['build_s']:.1f}s"),
                 ("  push_s", f"{gz['push_s']:.1f}s"),
                 ("  registry bytes of the image", f"{gzip_bytes:,} ({gzip_bytes / alone:.2f}x zstd's)")]
        say("the devel image beside it")
        _, devel = publish(zstd_ns, "--variant", "devel")
        both = stored_bytes([cold["ref"], devel["ref"]])
        rows += [("registry bytes, runtime alone", f"{alone:,}"),
                 ("registry bytes, runtime + devel", f"{both:,} ({both / alone:.2f}x; target <= 1.3x)"),
                 ("  devel pushed_bytes", f"{devel['pushed_bytes']:,}")]
        say("a republish of identical content")
        _, again = publish(zstd_ns, "--variant", "runtime", "--force")
        rows.append(("republish of identical content: pushed_bytes", f"{again['pushed_bytes']:,} (target 0)"))
        # Each pull on a new empty engine; this one's images and records go first (disk).
        remove_ours()
        prune_records("docker", before, keep_cache_mounts=False)
        say("cold pulls by an empty engine (zstd, then gzip)")
        zstd_pull, gzip_pull = cold_pull(cold["ref"], port), cold_pull(gz["ref"], port)
        rows += [("cold pull on an empty engine, zstd", f"{zstd_pull:.1f}s"),
                 ("cold pull on an empty engine, gzip", f"{gzip_pull:.1f}s (zstd/gzip {zstd_pull / gzip_pull:.2f}x; "
                                                        "target <= 0.6x)")]
    finally:
        remove_ours()
        subprocess.run([str(ROOT / ".ci" / "registry.sh"), "stop", str(port)], capture_output=True, check=False)
        prune_records("docker", before, keep_cache_mounts=False)
        width = max((len(name) for name, _ in rows), default=0)
        for name, value in rows:
            print(f"{name.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
