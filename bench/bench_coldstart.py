"""Benchmark: cold start through a real link, and what a second release adds (issue 30, item 2).

One run, on the local Docker Engine (BuildKit, containerd image store) with a local registry
(.ci/registry.sh) and an empty second engine in its own network namespace (tests/remote_engine.py)
whose downloads cross a veth pair shaped with tc's token bucket (`tbf rate RATE burst 1mb latency
50ms` on the host's end of the pair: its egress is what the engine downloads):

  1. "groups": `imagebuilder publish` of the torch 2.6 / CUDA 12.4 runtime image (Debian 12,
     Python 3.11, --base-image imagebuilder-base:bookworm, zstd): its wheels in the eight
     wheel-group layers (imagebuilder/build/layers.py). "one-layer": the same image with those layers
     replaced by ONE layer of the venv (below). Each image's layers and registry bytes.
  2. For each rate of --rates and each image, on the emptied engine: `docker pull` (a), then
     `docker run --rm IMAGE python -c "import torch"`; (b) is the wall time from the pull's start
     to that container's exit (one pull gives both). Bytes through the link: the host end's
     tx_bytes (/sys/class/net/LINK/statistics) before and after the pull, which counts TCP/IP
     headers and the docker CLI's requests to the engine too. The engine is emptied before each
     image (`docker system prune --all --force --volumes` there: it is this run's own), and a pull
     that moved under 90% of the image's registry bytes is reported NOT COLD.
  3. Unless --skip-25: torch 2.5 / CUDA 12.4 (Python 3.11; its lock pins 2.6's NVIDIA wheels but
     for cuSPARSELt, which it lacks) published into the same repository, and its one-layer
     variant. For each layout: the registry bytes 2.5's manifest adds to 2.6's (its blobs that
     2.6's manifest lacks) against 2.6's bytes; and, at the first rate, the bytes and seconds of
     pulling 2.5 by the engine still holding 2.6 from step 2, against 2.5's bytes. The one-layer
     numbers are "before": today's one-layer layout shares no venv layer between releases.

  4. Unless --skip-lazy (issue 44): 2.6 published four more times from the warm build cache, each
     into its own repository and timed: zstd again (the publish the others are measured against),
     eStargz without a start profile (`--start-command ''`: every layer .no.prefetch.landmark, as
     BuildKit's eStargz) and eStargz ordered by the default start profile (the files `import torch`
     and a first torch.compile open, first in each layer, then the prefetch landmark), and
     zstd:chunked ordered the same way (the same layout in zstd frames). For each
     rate and eStargz image a new empty engine whose containerd runs the stargz snapshotter
     (tests/remote_engine.py, lazy=True): `docker pull` mounts the layers and fetches their tables
     of contents (ordered: and prefetches the profile's files, one range read a layer), then the
     start fetches what it reads. The start, in every layout: `python -c START`, which prints when
     `import torch` returned and when a first torch.compile (Inductor, C++ on CPU) gave its result;
     the bytes through the link are sampled every SAMPLE_S. `--only lazy` runs this step with the
     one-layer image's cold starts alone (no 2.5, no groups pulls, no Slurm).

  5. Unless --skip-slurm: the Slurm path (bench/coldstart_slurm.py; the groups 2.6 image is published
     with --squashfs): for each rate, (a) enroot's import today (curl the layers through the link,
     unpack, mksquashfs -comp lzo -noD), squashfuse, import torch; (b) `imagebuilder squashfs` through
     the link, squashfuse, import torch. Each step's seconds, and the registry bytes the squashfs
     adds. `--only slurm` runs this step alone (one publish, no one-layer variants, no docker pulls).

Targets (against one-layer): cold start, pull to import torch, <= 0.7x at 1 Gbit/s (and shown at
200 Mbit/s), for groups; <= 0.15x for the ordered eStargz (issue 44), whose publish is <= 1.3x the
zstd publish's seconds and <= 1.15x its registry bytes; 2.5 after 2.6 with groups: registry bytes added <= 0.5x
2.6's, bytes pulled <= 0.4x 2.5's. Slurm: (b) <= 0.4x (a) at 1 Gbit/s.

The one-layer image (bench/manifests.py): the groups image with its wheel-group layers (eight;
seven for 2.5) replaced, in their place, by one layer of /opt/venv; the base, the apt layer, the
layers above the venv and the config (but for its layers and history) are the groups image's own,
blob for blob, so the two differ in the venv's layering alone, and the one-layer 2.5 and 2.6 share
their base and apt layers as the images before the groups did. The layer is `docker buildx build`
of `FROM scratch` + `COPY --from=GROUPS_IMAGE --chown=1000:1000 /opt/venv /opt/venv` (the venv as
the two-stage layout copies it), pushed with `--output type=image,name=...,push=true,
compression=zstd,force-compression=true,oci-mediatypes=true` to another repository
(pytorch-onelayer); beside it the run writes a manifest and config that splice it in (the groups'
history entries become one), the other blobs mounted from the groups image's repository. Not
`FROM base` + COPY of everything: that would fold the apt layer and the files above the venv into
the comparison, and a COPY of / onto the base writes the base's files into the layer again. (The
venv layer also holds imagebuilder.pth, 18 bytes, which the groups image adds in a later layer.)

Registry bytes: the config and layers of an image's linux/amd64 manifest, what a node pulls (not
the provenance attestation, nor the registry cache that publish writes to another repository).

Run, as root (ip netns, tc, nsenter, a second dockerd), alone on the daemon (the BuildKit records
it prunes at the end are all those added while it ran):
    .venv/bin/python bench/bench_coldstart.py [--rates 1gbit,200mbit] [--skip-25] [--only slurm|lazy]
Needs the daemon with the containerd image store, buildx, imagebuilder-base:bookworm (.ci/setup),
docker-registry and, behind a TLS-intercepting proxy, SSL_CERT_FILE. About 20 minutes on 2 cores
(estimated: the two publishes ~6 min, the one-layer variants ~3 min, the pulls the rest) and ~45 GB
of disk at its peak (both engines). Removes what it made, however it ends: its local tags (each names
bench-cold-RUN), its BuildKit records (by id; on Docker 26 any prune also makes the daemon forget
the cache keys of the records it keeps, so the host's next build runs cold:
docs/buildkit-and-arm64.md), the registry and the engine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # remote_engine (the empty engine behind the link), build_records

from bench.bench_publish import say, sh  # noqa: E402
from bench.coldstart_slurm import SlurmStart, slurm_starts, squashfs_bytes  # noqa: E402
from bench.coldstart_slurm import report as slurm_report  # noqa: E402
from bench.manifests import Image, added_bytes, layer_labels, splice_venv_layer  # noqa: E402
from imagebuilder.build.image_contents import USER_ID, VENV  # noqa: E402
from imagebuilder.estargz.pages import REPORT  # noqa: E402
from imagebuilder.estargz.profile import TORCH_START  # noqa: E402
from imagebuilder.registry.client import HttpRegistry  # noqa: E402
from imagebuilder.registry.manifests import INDEXES, OCI_MANIFEST, pick_manifest  # noqa: E402
from imagebuilder.registry.reference import parse_reference  # noqa: E402
from imagebuilder.build.table import format_table  # noqa: E402
from build_records import build_cache_records, prune_records  # noqa: E402
from remote_engine import limit_rate, remote_engine  # noqa: E402

BASE = "imagebuilder-base:bookworm"
FIRST, SECOND, CUDA, OS, PYTHON = "2.6", "2.5", "12.4", "debian12", "3.11"
RUN = uuid.uuid4().hex[:6]
NAMESPACE = f"bench-cold-{RUN}"  # in every local tag and registry path this run makes
ONE_LAYER_REPOSITORY = "pytorch-onelayer"
ONE_LAYER, GROUPS, LAZY = "one-layer", "groups", "lazy"  # the layouts
UNORDERED, ZSTD_AGAIN = "estargz-unordered", "zstd-again"  # eStargz without a start profile; zstd, warm
CHUNKED = "zstd-chunked"  # zstd:chunked, ordered as LAZY is, and the chunks the import touched copied ahead
CHUNKED_FILES = "zstd-chunked-files"  # the same, by whole files alone (the start prints no pages report)
LAZY_LAYOUTS = (UNORDERED, LAZY, CHUNKED_FILES, CHUNKED)
RATES = "1gbit,200mbit"
COLD = 0.9  # a cold pull moves at least this share of the image's registry bytes through the link
PULL_TIMEOUT_S, RUN_TIMEOUT_S, PUBLISH_TIMEOUT_S = 1800, 600, 2400
VENV_LAYER_DOCKERFILE = """\
FROM scratch
COPY --from={source} --chown={uid}:{uid} {venv} {venv}
"""
_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)")
_BITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}  # tc's rate units are decimal


# --------------------------------------------------------------------------- the link


def parse_layouts(text: str) -> tuple[str, ...]:
    layouts = tuple(part.strip() for part in text.split(",") if part.strip())
    bad = [name for name in layouts if name not in LAZY_LAYOUTS]
    if not layouts or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: give lazy layouts among {', '.join(LAZY_LAYOUTS)}")
    return layouts


def parse_rates(text: str) -> tuple[str, ...]:
    """`1gbit,200mbit` -> ("1gbit", "200mbit"); `none` is the unshaped link."""
    rates = tuple(part.strip() for part in text.split(",") if part.strip())
    bad = [rate for rate in rates if rate != "none" and not _RATE.fullmatch(rate)]
    if not rates or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: give tc rates in bit, kbit, mbit or gbit, or none, "
                                         "comma-separated, e.g. 1gbit,200mbit")
    return rates


def link_bytes_per_s(rate: str) -> float | None:
    """What the token bucket lets through, in bytes per second; None: unshaped."""
    found = _RATE.fullmatch(rate)
    return None if found is None else float(found[1]) * _BITS[found[2]] / 8


# --------------------------------------------------------------------------- this host


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Published:
    ref: str
    seconds: float
    """The publish's wall time (build, verify, push; the CLI's start included)."""
    entry: Mapping[str, Any]
    """Its --report entry (the phases' seconds, the eStargz push's own)."""


def publish(registry: str, torch: str, compression: str = "zstd", squashfs: bool = False,
            start_command: str | None = None) -> Published:
    """Publish the runtime image of `torch` into `registry`; its ref there and how long it took."""
    ca = os.environ.get("SSL_CERT_FILE")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        started = time.perf_counter()
        sh(sys.executable, "-m", "imagebuilder", "publish", "--torch", torch, "--cuda", CUDA, "--os", OS,
           "--python", PYTHON, "--variant", "runtime", "--base-image", BASE, *(("--ca-bundle", ca) if ca else ()),
           "--builder", "buildkit", "--allow-no-gpu", "--compression", compression, "--registry", registry,
           *(("--start-command", start_command) if start_command is not None else ()),
           "--report", str(report), "--quiet", *(("--squashfs",) if squashfs else ()), env={**os.environ, "GITHUB_SHA": "0" * 40}, timeout=PUBLISH_TIMEOUT_S)
        entry = json.loads(report.read_text())["images"][0]
        return Published(str(entry["ref"]), time.perf_counter() - started, entry)


def read_image(registry: HttpRegistry, ref: str) -> Image:
    found = registry.manifest(ref)
    if found is not None and (found[1] in INDEXES or found[0].get("mediaType") in INDEXES):
        found = registry.manifest(f"{parse_reference(ref).name}@{pick_manifest(found[0])}")
    config = registry.image_config(ref)
    if found is None or config is None:
        sys.exit(f"{ref} is not in the registry")
    return Image(ref, found[0], config[0])


def _write(url: str, body: bytes, headers: Mapping[str, str], method: str = "PUT") -> str:
    """One write to this run's registry (loopback, http, no auth); the Location it answers."""
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(response.headers.get("Location") or "")


