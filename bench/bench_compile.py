"""Benchmark: torch.compile in a fresh container, cold and then warm from a volume at the image's
compile-cache folder (issue 32). Real containers on the local Docker Engine, CPU only.

Per run: a new named volume at the folder (the parent of the image's TORCHINDUCTOR_CACHE_DIR,
/home/torch/.cache/torch in imagebuilder's images), then two fresh containers one after the
other, each `docker run --rm -v VOLUME:FOLDER IMAGE python -c SCRIPT`: the script builds a
resnet18-sized CNN and a transformer encoder layer from torch.nn (nothing downloaded), compiles
each with torch.compile (Inductor's C++ kernels on the CPU) and times its first call, which is
the compilation; the second container finds the first one's FX graphs and kernels in the volume.
Prints both times, the ratio (target: warm <= 0.3x cold) and Inductor's cache counters of each
container. Every container has a time limit and is removed, the volume too, also on Ctrl-C.

Run: .venv/bin/python bench/bench_compile.py IMAGE [--runs 2]
  e.g. IMAGE = pytorch:2.6.0-cuda12.1-cudnn9-runtime (`imagebuilder build --torch 2.6 --cuda 12.1`)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagebuilder.build.image_contents import COMPILE_CACHE  # noqa: E402

RUN = uuid.uuid4().hex[:6]
PROGRESS_S = 10.0  # a line at least this often while a container runs
TARGET = 0.3
RESULT = "BENCH_RESULT "
MODELS = ("cnn", "transformer")

# Runs with the image's Python: torch only. The first call of a compiled module is its
# compilation (Dynamo, AOTAutograd, Inductor, the C++ compiler); the second is the run alone.
SCRIPT = r'''
import json, os, sys, time
import torch
from torch import nn
from torch._dynamo.utils import counters


def say(text):
    print("bench: " + text, file=sys.stderr, flush=True)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (None if stride == 1 and cin == cout else
                     nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


def resnet18():
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


torch.manual_seed(0)
# Eval mode with grad enabled: TransformerEncoderLayer's fused fast path stays off, so Inductor
# compiles its attention and feed-forward rather than calling one fused op.
models = {
    "cnn": (resnet18(), torch.randn(2, 3, 224, 224)),
    "transformer": (nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), torch.randn(4, 128, 256)),
}
result = {"torch": torch.__version__, "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "uid": os.getuid()}
for name, (model, x) in models.items():
    model.eval()
    compiled = torch.compile(model)
    say(f"{name}: compiling")
    start = time.perf_counter()
    compiled(x)
    result[name + "_first_s"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    compiled(x)
    result[name + "_second_s"] = round(time.perf_counter() - start, 3)
    say(f"{name}: first call {result[name + '_first_s']}s")
result["fxgraph_cache_hit"] = counters["inductor"]["fxgraph_cache_hit"]
result["fxgraph_cache_miss"] = counters["inductor"]["fxgraph_cache_miss"]
result["autograd_cache_hit"] = counters["aot_autograd"]["autograd_cache_hit"]
print("BENCH_RESULT " + json.dumps(result), flush=True)
'''


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def cache_folder(image: str) -> str:
    """The parent of the image's TORCHINDUCTOR_CACHE_DIR: what the volume is mounted at."""
    done = docker("image", "inspect", "--format", "{{json .Config.Env}}", image)
    if done.returncode != 0:
        sys.exit(f"no image {image} here: {done.stderr.strip()}")
    env = dict(item.split("=", 1) for item in json.loads(done.stdout) or [])
    setting = env.get("TORCHINDUCTOR_CACHE_DIR")
    if not setting:
        sys.exit(f"{image} has no TORCHINDUCTOR_CACHE_DIR: not an image of an imagebuilder with compile caches "
                 f"({COMPILE_CACHE}); build it with this checkout")
    return str(Path(setting).parent)


