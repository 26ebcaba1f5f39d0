"""publish with BuildKit on Docker's containerd image store, for real: zstd layers pushed as
verified, one torch layer shared by runtime and devel, SLSA provenance read back by verify,
build caches through the registry, a republish that uploads nothing, and a build on another
engine (its own network namespace and bridge, TCP with TLS) through --buildx-builder.

Two real torch images (2.13 runtime and devel for CUDA 13.0 on the local Debian base: the
family of support.policy's IMAGE_FAMILIES whose layers test_buildkit built) are published once for
the module; the remote engine imports their cache instead of building.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from support.build_cache import family_build, prune_session_build_cache
from support.cleanup import remove_local_tags
from support.real_images import REPO_ROOT, ca_bundle_args, imagebuilder
from support.registry import throwaway_registry
from support.unavailable import _unavailable
from support.replay import cli_replaying, verify_replaying

from imagebuilder.engine.export import cache_ref
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.registry.manifests import INDEXES, pick_manifest
from imagebuilder.registry.reference import pinned, RegistryTarget

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow, pytest.mark.most_disk]

TORCH, CUDA, OS = "2.13", "13.0", "debian12"  # support.real_images' DEVEL_TORCH, DEVEL_CUDA: one family
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"


def _publish_args(base_image: str, registry: str, report: Path, *extra: str) -> list[str]:
    return ["publish", "--torch", TORCH, "--cuda", CUDA, "--os", OS, "--base-image", base_image,
            *ca_bundle_args(), "--builder", "buildkit", "--allow-no-gpu", "--registry", registry,
            "--report", str(report), *extra]


def _publish(base_image: str, registry: str, report: Path, *extra: str, env: dict[str, str] | None = None,
             ) -> dict[str, Any]:
    args = _publish_args(base_image, registry, report, *extra)
    if env is None:
        done = imagebuilder(*args)
    else:
        done = subprocess.run([sys.executable, "-m", "imagebuilder", *args], capture_output=True, text=True,
                              timeout=3600, cwd=REPO_ROOT, env={**env, "GITHUB_SHA": "0" * 40})
    assert done.returncode == 0, f"publish failed:\n{done.stdout}\n{done.stderr[-6000:]}"
    (image,) = json.loads(report.read_text())["images"]
    image["stderr"] = done.stderr
    return image


def _publish_replaying(base_image: str, registry: str, report: Path, built: dict[str, Any],
                       verdict: dict[str, Any]) -> dict[str, Any]:
    """The devel publish, in this process: build, preflight and push real; its smoke-test
    container answers with `verdict`, the session's verify of `built`, which must be the same
    content (its inputs hash) and the one image asked for."""
    with pytest.MonkeyPatch.context() as patch:
        result, replayed = cli_replaying(patch, verdict, *_publish_args(base_image, registry, report, "--variant", "devel"))
    assert result.exit_code == 0, f"publish failed:\n{result.stdout}\n{result.stderr[-6000:]}"
    (image,) = json.loads(report.read_text())["images"]
    assert image["inputs_hash"] == built["inputs_hash"], "the replayed verdict is of another content"
    assert [ref for ref, _ in replayed.asked] == [image["ref"]]
    image["stderr"] = result.stderr
    return image


@pytest.fixture(scope="module")
def local_registry() -> Iterator[str]:
    with throwaway_registry() as address:
        yield address


@pytest.fixture(scope="module")
def bk_published(docker_engine: Any, base_image: str, local_registry: str, devel_image: dict[str, Any],
                 devel_verdict: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The family's publishes (support.policy's IMAGE_FAMILIES): test_buildkit, which runs first, built
    these layers; this exports them (zstd), verifies and pushes. The devel image's smoke tests are
    the session's verify of that content (conftest's devel_verdict), replayed."""
    registry = f"{local_registry}/imagebuilder-test/bk-{uuid.uuid4().hex[:8]}"
    reports = tmp_path_factory.mktemp("publish-buildkit")
    try:
        with family_build(request):
            runtime = _publish(base_image, registry, reports / "runtime.json", "--variant", "runtime")
            devel = _publish_replaying(base_image, registry, reports / "devel.json", devel_image, devel_verdict)
        yield {"registry": registry, "runtime": runtime, "devel": devel, "reports": reports}
    finally:
        remove_local_tags(docker_engine, local_registry)