def write_image(registry: HttpRegistry, ref: str, manifest: bytes, config: bytes, mount_from: Image) -> None:
    """Write `manifest` as `ref` (host/repository:tag on this run's registry): its config uploaded,
    the layers it shares with `mount_from` mounted from that image's repository (the others must
    be in `ref`'s already)."""
    r = parse_reference(ref)
    api = f"http://{r.api_host}/v2/{r.repository}/"
    document = json.loads(manifest)
    for layer in document["layers"]:
        if layer["digest"] in mount_from.blobs and not registry.mount(ref, layer["digest"], mount_from.ref):
            sys.exit(f"the registry did not mount {layer['digest']} from {mount_from.ref} into {r.repository}")
    upload = urllib.parse.urljoin(api, _write(api + "blobs/uploads/", b"", {"Content-Length": "0"}, method="POST"))
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    _write(upload + ("&" if "?" in upload else "?") + urllib.parse.urlencode({"digest": digest}), config,
           {"Content-Type": "application/octet-stream"})
    _write(api + f"manifests/{r.tag}", manifest, {"Content-Type": document.get("mediaType") or OCI_MANIFEST})


def one_layer_variant(registry: HttpRegistry, repository: str, groups: Image) -> Image:
    """The one-layer variant of `groups` in `repository` (host/path), under its tag."""
    tag = parse_reference(groups.ref).tag
    assert tag, f"{groups.ref} has no tag"
    venv_ref, ref = f"{repository}:venv-{tag}", f"{repository}:{tag}"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Dockerfile").write_text(VENV_LAYER_DOCKERFILE.format(source=groups.ref, uid=USER_ID, venv=VENV))
        sh("docker", "buildx", "build", "--progress=plain", "--provenance=false", "--output",
           f"type=image,name={venv_ref},push=true,compression=zstd,force-compression=true,oci-mediatypes=true", tmp,
           timeout=PUBLISH_TIMEOUT_S)
    # The registry has it; this daemon needs none of its 6 GB.
    subprocess.run(["docker", "image", "rm", venv_ref], capture_output=True, check=False)
    venv = read_image(registry, venv_ref)
    manifest, config = splice_venv_layer(groups, venv)
    write_image(registry, ref, manifest, config, mount_from=groups)
    return read_image(registry, ref)


