"""--compression gzip+zstd for real, with the engines it is for: a small image (a static tini
and 1 MiB of text, FROM scratch) exported by BuildKit as zstd and as gzip, pushed by
publish's push_dual() to a local registry as one index (gzip first, zstd after it, marked);

- Debian 12's Docker 20.10 (.ci/docker-20.10.sh unpacks it; it runs in a network namespace of
  its own with its own data root, as tests/remote_engine.py starts engines) pulls and runs it,
  and fails on the zstd-only image (the positive control); `verify` on it refuses the zstd-only
  image before pulling, naming the gzip image to pull instead where the registry has one;
- Podman (its own storage in a temp dir) pulls one of the two images' manifest and blobs only
  (the registry's log says which went out): the zstd one from Podman 4.5 (containers/image reads
  the mark), the gzip one before (Debian 12's 4.3.1 takes the platform's first entry).

What it costs (registry bytes and seconds, gzip+zstd against zstd alone) is printed (-s).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cleanup import remove_images
from support.real_images import REPO_ROOT
from support.registry import access_log, throwaway_registry
from support.unavailable import _unavailable
from remote_engine import remote_engine

from imagebuilder.engine.api import BuildRequest
from imagebuilder.engine.buildkit import BuildKitBuilder
from imagebuilder.engine.docker import DockerEngine
from imagebuilder.engine.export import Compression, Export, gzip_ref
from imagebuilder.engine.select import detect_buildkit
from imagebuilder.publish.plan import RunOptions
from imagebuilder.publish.push import Pushing, push_dual
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.registry.manifests import ZSTD_ANNOTATION

pytestmark = [pytest.mark.docker, pytest.mark.registry]

DUAL = Compression("gzip+zstd")
TINI = Path("/usr/bin/tini-static")
REGISTRY = HttpRegistry(config={})


def _docker_2010() -> str:
    done = subprocess.run([str(REPO_ROOT / ".ci" / "docker-20.10.sh")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        _unavailable(f"no Docker 20.10 to test with (.ci/docker-20.10.sh): {done.stderr.strip()[-500:]}")
    return done.stdout.strip().splitlines()[-1]


def _layers(ref: str) -> list[dict[str, Any]]:
    found = REGISTRY.manifest(ref)
    assert found is not None, ref
    return list(found[0]["layers"])


@pytest.fixture(scope="module")
def published(docker_engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The small image published gzip+zstd (`dual`) and zstd alone (`zstd_only`), with what
    each cost; the registry's log; every local tag removed afterwards."""
    if not TINI.is_file():
        _unavailable(f"{TINI} (Debian's tini) is the small image's program")
    cli, tried = detect_buildkit()
    if cli is None:
        _unavailable(f"no docker CLI here builds with BuildKit ({'; '.join(tried)})")
    assert cli is not None
    context = tmp_path_factory.mktemp("dual-context")
    marker = uuid.uuid4().hex
    shutil.copy(TINI, context / "tini")
    (context / "text").write_text("".join(f"{i} {hashlib.sha256(f'{marker}{i}'.encode()).hexdigest()[:16]} "
                                          f"line of a text that compresses\n" for i in range(20000)))
    (context / "Dockerfile").write_text(f"FROM scratch\nCOPY tini /tini\nCOPY text /text\nLABEL marker={marker}\n"
                                        'ENTRYPOINT ["/tini", "--version"]\n')
    builder = BuildKitBuilder(cli, docker_engine)
    with throwaway_registry() as address:
        repo = f"{address}/imagebuilder-test/dual-{marker[:8]}"
        dual, zstd_only = f"{repo}:dual", f"{repo}:zstd-only"
        made = [dual, gzip_ref(dual), zstd_only]
        try:
            seconds: dict[str, float] = {}

            def build(tag: str, compression: Compression, where: Path = context) -> str:
                started = time.monotonic()
                result = builder.build(BuildRequest(context=where, tags=(tag,), export=Export(compression)))
                seconds[f"build {tag.rsplit(':', 1)[1]}"] = time.monotonic() - started
                return result.image_id

            zstd_id = build(dual, DUAL)  # what gzip+zstd exports first: zstd (DUAL.exported)
            assert DUAL.also is not None
            gzip_id = build(gzip_ref(dual), DUAL.also)
            options = RunOptions(matrix_path=REPO_ROOT / "matrix.yaml", push_retries=1, push_backoff=0,
                                 export=Export(DUAL))
            started = time.monotonic()
            done = Pushing()
            index = push_dual((dual,), zstd_id, gzip_id, docker_engine, REGISTRY, options, done)
            seconds["push gzip+zstd"] = time.monotonic() - started
            # Another image (its config differs): Docker 20.10 would find the dual image's config
            # (its image id) present and pull nothing.
            other = tmp_path_factory.mktemp("zstd-only-context")
            shutil.copytree(context, other, dirs_exist_ok=True)
            with (other / "Dockerfile").open("a") as dockerfile:
                dockerfile.write("LABEL compression=zstd-only\n")
            build(zstd_only, Compression("zstd"), other)
            started = time.monotonic()
            docker_engine.push(zstd_only)
            seconds["push zstd"] = time.monotonic() - started
            yield {"repo": repo, "dual": dual, "zstd_only": zstd_only, "index": index, "done": done,
                   "seconds": seconds, "log": access_log(address)}
        finally:
            remove_images(docker_engine, made)