def _blobs(ref: str) -> dict[str, tuple[int, str]]:
    return HttpRegistry(config={}).blobs(ref)


def test_what_is_pushed_is_the_image_verify_ran_in_zstd(bk_published: dict[str, Any]) -> None:
    for variant in ("runtime", "devel"):
        image = bk_published[variant]
        assert (image["status"], image["verified"]) == ("pushed", True), image["reason"]
        # The family's publishes build from test_buildkit's layers (support.policy's IMAGE_FAMILIES):
        # every step but the FROM is CACHED, so no prune in between made BuildKit forget them.
        build = image["build"]
        assert build["cached_steps"] == build["steps"] - 1, (build["cached_steps"], build["steps"])
        assert "layers: zstd, exported by BuildKit and pushed as verified" in image["stderr"]
        # The containerd store's image id is the digest of the index BuildKit exported: the
        # digest the registry stores under every tag is that id, so nothing was recompressed.
        assert set(image["pushed"].values()) == {image["build"]["image_id"]}
        for ref, digest in image["pushed"].items():
            assert HttpRegistry(config={}).digest(ref) == digest
        layers = [media for _, media in _blobs(image["ref"]).values() if "layer" in media]
        assert layers and set(layers) == {ZSTD_LAYER}
        if variant == "runtime":
            # The layers went up once, as the build cache (mode=min: the image's own blobs, in
            # its compression); the push mounted them from the cache's repository.
            big = _wheel_layers(_blobs(image["ref"]))
            assert sum(big.values()) > 1_000_000_000
            assert set(big) <= set(_blobs(cache_ref(RegistryTarget.parse(bk_published["registry"]), image["image"])))
            assert image["pushed_bytes"] < sum(big.values()) / 2
        assert all(image[k] > 0 for k in ("build_s", "verify_s", "push_s"))
        # The cache went up beside verify, by a cache-only build of its own; the image's builds
        # exported the image alone.
        log = Path(build["log"])
        exported = re.compile(r"^#(\d+) exporting cache to registry$", re.M)
        cache_log = log.with_name(log.stem + "-cache.log").read_text()
        assert "--output type=cacheonly" in cache_log.splitlines()[0]
        step = exported.search(cache_log)
        assert step and re.search(rf"^#{step[1]} DONE [\d.]+s$", cache_log, re.M), cache_log[-3000:]
        assert not exported.search(log.read_text() + log.with_name(log.stem + "-sbom.log").read_text())
        assert 0 < image["cache_export_s"] < image["verify_s"] + image["push_s"] + 5
        assert "registry cache" not in image["reason"], image["reason"]


def _wheel_layers(blobs: dict[str, tuple[int, str]]) -> dict[str, int]:
    """The image's layers of over 50 MB: its wheel groups' (and its apt layer's)."""
    return {digest: size for digest, (size, media) in blobs.items() if "layer" in media and size > 50_000_000}


def test_runtime_and_devel_carry_the_same_wheel_layers(bk_published: dict[str, Any]) -> None:
    runtime, devel = _blobs(bk_published["runtime"]["ref"]), _blobs(bk_published["devel"]["ref"])
    layers = _wheel_layers(runtime)
    # The wheel groups (CUDA libraries, cuBLAS, cuDNN, ..., torch): at least five layers of the
    # runtime image, all in devel with the same digests (stored once, pulled once); only the apt
    # layers below them differ.
    shared = {digest: size for digest, size in layers.items() if digest in devel}
    assert len(shared) >= 5 and sum(shared.values()) > 1_000_000_000, (layers, devel)
    # And the devel push found them there: it uploaded far less than they hold.
    assert bk_published["devel"]["pushed_bytes"] < sum(shared.values()) / 2