def remove_ours() -> None:
    """Untag every local image whose name carries this run's namespace (and so remove it)."""
    listing = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                             capture_output=True, text=True, check=False).stdout.split()
    for ref in (ref for ref in listing if NAMESPACE in ref):
        subprocess.run(["docker", "image", "rm", ref], capture_output=True, check=False)


# --------------------------------------------------------------------------- the empty engine


def on_node(engine: Any, *argv: str, timeout: float = 600,
            progress: Callable[[], str] = lambda: "") -> subprocess.CompletedProcess[str]:
    """`docker ARGV` on the empty engine: never on this host's daemon (the environment names it)."""
    return sh("docker", *argv, env=engine.env(), timeout=timeout, progress=progress)


def check_node(engine: Any) -> None:
    here = sh("docker", "info", "--format", "{{.DockerRootDir}}").stdout.strip()
    there = on_node(engine, "info", "--format", "{{.DockerRootDir}}").stdout.strip()
    if not there or there == here:
        sys.exit(f"the empty engine answers with this host's data root ({there!r}): refusing to prune it")


def empty(engine: Any) -> None:
    on_node(engine, "system", "prune", "--all", "--force", "--volumes")
    left = on_node(engine, "image", "ls", "--all", "--quiet").stdout.split()
    if left:
        sys.exit(f"the empty engine still has images after a prune: {left}")