def test_the_index_lists_the_gzip_image_first_and_the_marked_zstd_one_after(published: dict[str, Any]) -> None:
    found = REGISTRY.manifest(published["dual"])
    assert found is not None
    document, media_type = found
    assert media_type == "application/vnd.oci.image.index.v1+json"
    images = [e for e in document["manifests"] if (e.get("platform") or {}).get("architecture") == "amd64"]
    assert len(images) == 2, document
    gzip, zstd = images
    assert ZSTD_ANNOTATION not in (gzip.get("annotations") or {})
    assert zstd["annotations"][ZSTD_ANNOTATION] == "true"
    pinned = published["repo"] + "@"
    assert {layer["mediaType"].rsplit("+", 1)[1] for layer in _layers(pinned + gzip["digest"])} == {"gzip"}
    assert {layer["mediaType"].rsplit("+", 1)[1] for layer in _layers(pinned + zstd["digest"])} == {"zstd"}
    # Signing signs the index (the tag) and both images it lists.
    assert set(published["done"].instances) == {gzip["digest"], zstd["digest"]}
    assert published["done"].pushed[published["dual"]] == published["index"]
    # What the option costs: the gzip image's blobs beside the zstd image's, and the time.
    sizes = {name: sum(layer["size"] for layer in _layers(pinned + entry["digest"]))
             for name, entry in (("gzip", gzip), ("zstd", zstd))}
    print(f"\nlayers: gzip {sizes['gzip']} B, zstd {sizes['zstd']} B (gzip+zstd adds {sizes['gzip']} B, "
          f"{sizes['gzip'] / sizes['zstd']:.2f}x the zstd image); seconds: "
          + ", ".join(f"{k} {v:.2f}" for k, v in published["seconds"].items()))


@pytest.fixture(scope="module")
def docker_2010(published: dict[str, Any]) -> Iterator[dict[str, str]]:
    """Docker 20.10 in its own namespace, the registry reachable at the same address; its env."""
    dockerd = _docker_2010()
    port = int(published["dual"].split("/", 1)[0].rsplit(":", 1)[1])
    with remote_engine(registry_port=port, dockerd=dockerd) as engine:
        env = engine.env()
        version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], env=env,
                                 capture_output=True, text=True, timeout=60)
        assert version.stdout.startswith("20.10."), version
        yield env
    assert not engine.left_mounted, engine.left_mounted


def _docker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=300)