def _registry_layers(ref: str) -> tuple[str, list[tuple[str, int, str]]]:
    """(the linux/amd64 image manifest's digest, its layers: digest, size, media type) of the
    image `ref` names, as the registry lists them."""
    registry = HttpRegistry(config={})
    found = registry.manifest(ref)
    assert found is not None, ref
    manifest = ref.partition("@")[2]
    if found[1] in INDEXES:
        manifest = pick_manifest(found[0], "linux/amd64")
        found = registry.manifest(pinned(ref, manifest))
        assert found is not None, manifest
    return manifest, [(layer["digest"], layer["size"], layer["mediaType"]) for layer in found[0]["layers"]]


def _reported_layers(image: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's layers of a publish, by digest, checked against the registry's manifest of
    the pushed digest: every layer, in order, with its size and media type."""
    assert image["layers"], image["layers_reason"]
    manifest, expected = _registry_layers(pinned(image["ref"], image["digest"]))
    listed = [(layer["digest"], layer["size"], layer["media_type"]) for layer in image["layers"]]
    assert listed == expected
    assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", digest) and size > 0 for digest, size, _ in listed)
    assert {(layer["platform"], layer["manifest"]) for layer in image["layers"]} == {("linux/amd64", manifest)}
    return {layer["digest"]: layer for layer in image["layers"]}


def test_the_report_lists_each_layer_and_whether_the_registry_had_it(bk_published: dict[str, Any]) -> None:
    """--report's layers are the registry's manifest's. runtime went first into a fresh
    repository: no layer of it is reported as there before, and its wheel layers went up with
    the build cache and were mounted from there; devel found the wheel-group layers it shares
    with runtime already in the repository."""
    runtime = _reported_layers(bk_published["runtime"])
    assert not any(layer["in_registry_before"] for layer in runtime.values())
    wheels = _wheel_layers(_blobs(bk_published["runtime"]["ref"]))
    cache = cache_ref(RegistryTarget.parse(bk_published["registry"]), bk_published["runtime"]["image"]).rsplit(":", 1)[0]
    assert wheels and all((runtime[digest]["in_registry_before"], runtime[digest]["mounted_from"]) == (False, cache)
                          for digest in wheels)
    devel = _reported_layers(bk_published["devel"])
    shared = set(wheels) & set(devel)
    assert len(shared) >= 5, (wheels, devel)
    assert all(devel[digest]["in_registry_before"] is True for digest in shared)


def test_the_published_image_carries_provenance_of_where_it_was_built_from(bk_published: dict[str, Any]) -> None:
    from imagebuilder.trust.provenance import built_from

    predicate = HttpRegistry(config={}).provenance(bk_published["runtime"]["ref"])
    assert predicate is not None and "slsa.dev/provenance" in predicate["predicateType"]
    found = built_from(predicate)
    assert found.revision == "0" * 40
    assert found.matrix is not None and re.fullmatch(r"matrix\.yaml sha256:[0-9a-f]{64}", found.matrix)
    assert found.lock is not None and found.lock.startswith("locks/torch2.13.0-cu130-py3.11-runtime.txt sha256:")
    assert any("imagebuilder-base" in base for base in found.base)


def test_a_republish_of_identical_content_uploads_nothing_and_moves_no_tag(bk_published: dict[str, Any], base_image: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The rebuild is the same image (its config, so every layer); BuildKit's new index would
    differ only in its provenance's timestamps (pushed, it was 29,723 bytes and a new digest
    under every tag): publish keeps the published one, and nothing goes up. The publish runs in
    this process: the same layers bk_published smoke-tested, so the smoke-test container answers
    with that run's verdict (support.replay) and the rest (build, verify's preflight, the
    registry) is real."""
    report = bk_published["reports"] / "again.json"
    result, replayed = cli_replaying(monkeypatch, bk_published["runtime"]["verify"], *_publish_args(
        base_image, bk_published["registry"], report, "--variant", "runtime", "--force"))
    assert result.exit_code == 0, f"publish failed:\n{result.stdout}\n{result.stderr[-6000:]}"
    (again,) = json.loads(report.read_text())["images"]
    assert [image for image, _ in replayed.asked] == [again["ref"]] and again["verified"] is True
    assert again["status"] == "pushed" and "kept, nothing uploaded" in again["reason"]
    assert again["pushed_bytes"] == 0
    # The report lists the kept image's layers, each one the registry had already.
    layers = _reported_layers(again)
    assert list(layers) == [layer["digest"] for layer in bk_published["runtime"]["layers"]]
    assert all(layer["in_registry_before"] is True for layer in layers.values()) and again["layers_reason"] is None
    before = bk_published["runtime"]["pushed"]
    # Its tags name what they named; today's dated tag was there already, so it is not in the
    # report, and it names the same image too.
    assert again["pushed"] == {ref: digest for ref, digest in before.items() if ref in again["pushed"]}
    (dated,) = set(before) - set(again["pushed"])
    assert dated.endswith(f"-{datetime.now(timezone.utc):%Y%m%d}")
    for ref, digest in before.items():
        assert HttpRegistry(config={}).digest(ref) == digest


@pytest.fixture
def remote(docker_engine: Any, local_registry: str) -> Iterator[Any]:
    """The second engine; skips (fails in CI) where namespaces cannot be made. The test that
    uses it comes last: what the first engine built is in the registry (images and cache), so
    its local images and build records go first, and the two engines' copies of torch never
    share the disk."""
    from remote_engine import remote_engine

    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        _unavailable("ip netns does not work here (root and iproute2 needed) for the remote engine")
    remove_local_tags(docker_engine, local_registry)
    prune_session_build_cache(families_too=True)  # the family's last test: its records go too
    with remote_engine(int(local_registry.rsplit(":", 1)[1])) as engine:
        yield engine


def test_an_empty_remote_engine_builds_from_the_registry_cache_verifies_and_pushes(
        bk_published: dict[str, Any], remote: Any, base_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = remote.env()
    # The base image is all it has: no image of ours, no build cache.
    subprocess.run(f"docker save {base_image} | DOCKER_HOST={remote.host} DOCKER_TLS_VERIFY=1 "
                   f"DOCKER_CERT_PATH={remote.cert_path} docker load", shell=True, check=True,
                   capture_output=True, timeout=600)
    report = bk_published["reports"] / "remote.json"
    image = _publish(base_image, bk_published["registry"], report, "--variant", "runtime", "--force",
                     "--buildx-builder", remote.name, env=env)
    assert image["status"] == "pushed" and image["verified"] is True
    assert f"--context {remote.name} buildx build" in Path(image["build"]["log"]).read_text().splitlines()[0]
    log = Path(image["build"]["log"]).read_text()
    # The wheel layers came from the registry's cache: every group's install step is cached, no
    # wheel came down.
    installs = re.findall(r"#(\d+) \[[^\]]*\d+/\d+\] RUN [^\n]*-r /run/imagebuilder/layers/\S+\.lock", log)
    assert len(installs) >= 5, log[-3000:]
    assert all(re.search(rf"^#{n} CACHED$", log, re.M) for n in installs), log[-3000:]
    assert not re.findall(r"Download(?:ed|ing) (?:torch|nvidia)", log)
    # Its layers were in the registry already: the push uploaded config and attestations only.
    assert image["pushed_bytes"] < 10_000_000
    # The image is on the remote engine, and verify checks it there, saying where it was built
    # from. The publish above ran the smoke tests on this very image on that engine (verified:
    # True): verify runs for real on the remote engine (preflight reads the image there, the
    # provenance comes from the registry) but for the smoke-test container, whose output is the
    # publish's recorded verdict (support.replay).
    for name in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "DOCKER_CONFIG"):
        monkeypatch.setenv(name, env[name])
    result, replayed = verify_replaying(monkeypatch, image["verify"], image["ref"], "--allow-no-gpu")
    assert result.exit_code == 0, result.output[-3000:]
    assert f"built from: revision {'0' * 40}" in result.stdout
    assert replayed.base_url == remote.host
    assert replayed.asked == [(image["ref"], ["python3", "-m", "smoke_tests", "--json", "--allow-no-gpu"])]