def sent(link: str) -> int:
    return int(Path(f"/sys/class/net/{link}/statistics/tx_bytes").read_text())


@dataclass(frozen=True)
class Pull:
    seconds: float
    bytes: int
    """Through the link (its host end's tx_bytes) while the pull ran."""
    ready_s: float | None = None
    """From the pull's start to the moment `import torch` returned in the image (START prints it)."""
    ready_bytes: int | None = None
    """Through the link from the pull's start to that moment (sampled every SAMPLE_S; a lazy pull
    fetches as torch reads)."""
    compiled_s: float | None = None
    """From the pull's start to the first torch.compile's result (Inductor's C++ compile, on CPU)."""
    compiled_bytes: int | None = None


# The start that matters, timed inside the container: import torch, then a first torch.compile.
START = ("import time, torch; print('IMPORTED', time.time(), flush=True); "
         "f = torch.compile(lambda x: (x.sin() + 1).sum()); f(torch.ones(64)); "
         "print('COMPILED', time.time(), flush=True)")
SAMPLE_S = 0.2


def pull(engine: Any, image: Image, run: bool) -> Pull:
    before, start, wall = sent(engine.link), time.perf_counter(), time.time()
    on_node(engine, "pull", "--quiet", image.ref, timeout=PULL_TIMEOUT_S,
            progress=lambda: f", {(sent(engine.link) - before) / 1e6:,.0f} MB through the link")
    seconds, moved = time.perf_counter() - start, sent(engine.link) - before
    if not run:
        return Pull(seconds, moved)
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_S):
            samples.append((time.time(), sent(engine.link) - before))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        done = on_node(engine, "run", "--rm", image.ref, "python", "-c", START, timeout=RUN_TIMEOUT_S,
                       progress=lambda: f", {(sent(engine.link) - before) / 1e6:,.0f} MB through the link")
    finally:
        stop.set()
        sampler.join()
    marks = {line.split()[0]: float(line.split()[1]) for line in done.stdout.splitlines()
             if line.split()[:1] in (["IMPORTED"], ["COMPILED"])}
    if set(marks) != {"IMPORTED", "COMPILED"}:
        sys.exit(f"the start in {image.ref} printed no IMPORTED and COMPILED times: {done.stdout[-2000:]}")

    def moved_by(moment: float) -> int:
        return max((b for t, b in samples if t <= moment), default=moved)

    return Pull(seconds, moved, marks["IMPORTED"] - wall, moved_by(marks["IMPORTED"]),
                marks["COMPILED"] - wall, sent(engine.link) - before)


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Layout:
    name: str
    first: Image
    """torch 2.6's image."""
    second: Image | None
    """torch 2.5's (None: --skip-25)."""

    def images(self) -> list[tuple[str, Image]]:
        return [(FIRST, self.first), *(((SECOND, self.second),) if self.second is not None else ())]