def test_docker_20_10_pulls_and_runs_the_dual_image_and_cannot_pull_the_zstd_only_one(
        published: dict[str, Any], docker_2010: dict[str, str]) -> None:
    control = _docker(docker_2010, "pull", published["zstd_only"])
    assert control.returncode != 0, control.stdout
    print(f"\nDocker 20.10 on the zstd-only image: {control.stderr.strip()}")
    pulled = _docker(docker_2010, "pull", published["dual"])
    assert pulled.returncode == 0, pulled.stderr
    ran = _docker(docker_2010, "run", "--rm", published["dual"])
    assert ran.returncode == 0 and "tini version" in ran.stdout + ran.stderr, ran


def _verify(env: dict[str, str], ref: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "imagebuilder", "verify", ref, "--allow-no-gpu"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)


def test_verify_on_docker_20_10_refuses_a_zstd_only_image_before_pulling_it(
        published: dict[str, Any], docker_2010: dict[str, str]) -> None:
    refused = _verify(docker_2010, published["zstd_only"])
    assert refused.returncode == 1, refused
    said = refused.stdout + refused.stderr
    assert "Docker 20.10" in said and "--compression gzip+zstd" in said and "Traceback" not in said, said
    assert _docker(docker_2010, "image", "inspect", published["zstd_only"]).returncode != 0  # not pulled
    # A tag left zstd-only beside a gzip image of it (a zstd-only publish over a gzip+zstd one):
    # verify names the gzip image.
    old = f"{published['repo']}:old"
    REGISTRY.put_tag(old, REGISTRY.digest(published["zstd_only"]) or "")
    REGISTRY.put_tag(gzip_ref(old), REGISTRY.digest(gzip_ref(published["dual"])) or "")
    instead = _verify(docker_2010, old)
    assert instead.returncode == 1 and f"pull {gzip_ref(old)} instead" in instead.stdout + instead.stderr, instead


def _podman(storage: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", "--root", str(storage / "root"), "--runroot", str(storage / "run"),
                           "--storage-driver", "vfs", *args], capture_output=True, text=True, timeout=300)


# containers/image chooses an index's entry by compression (the zstd-marked one of the platform)
# since containers/image#1789 (January 2023): in Podman from 4.5; Debian 12's Podman 4.3.1 takes
# the first entry of the platform, as Docker does (measured: the gzip blobs).
PODMAN_PREFERS_ZSTD = (4, 5)


def test_podman_pulls_the_zstd_image_of_the_dual_index_where_it_reads_the_mark(published: dict[str, Any]) -> None:
    if shutil.which("podman") is None:
        _unavailable("podman is not installed (.ci/setup --tests installs it)")
    said = subprocess.run(["podman", "--version"], capture_output=True, text=True, timeout=60).stdout
    version = tuple(int(part) for part in said.split()[-1].split(".")[:2])
    storage = Path(tempfile.mkdtemp(prefix="ib-podman-", dir="/tmp"))
    log: Path = published["log"]
    before = log.stat().st_size
    try:
        pulled = _podman(storage, "pull", "--tls-verify=false", published["dual"])
        assert pulled.returncode == 0, pulled.stderr
        found = REGISTRY.manifest(published["dual"])
        assert found is not None
        gzip, zstd = [e for e in found[0]["manifests"] if (e.get("platform") or {}).get("architecture") == "amd64"]
        taken, left = (zstd, gzip) if version >= PODMAN_PREFERS_ZSTD else (gzip, zstd)
        pinned = published["repo"] + "@"
        with log.open() as f:
            f.seek(before)
            fetched = f.read()
        assert f"/manifests/{taken['digest']}" in fetched and f"/manifests/{left['digest']}" not in fetched, \
            (said, fetched[-3000:])
        wanted = {layer["digest"] for layer in _layers(pinned + taken["digest"])}
        others = {layer["digest"] for layer in _layers(pinned + left["digest"])}
        assert all(f"/blobs/{d}" in fetched for d in wanted), fetched[-3000:]
        assert not any(f"/blobs/{d}" in fetched for d in others), fetched[-3000:]
        print(f"\n{said.strip()} took the {'zstd' if taken is zstd else 'gzip'} image of the index")
    finally:
        _podman(storage, "rmi", "--all", "--force")
        shutil.rmtree(storage, ignore_errors=True)
    assert not os.path.exists(storage)