def run_container(image: str, volume: str, folder: str, label: str, timeout: float) -> dict[str, Any]:
    """One fresh container with the volume at the folder; its result, with its wall time. A line
    every PROGRESS_S seconds while it runs; killed and removed at `timeout` and on Ctrl-C."""
    name = f"imagebuilder-bench-compile-{RUN}-{label}"
    argv = ["docker", "run", "--rm", "--name", name, "-v", f"{volume}:{folder}", image, "python", "-c", SCRIPT]
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    lines: list[str] = []
    last = [time.monotonic()]

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("bench: "):
                say(f"  {label}: {line[len('bench: '):].strip()}")
                last[0] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while process.poll() is None:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{label}: no result within {timeout:.0f}s")
            if time.monotonic() - last[0] >= PROGRESS_S:
                say(f"  {label}: running for {time.monotonic() - started:.0f}s")
                last[0] = time.monotonic()
            time.sleep(0.5)
    finally:
        if process.poll() is None:
            docker("rm", "-f", name)  # --rm alone leaves it running when the client goes
            process.kill()
        process.wait()
        reader.join(timeout=10)
    seconds = time.monotonic() - started
    results = [line[len(RESULT):] for line in lines if line.startswith(RESULT)]
    if process.returncode != 0 or not results:
        sys.exit(f"{label}: the container exited {process.returncode}:\n" + "\n".join(lines[-40:]))
    result: dict[str, Any] = json.loads(results[-1])
    result["container_s"] = round(seconds, 1)
    return result


def volume_files(volume: str, folder: str, image: str) -> str:
    """What the first container left in the volume, summarised (entries and size per cache)."""
    done = docker("run", "--rm", "-v", f"{volume}:{folder}", "--entrypoint", "sh", image, "-c",
                  f"cd {folder} && for d in *; do [ -d \"$d\" ] && echo \"$d: $(find \"$d\" -type f | wc -l) files, "
                  f"$(du -sh \"$d\" | cut -f1)\"; done", timeout=120)
    return done.stdout.strip().replace("\n", "; ") or "(empty)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image", metavar="IMAGE", help="an image with the compile-cache ENV (imagebuilder build)")
    parser.add_argument("--runs", type=int, default=2, help="cold/warm pairs, each on a new volume (default 2)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per container (default 1200)")
    args = parser.parse_args()
    folder = cache_folder(args.image)
    say(f"{args.image}: compile caches at {folder}; {args.runs} run(s), each a new volume, a cold then a warm "
        "container")
    rows: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
    volumes: list[str] = []
    try:
        for run in range(1, args.runs + 1):
            volume = f"imagebuilder-bench-compile-{RUN}-{run}"
            created = docker("volume", "create", volume)
            if created.returncode != 0:
                sys.exit(f"docker volume create {volume}: {created.stderr.strip()}")
            volumes.append(volume)
            say(f"run {run}: cold container (volume {volume}, empty)")
            cold = run_container(args.image, volume, folder, f"run{run}-cold", args.timeout)
            say(f"run {run}: the volume holds {volume_files(volume, folder, args.image)}")
            say(f"run {run}: warm container (the same volume)")
            warm = run_container(args.image, volume, folder, f"run{run}-warm", args.timeout)
            rows.append((run, cold, warm))
            docker("volume", "rm", "-f", volume)
            volumes.remove(volume)
    except TimeoutError as e:
        sys.exit(str(e))
    finally:
        for volume in volumes:
            docker("volume", "rm", "-f", volume)
        report(args.image, rows)


def report(image: str, rows: list[tuple[int, dict[str, Any], dict[str, Any]]]) -> None:
    if not rows:
        return
    print(f"\n{image} (torch {rows[0][1]['torch']}), first call = compilation, CPU")
    print(f"{'run':>3}  {'model':12} {'cold s':>8} {'warm s':>8} {'warm/cold':>9}")
    for run, cold, warm in rows:
        for model in (*MODELS, "container"):
            key = "container_s" if model == "container" else f"{model}_first_s"
            print(f"{run:>3}  {model:12} {cold[key]:8.1f} {warm[key]:8.1f} {warm[key] / cold[key]:9.2f}")
        print(f"     Inductor's FX graph cache: cold {cold['fxgraph_cache_hit']} hit(s) / {cold['fxgraph_cache_miss']} "
              f"miss(es), warm {warm['fxgraph_cache_hit']} / {warm['fxgraph_cache_miss']}; AOTAutograd cache hits: "
              f"cold {cold['autograd_cache_hit']}, warm {warm['autograd_cache_hit']}")
    cold_s = sum(cold[f"{m}_first_s"] for _, cold, _ in rows for m in MODELS)
    warm_s = sum(warm[f"{m}_first_s"] for _, _, warm in rows for m in MODELS)
    verdict = "met" if warm_s <= TARGET * cold_s else "NOT met"
    print(f"\ntarget: warm compilation <= {TARGET}x cold: {warm_s / cold_s:.2f}x over {len(rows)} run(s), {verdict}")


if __name__ == "__main__":
    main()
