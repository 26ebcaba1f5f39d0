"""Benchmark: an ordered zstd:chunked republish against a plain zstd push (issue 55, item 4).

One run, side by side, on a mid-size image: imagebuilder-base:bookworm, two layers of this
venv's site-packages without torch (~450 MB, split by package name) and a small app layer; a
second image that differs in the app layer only, and a third that differs from the second in the
venv's second half (a file added) only: two nightlies. All built by BuildKit into the store as
zstd, as publish builds. Into a fresh local registry (tests/support/registry.py):

  1. zstd push of the first image (`docker push`: the stored zstd blobs, nothing compressed);
  2. zstd push of the second into the same repository (its new layer only);
  3. the first zstd:chunked publish of the first image (publish/estargz.py with an empty reuse
     store: the save, the start profile beside it, every layer written and uploaded);
  4. the zstd:chunked republish of the second (layer_reuse.py: the unchanged layers reused);
  5. the second again (every layer known: no save, no profile, nothing written);
  6. zstd push of the third; 7. its zstd:chunked republish.

Each: seconds, the registry storage's growth (bytes on its disk), and for 3-5 the publisher's
phases and the layers written/reused. Ratios: 3 / 1, 4 / 2, 7 / 6, and 4 and 7 / 3. Verify is not part of any
of them (a publish adds the same verify to both; docs/benchmarks.md puts it in).

The start profiled: `sh -c` reading the first 3,000 .py files of the venv (the base has no Python).

Run: .venv/bin/python bench/bench_republish.py   (root, the daemon with the containerd image store,
buildx, imagebuilder-base:bookworm, docker-registry). Removes its images; BuildKit's records of
the two builds stay in the daemon's cache (the suite's rules: no prune here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from imagebuilder.engine.docker import DockerEngine  # noqa: E402
from imagebuilder.engine.export import ZSTD_CHUNKED  # noqa: E402
from imagebuilder.publish.estargz import LEVELS, EstargzPublisher, reuse_summary  # noqa: E402
from imagebuilder.publish.layer_reuse import LayerStore  # noqa: E402
from imagebuilder.registry.client import HttpRegistry  # noqa: E402
from support.registry import running_registry  # noqa: E402

BASE = "imagebuilder-base:bookworm"
RUN = uuid.uuid4().hex[:6]
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
START = ("sh", "-c", "find /opt/venv -name '*.py' | sort | head -3000 | xargs cat >/dev/null")


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def sh(*argv: str, timeout: float = 900) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")


def context(folder: Path, app: str, nightly: str) -> None:
    """The build context: the venv's packages but torch in two halves (`nightly` a file of the
    second), and the app."""
    for name in ("a", "b"):
        (folder / name).mkdir(parents=True)
    for entry in sorted(SITE.iterdir()):
        if entry.name.startswith(("torch", "_", ".")) or "mypyc" in entry.name:
            continue
        half = "a" if entry.name.lower() < "n" else "b"
        if entry.is_dir():
            shutil.copytree(entry, folder / half / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, folder / half / entry.name)
    (folder / "b" / "zz_nightly.py").write_text(nightly)
    (folder / "app").mkdir()
    (folder / "app" / "main.py").write_text(app)
    for written in (folder / "b" / "zz_nightly.py", folder / "app" / "main.py"):
        os.utime(written, (1_700_000_000, 1_700_000_000))  # a layer changes by its content only
    (folder / "Dockerfile").write_text(f"FROM {BASE}\nCOPY a/ /opt/venv/lib/python3.11/site-packages/\n"
                                       "COPY b/ /opt/venv/lib/python3.11/site-packages/\nCOPY app/ /app/\n")


def build(ref: str, folder: Path) -> None:
    sh("docker", "buildx", "build", "--provenance=false", "--output",
       f"type=image,name={ref},compression=zstd,force-compression=true,oci-mediatypes=true", str(folder))


def stored(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "data").rglob("*") if p.is_file())


def main() -> None:
    engine, registry = DockerEngine(), HttpRegistry(config={})
    refs: list[str] = []
    with running_registry() as local, tempfile.TemporaryDirectory() as tmp:
        plain, ordered = f"{local.address}/bench-plain-{RUN}", f"{local.address}/bench-ordered-{RUN}"
        try:
            say(f"building the two images ({SITE} without torch)")
            for version, app, nightly in (("v1", "v1", "v1"), ("v2", "v2", "v1"), ("v3", "v2", "v3")):
                folder = Path(tmp) / version
                context(folder, f"print({app!r}, {RUN!r})\n", f"BUILT = {nightly!r}\n")
                build(f"{plain}:{version}", folder)
                sh("docker", "tag", f"{plain}:{version}", f"{ordered}:{version}")
                refs += [f"{plain}:{version}", f"{ordered}:{version}"]
                shutil.rmtree(folder)
            rows: list[tuple[str, float, int, str]] = []

            def step(name: str, run: Callable[[], object]) -> None:
                before, started = stored(local.root), time.perf_counter()
                detail = run()
                rows.append((name, time.perf_counter() - started, stored(local.root) - before, str(detail or "")))
                say(f"{name}: {rows[-1][1]:.1f} s, {rows[-1][2]:,} bytes {rows[-1][3]}")

            publisher = EstargzPublisher(engine, registry, level=LEVELS[ZSTD_CHUNKED], codec=ZSTD_CHUNKED, start=START,
                                         workdir=Path(tmp), say=lambda _: None, reuse=LayerStore(Path(tmp) / "reuse"))

            def ordered_push(version: str) -> str:
                converted = publisher.push(f"{ordered}:{version}", [f"{ordered}:{version}"], None)
                phases = ", ".join(f"{k} {v:.1f}" for k, v in converted.seconds.items())
                layers = " ".join(f"{'r' if i in converted.reused else 'w'}{len(w.prioritized)}"
                                  for i, w in enumerate(converted.layers))
                return f"({reuse_summary(converted.to_json())}; {phases}; layers [reused|written][profile files] {layers})"

            step("1 zstd push, first image", lambda: sh("docker", "push", "-q", f"{plain}:v1"))
            step("2 zstd push, one layer changed", lambda: sh("docker", "push", "-q", f"{plain}:v2"))
            step("3 zstd:chunked, first publish", lambda: ordered_push("v1"))
            step("4 zstd:chunked, republish, one layer changed", lambda: ordered_push("v2"))
            step("5 zstd:chunked, the same image again", lambda: ordered_push("v2"))
            step("6 zstd push, the venv's second half changed", lambda: sh("docker", "push", "-q", f"{plain}:v3"))
            step("7 zstd:chunked, republish, that half changed", lambda: ordered_push("v3"))
        finally:
            for ref in refs:
                engine.remove_image(ref)
    print()
    print(f"{'step':48} {'s':>7} {'registry bytes':>15}")
    for name, seconds, grown, detail in rows:
        print(f"{name:48} {seconds:7.1f} {grown:15,} {detail}")
    (_, s1, b1, _), (_, s2, b2, _), (_, t1, c1, _), (_, t2, c2, _), _, (_, s3, b3, _), (_, t3, c3, _) = rows
    print(f"first zstd:chunked / first zstd push: {t1 / s1:.2f}x seconds, {c1 / b1:.3f}x bytes")
    print(f"zstd:chunked republish / zstd republish (app changed): {t2 / s2:.2f}x seconds, {c2 / b2:.2f}x bytes")
    print(f"zstd:chunked republish / zstd republish (venv half changed): {t3 / s3:.2f}x seconds, {c3 / b3:.2f}x bytes")
    print(f"zstd:chunked republishes / first zstd:chunked publish: {t2 / t1:.2f}x, {t3 / t1:.2f}x seconds")


if __name__ == "__main__":
    main()
