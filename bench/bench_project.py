"""Benchmark: `imagebuilder project` (issue 53), on the local engine and a local registry.

  python bench/bench_project.py --base IMAGE --registry 127.0.0.1:5000 [--ca-bundle PATH]

IMAGE is a local imagebuilder image (the torch 2.6 runtime of the README's main job). One run:
  1. IMAGE is pushed to REGISTRY/bench/base (its layers are there before the project's push).
  2. first: `imagebuilder project` of a pyproject project (pandas, torchmetrics, its own package)
     with --no-cache and --push to REGISTRY/bench/project: wall seconds, and the build's own.
  3. code: the package's code changed, the same command without --no-cache: wall and build
     seconds. Target: <= 0.3x the first build.
  4. push: the bytes the project push added to the registry's storage (du before and after)
     against the project's own layers (their compressed sizes in the manifest). Target <= 1.05x.
  5. pull: the bytes a node that holds the base pulls for the project image (its own layers)
     against a plain `FROM <IMAGE's OS base> + pip install torch + the project` image, which
     such a node pulls whole (its compressed size from a push of it). Target <= 0.2x.
Prints each number and the ratios; removes every image and tag it made.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.projects import trainer_pyproject  # noqa: E402  (the test's project, under the bench's name)

PYPROJECT = trainer_pyproject("benchtrainer")
PLAIN = """FROM {os_base}
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \\
 && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,source=ca.pem,target=/ca.pem python3 -m venv /opt/venv \\
 && SSL_CERT_FILE=/ca.pem PIP_CERT=/ca.pem /opt/venv/bin/pip install --no-cache-dir torch=={torch} pandas==2.2.3 \\
    torchmetrics==1.6.1
COPY . /opt/project
"""


def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(cmd), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[:3])} failed:\n{done.stderr[-2000:]}")
    return done


def manifest_layers(registry: str, repository: str, tag: str) -> list[tuple[str, int]]:
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{tag}", headers={"Accept": ", ".join([
        "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json"])})
    with urllib.request.urlopen(request, timeout=60) as answer:
        doc = json.load(answer)
    if "manifests" in doc:  # an index: the amd64 image
        digest = next(m["digest"] for m in doc["manifests"] if m.get("platform", {}).get("architecture") == "amd64")
        return manifest_layers(registry, repository, digest)
    return [(layer["digest"], int(layer["size"])) for layer in doc["layers"]]


def storage_bytes(registry: str) -> int:
    port = registry.rsplit(":", 1)[1]
    root = Path(f"/tmp/imagebuilder-registry-{port}")
    return int(sh("du", "-sb", str(root)).stdout.split()[0])


def project_run(folder: Path, base: str, tag: str, ca: list[str], *extra: str) -> tuple[float, dict]:
    report = folder.parent / f"report-{uuid.uuid4().hex[:6]}.json"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "imagebuilder", "project", str(folder), "--base", base, "--tag", tag,
                           "--allow-no-gpu", "--report", str(report), *ca, *extra], text=True, stderr=subprocess.PIPE)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"bench: project failed:\n{done.stderr[-3000:]}")
    return seconds, json.loads(report.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--ca-bundle")
    parser.add_argument("--skip-plain", action="store_true", help="no plain FROM+pip image (step 5)")
    args = parser.parse_args()
    ca = ["--ca-bundle", args.ca_bundle] if args.ca_bundle else []
    run = uuid.uuid4().hex[:8]
    made: list[str] = []
    base_ref = f"{args.registry}/bench-{run}/base:1"
    try:
        sh("docker", "tag", args.base, base_ref)
        made.append(base_ref)
        print(f"bench: pushing the base to {base_ref}", file=sys.stderr, flush=True)
        sh("docker", "push", base_ref)
        with tempfile.TemporaryDirectory(prefix="bench-project-") as tmp:
            folder = Path(tmp) / "benchtrainer"
            (folder / "benchtrainer").mkdir(parents=True)
            (folder / "pyproject.toml").write_text(PYPROJECT)
            (folder / "benchtrainer" / "__init__.py").write_text(f"RUN = '{run}'\n")
            tag1, tag2 = f"{args.registry}/bench-{run}/project:1", f"{args.registry}/bench-{run}/project:2"
            before = storage_bytes(args.registry)
            first_s, first = project_run(folder, base_ref, tag1, ca, "--no-cache", "--push")
            made.append(tag1)
            added = storage_bytes(args.registry) - before
            (folder / "benchtrainer" / "__init__.py").write_text(f"RUN = '{run}-2'\n")
            code_s, code = project_run(folder, base_ref, tag2, ca)
            made.append(tag2)
            base_layers = manifest_layers(args.registry, f"bench-{run}/base", "1")
            layers = manifest_layers(args.registry, f"bench-{run}/project", "1")
            own = [size for digest, size in layers if (digest, size) not in base_layers]
            print(f"first build: {first_s:.1f} s wall, {first['build_seconds']:.1f} s build "
                  f"({first['executed_steps']} steps ran)")
            print(f"code change: {code_s:.1f} s wall, {code['build_seconds']:.1f} s build "
                  f"({code['executed_steps']} steps ran, lock reused: {code['lock_reused']})")
            print(f"  ratio (build): {code['build_seconds'] / first['build_seconds']:.2f}x  target <= 0.3x")
            print(f"  ratio (wall, proof included): {code_s / first_s:.2f}x")
            print(f"push: {added} bytes added to the registry; own layers {sum(own)} bytes "
                  f"({len(own)} layers; the base's {len(base_layers)} mounted): {added / max(1, sum(own)):.3f}x  "
                  "target <= 1.05x")
            if not args.skip_plain:
                os_base = json.loads(sh("docker", "image", "inspect", args.base, "--format",
                                        "{{json .Config.Labels}}").stdout).get("org.opencontainers.image.base.name")
                torch = json.loads(sh("docker", "image", "inspect", args.base, "--format",
                                      "{{json .Config.Labels}}").stdout)["io.imagebuilder.torch"]
                (folder / "Dockerfile.plain").write_text(PLAIN.format(os_base=os_base, torch=torch))
                (folder / "ca.pem").write_bytes(Path(args.ca_bundle or "/etc/ssl/certs/ca-certificates.crt").read_bytes())
                plain = f"{args.registry}/bench-{run}/plain:1"
                print(f"bench: building the plain image FROM {os_base}", file=sys.stderr, flush=True)
                made.append(plain)
                sh("docker", "buildx", "build", "--output", f"type=image,name={plain},compression=zstd,force-compression=true",
                   "-f", str(folder / "Dockerfile.plain"), str(folder))
                sh("docker", "push", plain)
                plain_bytes = sum(size for _, size in manifest_layers(args.registry, f"bench-{run}/plain", "1"))
                print(f"pull on a node with the base: project {sum(own)} bytes; plain FROM+pip image {plain_bytes} "
                      f"bytes: {sum(own) / plain_bytes:.3f}x  target <= 0.2x")
    finally:
        for ref in reversed(made):
            subprocess.run(["docker", "image", "rm", ref], capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