@dataclass
class Results:
    rates: tuple[str, ...]
    layouts: list[Layout] = field(default_factory=list)
    cold: dict[tuple[str, str], Pull] = field(default_factory=dict)
    """(rate, layout) -> 2.6's cold pull and start."""
    after: dict[str, Pull] = field(default_factory=dict)
    """layout -> 2.5's pull on the engine holding 2.6, at the first rate."""
    warm: dict[tuple[str, str], float] = field(default_factory=dict)
    """(rate, lazy layout) -> seconds from `docker run` to import torch done, run again on the same
    node after its cold start (what the start read is in the snapshotter's cache: FUSE's floor)."""
    lazies: list[Layout] = field(default_factory=list)
    """The eStargz images (2.6; unordered, then ordered by the start profile), each pulled by an
    engine whose containerd runs the stargz snapshotter."""
    publishes: dict[str, Published] = field(default_factory=dict)
    """ZSTD_AGAIN and the eStargz layouts: their publishes from the same warm build cache."""
    zstd_bytes: int | None = None
    """The zstd image's registry bytes (ZSTD_AGAIN's: the groups image's, blob for blob)."""
    lazy_layouts: tuple[str, ...] = LAZY_LAYOUTS
    slurm: list[SlurmStart] = field(default_factory=list)
    """The Slurm path's starts, (a) and (b) at each rate."""
    squashfs_bytes: int | None = None
    """Registry bytes the squashfs artifact of groups 2.6 adds (its blob and manifest)."""
    slurm_image: Image | None = None


def lazy_publishes(address: str, registry: HttpRegistry, results: Results) -> None:
    """2.6 published again from the warm build cache, each into its own repository: as zstd (the
    publish the eStargz ones are measured against), as eStargz without a start profile
    (`--start-command ''`: every layer .no.prefetch.landmark, as BuildKit's eStargz), as
    eStargz ordered by the default start profile (import torch, a first torch.compile), and as
    zstd:chunked ordered by it: by whole files alone (CHUNKED_FILES), and with the chunks the
    import touched copied ahead (CHUNKED); those of `results.lazy_layouts`."""
    files_only = shlex.join(part.replace(REPORT, "") for part in TORCH_START)  # no pages: whole files alone
    for name, compression, start in ((ZSTD_AGAIN, "zstd", None), (UNORDERED, "estargz", ""),
                                     (LAZY, "estargz", None), (CHUNKED_FILES, "zstd:chunked", files_only),
                                     (CHUNKED, "zstd:chunked", None)):
        if name != ZSTD_AGAIN and name not in results.lazy_layouts:
            continue
        say(f"publishing the torch {FIRST} / CUDA {CUDA} runtime image again, {name} (warm build cache)")
        done = results.publishes[name] = publish(f"{address}/{NAMESPACE}/{name}", FIRST, compression=compression,
                                                 start_command=start)
        image = read_image(registry, done.ref)
        say(f"  {done.seconds:.1f}s; {image.describe()}")
        if name == ZSTD_AGAIN:
            results.zstd_bytes = image.bytes
        else:
            results.lazies.append(Layout(name, image, None))


def lazy_starts(port: int, results: Results) -> None:
    """Cold starts of the eStargz images on an empty engine that pulls lazily: containerd with the
    stargz snapshotter (tests/remote_engine.py, lazy=True). The pull mounts each layer and fetches
    its table of contents (and, ordered, prefetches the profile's files in one read a layer); the
    start then fetches what it reads, as it reads it (and the snapshotter fetches the rest in the
    background). A new engine per rate and image: each starts empty."""
    for rate in results.rates:
        for layout in results.lazies:
            say(f"starting an empty lazy-pulling engine (stargz snapshotter) behind the link, {rate}")
            with remote_engine(port, lazy=True) as engine:
                check_node(engine)
                limit_rate(engine.link, None if rate == "none" else rate)
                say(f"{rate}: {layout.name} {FIRST}, cold: pull, then import torch and a first torch.compile")
                cold = results.cold[rate, layout.name] = pull(engine, layout.first, run=True)
                say(f"  pull {cold.seconds:.1f}s ({cold.bytes:,} bytes), import torch done at {cold.ready_s:.1f}s "
                    f"({cold.ready_bytes:,} bytes by then), torch.compile done at {cold.compiled_s:.1f}s")
                results.warm[rate, layout.name] = warm = warm_start(engine, layout.first)
                say(f"  again on the same node (read from the snapshotter's cache): import torch done {warm:.1f}s "
                    "after `docker run`")


def warm_start(engine: Any, image: Image) -> float:
    """Seconds from `docker run` to import torch done, for an image the node has started before."""
    wall = time.time()
    done = on_node(engine, "run", "--rm", image.ref, "python", "-c", START, timeout=RUN_TIMEOUT_S)
    marks = {line.split()[0]: float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("IMPORTED")}
    if "IMPORTED" not in marks:
        sys.exit(f"the start in {image.ref} printed no IMPORTED time: {done.stdout[-2000:]}")
    return marks["IMPORTED"] - wall


