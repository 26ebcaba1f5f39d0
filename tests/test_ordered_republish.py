"""A zstd:chunked republish for real (publish/layer_reuse.py through publish/estargz.py): the
host's engine and a local registry, a small image (the base and three layers of random files,
~6 MB) and a second one that differs in its last layer only, as a nightly does.

  1. the first image: every layer written; 2. the second: only its last layer written and
  uploaded, the registry's storage grows by that blob and the small documents; 3. a kept layer
  whose blob was deleted from the repository is written again (the same bytes); 4. the same image
  once more: not read out of the engine, its profile not run, nothing written. The image pulled
  back runs with the files as built, and every layer's TOC is the one its annotations name.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.cleanup import remove_images
from support.registry import running_registry

START = ("sh", "-c", "cat /marker /data/a >/dev/null")
TOC_DIGEST = "containerd.io/snapshot/stargz/toc.digest"
OLD_POSITION = "io.containers.zstd-chunked.manifest-position"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCUMENTS = 64 << 10
"""More than a config, two manifests, an index and the registry's link files take."""


def _buildx(ref: str, dockerfile: str, folder: Path) -> None:
    folder.mkdir()
    (folder / "Dockerfile").write_text(dockerfile)
    done = subprocess.run(["docker", "buildx", "build", "--output",
                           f"type=image,name={ref},compression=zstd,force-compression=true,oci-mediatypes=true",
                           str(folder)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _stored(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "data").rglob("*") if p.is_file())


def _get(url: str, accept: str = "") -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=60) as response:
        return bytes(response.read())


def _manifest(address: str, repository: str, reference: str) -> dict[str, Any]:
    """The image manifest of the tag's index that containerd takes (its first amd64 entry)."""
    top = json.loads(_get(f"http://{address}/v2/{repository}/manifests/{reference}", f"{OCI_MANIFEST},{OCI_INDEX}"))
    digest = [m["digest"] for m in top["manifests"] if m.get("platform", {}).get("architecture") == "amd64"][0]
    loaded: dict[str, Any] = json.loads(_get(f"http://{address}/v2/{repository}/manifests/{digest}", OCI_MANIFEST))
    return loaded


def _toc_checked(address: str, repository: str, layer: dict[str, Any]) -> None:
    """The layer's TOC, where its position annotation says, is the one its digest annotation names."""
    blob = _get(f"http://{address}/v2/{repository}/blobs/{layer['digest']}")
    offset, length = (int(part) for part in layer["annotations"][OLD_POSITION].split(":")[:2])
    toc = subprocess.run(["zstd", "-dc"], input=blob[offset:offset + length], capture_output=True, timeout=60,
                         check=True).stdout
    assert "sha256:" + hashlib.sha256(toc).hexdigest() == layer["annotations"][TOC_DIGEST]
    assert json.loads(toc)["entries"]


def _sums(engine: Any, ref: str) -> str:
    done = engine.run(ref, ["sha256sum", "/data/a", "/data/b", "/data/last", "/marker"], timeout=120)
    assert done.exit_code == 0, done.output
    return str(done.output)


@pytest.mark.docker
@pytest.mark.registry
def test_a_republish_writes_only_what_changed_and_pulls_back_as_built(docker_engine: Any, base_image: str,
                                                                      tmp_path: Path) -> None:
    from imagebuilder.engine.export import ZSTD_CHUNKED
    from imagebuilder.publish.estargz import LEVELS, EstargzPublisher, reuse_summary
    from imagebuilder.publish.layer_reuse import LayerStore
    from imagebuilder.registry.client import HttpRegistry

    tag = uuid.uuid4().hex[:12]
    common = (f"FROM {base_image}\n"
              f"RUN mkdir /data && head -c 3000000 /dev/urandom >/data/a && echo republish-{tag} >/marker\n"
              "RUN head -c 2000000 /dev/urandom >/data/b\n")
    with running_registry() as registry:
        repository = f"imagebuilder-test/republish-{tag}"
        v1, v2 = f"{registry.address}/{repository}:v1", f"{registry.address}/{repository}:v2"
        try:
            _buildx(v1, common + "RUN head -c 1000000 /dev/urandom >/data/last\n", tmp_path / "v1")
            _buildx(v2, common + "RUN head -c 1000000 /dev/urandom >/data/last && echo 2 >>/data/last\n",
                   tmp_path / "v2")
            said: list[str] = []
            publisher = EstargzPublisher(docker_engine, HttpRegistry(), level=LEVELS[ZSTD_CHUNKED], codec=ZSTD_CHUNKED,
                                         start=START, say=said.append, reuse=LayerStore(tmp_path / "cache"))

            first = publisher.push(v1, [v1], None)
            count = len(first.layers)
            assert first.reused == () and first.saved and first.profiled and count >= 4
            assert first.profile is not None and "/data/a" in first.profile.files

            before = _stored(registry.root)
            second = publisher.push(v2, [v2], None)
            assert second.reused == tuple(range(count - 1)), second.to_json()
            assert second.uploaded == second.layers[-1].size
            grown = _stored(registry.root) - before
            assert second.layers[-1].size <= grown <= second.layers[-1].size + DOCUMENTS, grown
            assert reuse_summary(second.to_json()) == (
                f"zstd:chunked layers: 1 written, {count - 1} reused from an earlier publish")

            index = next(i for i, w in enumerate(second.layers) if "/data/a" in w.prioritized)
            lost = second.layers[index]  # the layer of /data/a and /marker, ordered by the profile
            assert lost.prioritized == ("/data/a", "/marker") or lost.prioritized == ("/marker", "/data/a")
            request = urllib.request.Request(f"http://{registry.address}/v2/{repository}/blobs/{lost.digest}",
                                             method="DELETE")
            urllib.request.urlopen(request, timeout=30).close()
            third = publisher.push(v2, [v2], None)
            assert set(range(count)) - set(third.reused) == {index} and third.saved and not third.profiled
            assert third.layers == second.layers and third.manifest == second.manifest

            fourth = publisher.push(v2, [v2], None)
            assert (fourth.saved, fourth.profiled, fourth.reused, fourth.uploaded) == (
                False, False, tuple(range(count)), 0)
            assert fourth.digest == second.digest

            manifest = _manifest(registry.address, repository, "v2")
            assert [layer["digest"] for layer in manifest["layers"]] == [w.digest for w in second.layers]
            for layer in manifest["layers"]:
                _toc_checked(registry.address, repository, layer)
            built = _sums(docker_engine, v2)
            remove_images(docker_engine, [v2])
            subprocess.run(["docker", "pull", "-q", v2], capture_output=True, timeout=300, check=True)
            assert _sums(docker_engine, v2) == built
        finally:
            remove_images(docker_engine, [v1, v2])