def slurm_path(port: int, results: Results, image: Image) -> None:
    """The Slurm path at each rate (bench/coldstart_slurm.py), on a new namespace behind the link."""
    say("starting the empty node behind the link (the Slurm path)")
    with remote_engine(port) as engine:
        for rate in results.rates:
            limit_rate(engine.link, None if rate == "none" else rate)
            say(f"{rate}: the Slurm path, (a) enroot's import, (b) the published squashfs, (c) read lazily")
            results.slurm.extend(slurm_starts(engine, image, rate, sent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=parse_rates, default=parse_rates(RATES),
                        help=f"tc rates of the link, one pass each (default {RATES}; none: unshaped)")
    parser.add_argument("--skip-25", action="store_true", help="skip torch 2.5: no shared-layer numbers")
    parser.add_argument("--skip-lazy", action="store_true",
                        help="skip the eStargz image pulled lazily (containerd's stargz snapshotter)")
    parser.add_argument("--skip-slurm", action="store_true",
                        help="skip the Slurm path (enroot's import against the squashfs publish --squashfs pushes)")
    parser.add_argument("--only", choices=("slurm", "lazy"),
                        help="run one step alone: slurm, the Slurm path (one publish, no docker pulls); lazy, "
                             "the eStargz publishes against zstd and their cold starts against one-layer's (no "
                             "2.5, no groups pulls, no Slurm)")
    parser.add_argument("--lazy-layouts", type=parse_layouts, default=LAZY_LAYOUTS,
                        help=f"the lazy layouts to publish and start (default {','.join(LAZY_LAYOUTS)})")
    args = parser.parse_args()
    if args.only == "slurm" and args.skip_slurm or args.only == "lazy" and args.skip_lazy:
        parser.error(f"--only {args.only} and --skip-{args.only} contradict each other")
    if args.only == "lazy":
        args.skip_25 = args.skip_slurm = True
    before = build_cache_records("docker")
    port = free_port()
    results = Results(args.rates, lazy_layouts=args.lazy_layouts)
    try:
        address = sh(str(ROOT / ".ci" / "registry.sh"), "start", str(port)).stdout.strip().splitlines()[-1]
        registry = HttpRegistry(config={})
        if args.only == "slurm":
            say(f"publishing the torch {FIRST} / CUDA {CUDA} runtime image with --squashfs")
            results.slurm_image = read_image(registry, publish(f"{address}/{NAMESPACE}", FIRST, squashfs=True).ref)
            results.squashfs_bytes = squashfs_bytes(registry, results.slurm_image)
            remove_ours()
            prune_records("docker", before, keep_cache_mounts=False)
            slurm_path(port, results, results.slurm_image)
            return
        releases = (FIRST,) if args.skip_25 else (FIRST, SECOND)
        groups: dict[str, Image] = {}
        for torch in releases:
            say(f"publishing the torch {torch} / CUDA {CUDA} runtime image (wheel-group layers, zstd)")
            squashfs = torch == FIRST and not args.skip_slurm
            groups[torch] = read_image(registry, publish(f"{address}/{NAMESPACE}", torch, squashfs=squashfs).ref)
            if squashfs:
                results.slurm_image = groups[torch]
                results.squashfs_bytes = squashfs_bytes(registry, groups[torch])
            say(f"  {groups[torch].describe()}")
        one: dict[str, Image] = {}
        for torch in releases:
            say(f"the one-layer variant of torch {torch}")
            one[torch] = one_layer_variant(registry, f"{address}/{NAMESPACE}/{ONE_LAYER_REPOSITORY}", groups[torch])
            say(f"  {one[torch].describe()}")
        results.layouts = [Layout(ONE_LAYER, one[FIRST], one.get(SECOND)),
                           Layout(GROUPS, groups[FIRST], groups.get(SECOND))]
        if not args.skip_lazy:
            lazy_publishes(address, registry, results)
        # Everything is in the registry now: this daemon's copies (~9 GB an image with its build
        # records) would crowd out the engines' pulls on the shared disk.
        remove_ours()
        prune_records("docker", before, keep_cache_mounts=False)
        say(f"local images and build records removed: {shutil.disk_usage('/tmp').free / 1e9:.1f} GB free for the engines")
        say("starting the empty engine behind the link")
        with remote_engine(port) as engine:
            check_node(engine)
            for number, rate in enumerate(args.rates):
                limit_rate(engine.link, None if rate == "none" else rate)
                say(f"{rate}: {sh('tc', 'qdisc', 'show', 'dev', engine.link).stdout.strip()}")
                for layout in results.layouts:
                    if args.only == "lazy" and layout.name != ONE_LAYER:
                        continue
                    empty(engine)
                    say(f"{rate}: {layout.name} {FIRST}, cold: pull, then import torch")
                    cold = results.cold[rate, layout.name] = pull(engine, layout.first, run=True)
                    say(f"  pull {cold.seconds:.1f}s, import torch done at {cold.ready_s:.1f}s, "
                        f"{cold.bytes:,} bytes through the link")
                    if number == 0 and layout.second is not None:
                        say(f"{rate}: {layout.name} {SECOND} on the engine holding {FIRST}")
                        after = results.after[layout.name] = pull(engine, layout.second, run=False)
                        say(f"  pull {after.seconds:.1f}s, {after.bytes:,} bytes through the link")
        if results.lazies:
            lazy_starts(port, results)
        if results.slurm_image is not None:
            slurm_path(port, results, results.slurm_image)
    finally:
        remove_ours()
        subprocess.run([str(ROOT / ".ci" / "registry.sh"), "stop", str(port)], capture_output=True, check=False)
        prune_records("docker", before, keep_cache_mounts=False)
        report(results)


# --------------------------------------------------------------------------- the report


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def report(results: Results) -> None:
    """Every number measured, also when a later step failed; then the ratios and their targets."""
    if results.slurm_image is not None:
        slurm_report(results.slurm, results.slurm_image.bytes, results.squashfs_bytes)
    if not results.layouts:
        return
    _images(results.layouts + results.lazies)
    if results.publishes:
        _publishes(results)
    if results.cold:
        _cold_starts(results)
    if results.warm:
        print("\nthe same start again on each lazy node (everything it read cached): docker run to import torch done")
        print(format_table(("rate", "image", "s"), [(rate, name, f"{seconds:.1f}")
                                                    for (rate, name), seconds in results.warm.items()]))
    if any(layout.second is not None for layout in results.layouts):
        _second_release(results)
    _ratios(results)


def _images(layouts: list[Layout]) -> None:
    print("\nimages (registry bytes: the config and layers of the linux/amd64 manifest)")
    print(format_table(("image", "layers", "registry bytes", "ref"), [
        (f"{layout.name} {torch}", len(image.manifest["layers"]), f"{image.bytes:,}", image.ref)
        for layout in layouts for torch, image in layout.images()]))
    for layout in layouts:
        for torch, image in layout.images():
            shared = layout.first.blobs if image is layout.second else {}
            print(f"\n{layout.name} {torch}'s layers" + (f" (* also in {FIRST}'s manifest)" if shared else ""))
            print(format_table(("layer", "MB", ""), [
                (label, f"{blob['size'] / 1e6:,.2f}", "*" if blob["digest"] in shared else "")
                for label, blob in zip(layer_labels(image.config), image.manifest["layers"])]))


def _cold_starts(results: Results) -> None:
    print(f"\ncold start of {FIRST} on the emptied engine (import torch done: from the pull's start; a pull that "
          f"moved under {COLD:.0%} of the image's bytes is NOT COLD)")
    rows = []
    layouts = results.layouts + results.lazies
    for (rate, name), done in results.cold.items():
        image = next(layout.first for layout in layouts if layout.name == name)
        link = link_bytes_per_s(rate)
        # A lazy pull moves little by design: its engine is new and empty, so it is cold.
        cold = "lazy: fetched as read" if name in LAZY_LAYOUTS else "" if done.bytes >= COLD * image.bytes else "NOT COLD"
        rows.append((rate, name, f"{done.seconds:.1f}", "-" if done.ready_s is None else f"{done.ready_s:.1f}",
                     "-" if done.compiled_s is None else f"{done.compiled_s:.1f}",
                     f"{done.bytes:,}", "-" if done.ready_bytes is None else f"{done.ready_bytes:,}",
                     "-" if done.compiled_bytes is None else f"{done.compiled_bytes:,}",
                     f"{done.bytes / done.seconds / 1e6:.1f}", "-" if link is None else f"{link / 1e6:.1f}", cold))
    print(format_table(("rate", "image", "pull s", "import torch done s", "torch.compile done s", "bytes (pull)",
                        "bytes (by import done)", "bytes (by compile done)", "MB/s (pull)", "link MB/s", ""), rows))


def _publishes(results: Results) -> None:
    """The warm publishes side by side: seconds, phases, registry bytes, against zstd's."""
    print(f"\npublishes of {FIRST} from the warm build cache (seconds: the CLI's wall time; the phases from its report)")
    zstd = results.publishes.get(ZSTD_AGAIN)
    images = {layout.name: layout.first for layout in results.lazies}
    rows = []
    for name, done in results.publishes.items():
        e, conv = done.entry, done.entry.get("estargz") or {}
        image = images.get(name)
        size = image.bytes if image is not None else None
        zstd_size = zstd.entry.get("pushed_bytes") if zstd is not None else None
        rows.append((name, f"{done.seconds:.1f}", _ratio(done.seconds, zstd.seconds if zstd else None),
                     *(f"{e.get(k) or 0:.1f}" for k in ("build_s", "verify_s", "push_s")),
                     *("-" if conv.get(k) is None else f"{conv[k]:.1f}" for k in ("save_s", "profile_s", "estargz_s")),
                     "-" if size is None else f"{size:,}", _ratio(size, results.zstd_bytes) if size else "-",
                     f"{zstd_size}" if name == ZSTD_AGAIN else ""))
        profile = (conv.get("profile") or {})
        if profile:
            reads = profile.get("reads") or {}
            opened = sum(size for size, _ in reads.values())
            read = sum(done_bytes for _, done_bytes in reads.values())
            ahead = sum(layer.get("prioritized_bytes") or 0 for layer in conv.get("layers") or [])
            print(f"  {name}: the start profile ({profile.get('command')}, {profile.get('seconds')} s under strace) "
                  f"opened {len(profile.get('files') or [])} files of {opened / 1e6:,.1f} MB, read "
                  f"{read / 1e6:,.1f} MB of them (4 MiB chunks); {profile.get('prefetched')} files, "
                  f"{ahead / 1e6:,.1f} MB, go before the landmarks")
    print(format_table(("publish", "s", "/ zstd", "build s", "verify s", "push s", "save s", "profile s", "write s",
                        "registry bytes", "/ zstd's", ""), rows))


def _second_release(results: Results) -> None:
    print(f"\n{SECOND} after {FIRST} (pulled by the engine holding {FIRST}, at {results.rates[0]})")
    rows = []
    for layout in results.layouts:
        if layout.second is None:
            continue
        added, pulled = added_bytes(layout.second, layout.first), results.after.get(layout.name)
        rows.append((layout.name, f"{added:,}", _ratio(added, layout.first.bytes),
                     "-" if pulled is None else f"{pulled.bytes:,}",
                     _ratio(None if pulled is None else pulled.bytes, layout.second.bytes),
                     "-" if pulled is None else f"{pulled.seconds:.1f}"))
    print(format_table(("layout", "registry bytes added", f"/ {FIRST}'s bytes", "bytes pulled",
                        f"/ {SECOND}'s bytes", "pull s"), rows))


def _ratios(results: Results) -> None:
    print(f"\nratios ({GROUPS} / {ONE_LAYER}; the one-layer layout is today's, 'before')")
    for rate in results.rates:
        one, grouped = results.cold.get((rate, ONE_LAYER)), results.cold.get((rate, GROUPS))
        if one is not None and grouped is not None:
            target = "" if rate == "none" else " (target <= 0.7x)"
            print(f"  cold start at {rate}, pull to import torch: {_ratio(grouped.ready_s, one.ready_s)}{target}; "
                  f"the pull alone: {_ratio(grouped.seconds, one.seconds)}")
        for name in LAZY_LAYOUTS:
            lazy = results.cold.get((rate, name))
            if one is None or lazy is None:
                continue
            target = " (target <= 0.15x)" if rate == "1gbit" and name in (LAZY, CHUNKED_FILES, CHUNKED) else ""
            print(f"  cold start at {rate}, {name} (stargz snapshotter) / {ONE_LAYER}: pull to import torch "
                  f"{_ratio(lazy.ready_s, one.ready_s)}{target}; to the first torch.compile "
                  f"{_ratio(lazy.compiled_s, one.compiled_s)}")
    zstd = results.publishes.get(ZSTD_AGAIN)
    for name in LAZY_LAYOUTS:
        done, image = results.publishes.get(name), next((x.first for x in results.lazies if x.name == name), None)
        if done is None or zstd is None or image is None:
            continue
        targets = (" (target <= 1.3x)", " (target <= 1.15x)") if name in (LAZY, CHUNKED_FILES, CHUNKED) else ("", "")
        print(f"  {name} publish / zstd publish: {_ratio(done.seconds, zstd.seconds)}{targets[0]}; registry bytes "
              f"/ zstd's: {_ratio(image.bytes, results.zstd_bytes)}{targets[1]}")
    for layout in results.layouts:
        if layout.second is None:
            continue
        pulled = results.after.get(layout.name)
        targets = (" (target <= 0.4x)", " (target <= 0.5x)") if layout.name == GROUPS else ("", "")
        print(f"  {SECOND} after {FIRST}, {layout.name}: bytes pulled / {SECOND}'s bytes "
              f"{_ratio(None if pulled is None else pulled.bytes, layout.second.bytes)}{targets[0]}; "
              f"registry bytes added / {FIRST}'s bytes "
              f"{_ratio(added_bytes(layout.second, layout.first), layout.first.bytes)}{targets[1]}")


if __name__ == "__main__":
    main()
