"""publish: the planner as tables; the runner against the real daemon and a real local registry
(Debian's docker-registry), end to end. The registry HTTP client's own tests are in
tests/test_registry_http.py.

The integration tests publish one real torch image with BuildKit (what `--builder auto` picks on
Docker 26): torch 2.6 for CUDA 12.4 on debian12, on the local Debian base, with the host's CA
bundle; its install steps are served from the main job's layers (support.policy's IMAGE_FAMILIES).
The smoke tests run on it once per module (CPU mode); the later runs that need a verdict reuse
that recorded one. The classic builder's runner is tested on small images (its torch build took
8 minutes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from support.cleanup import remove_local_tags
from support.published_images import BOTH, merge_images, platform_ref, rendered_signed
from support.real_images import SIGNED_CUDA, SIGNED_OS, SIGNED_TORCH, ca_bundle_args, imagebuilder, installed_torch
from support.registry import LocalRegistry, put_blob, put_manifest, running_registry
from support.unavailable import _unavailable

from imagebuilder.build.image_contents import SBOM_PATH
from imagebuilder.build.layers import wheel_groups
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render import RenderedImage
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.engine.classic import ClassicBuilder
from imagebuilder.lock.lockfile import load_locks, locks_dir
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve
from imagebuilder.publish.blobs import check_before, published_layers
from imagebuilder.publish.lookup import lookup
from imagebuilder.publish.plan import dated_ref, plan, RunOptions, Step
from imagebuilder.publish.plan import BUILD, FAILED, NOT_RUN, PUSHED, RETAG, RETAGGED, SKIP, SKIPPED, Remote
from imagebuilder.publish.report import format_plan, format_summary, PublishFailed, raise_if_failed
from imagebuilder.publish.run import publish
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.registry.manifests import INDEXES, OCI_MANIFEST, pick_manifest
from imagebuilder.registry.reference import parse_reference
from imagebuilder.resources import default_matrix_path
from imagebuilder.trust.labels import INPUTS_HASH as HASH

REPO_ROOT = Path(__file__).resolve().parent.parent
SMALL = REPO_ROOT / "tests" / "data" / "matrix-small.yaml"
# tests/test_e2e.py builds 2.6/12.1/debian12: the same wheels stage and final layers but the last.
TORCH, CUDA, OS = "2.6", "12.4", "debian12"


# --------------------------------------------------------------------------- planner tables


def _images(repository: str = "reg.example/ml/pytorch") -> tuple[RenderedImage, RenderedImage]:
    matrix = load_matrix(SMALL)
    opts = RenderOptions(repository=repository)
    runtime, jupyter = (render(resolve(matrix, Request("2.6", "12.4", None, v, None)), matrix, opts)
                        for v in ("runtime", "jupyter"))
    assert jupyter.depends_on == runtime.ref
    return runtime, jupyter


RUNTIME, JUPYTER = _images()
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def published(image: RenderedImage, digest: str = D1, inputs_hash: str | None = "same",
              missing: tuple[int, ...] = (), elsewhere: tuple[int, ...] = ()) -> Remote:
    """What the registry holds for `image`: every tag at `digest`, but for the tags whose
    index is in `missing` (absent) or `elsewhere` (another image)."""
    digests = {ref: None if n in missing else (D2 if n in elsewhere else digest)
               for n, ref in enumerate(image.refs)}
    return Remote(digests, image.inputs_hash if inputs_hash == "same" else inputs_hash)


PLAN_CASES = [
    # (name, remotes, force, expected [(tag of image, action, reason contains)])
    ("nothing published builds both, runtime first", {}, False,
     [(RUNTIME, BUILD, "not in the registry"), (JUPYTER, BUILD, "base image")]),
    ("unchanged and every tag present skips", {RUNTIME.ref: published(RUNTIME), JUPYTER.ref: published(JUPYTER)},
     False, [(RUNTIME, SKIP, "unchanged"), (JUPYTER, SKIP, "unchanged")]),
    ("changed runtime hash rebuilds it and the jupyter on it",
     {RUNTIME.ref: published(RUNTIME, inputs_hash="old"), JUPYTER.ref: published(JUPYTER)}, False,
     [(RUNTIME, BUILD, "inputs changed (registry old"), (JUPYTER, BUILD, f"its base image {RUNTIME.ref} is rebuilt")]),
    ("changed jupyter only rebuilds jupyter",
     {RUNTIME.ref: published(RUNTIME), JUPYTER.ref: published(JUPYTER, inputs_hash="old")}, False,
     [(RUNTIME, SKIP, "unchanged"), (JUPYTER, BUILD, "inputs changed")]),
    ("a missing alias is pointed at the published image",
     {RUNTIME.ref: published(RUNTIME, missing=(2,)), JUPYTER.ref: published(JUPYTER)}, False,
     [(RUNTIME, RETAG, RUNTIME.tags[2]), (JUPYTER, SKIP, "unchanged")]),
    ("an alias naming another image is moved",
     {RUNTIME.ref: published(RUNTIME, elsewhere=(1, 3)), JUPYTER.ref: published(JUPYTER)}, False,
     [(RUNTIME, RETAG, f"{RUNTIME.tags[1]}, {RUNTIME.tags[3]}"), (JUPYTER, SKIP, "unchanged")]),
    ("a missing primary tag rebuilds even with aliases present",
     {RUNTIME.ref: published(RUNTIME, missing=(0,)), JUPYTER.ref: published(JUPYTER)}, False,
     [(RUNTIME, BUILD, "not in the registry"), (JUPYTER, BUILD, "base image")]),
    ("an unlabelled image is rebuilt",
     {RUNTIME.ref: published(RUNTIME, inputs_hash=None), JUPYTER.ref: published(JUPYTER)}, False,
     [(RUNTIME, BUILD, "no inputs-hash label"), (JUPYTER, BUILD, "base image")]),
    ("--force rebuilds what is published", {RUNTIME.ref: published(RUNTIME), JUPYTER.ref: published(JUPYTER)},
     True, [(RUNTIME, BUILD, "--force"), (JUPYTER, BUILD, "--force")]),
]


@pytest.mark.parametrize("name, remotes, force, expected", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_plan(name: str, remotes: dict[str, Remote], force: bool, expected: list[tuple[Any, str, str]]) -> None:
    # Jupyter first on purpose: the plan orders runtime before the image built FROM it.
    steps = plan([JUPYTER, RUNTIME], remotes, force=force)
    assert [(s.image, s.action) for s in steps] == [(image, action) for image, action, _ in expected]
    for step, (_, _, reason) in zip(steps, expected):
        assert reason in step.reason
    for step in steps:
        if step.action == RETAG:
            assert step.digest == D1 and step.retag and set(step.retag) < set(step.image.refs)
            assert step.dated is None  # no day given: no dated tags


DAY = date(2026, 11, 30)


def test_dated_tags_are_added_once_a_day_and_never_moved() -> None:
    dated = dated_ref(RUNTIME, DAY)
    assert dated == f"{RUNTIME.repository}:{RUNTIME.spec.key}-20261130"
    # A new image gets the day's tag with its push.
    (step,) = plan([RUNTIME], {}, day=DAY)
    assert (step.action, step.dated) == (BUILD, dated)
    # An unchanged image gets it by a re-point: the next day adds only the dated tag.
    remote = published(RUNTIME)
    (step,) = plan([RUNTIME], {RUNTIME.ref: remote}, day=DAY)
    assert (step.action, step.retag, step.digest) == (RETAG, (dated,), D1)
    # The same day again: nothing to do.
    today = Remote({**remote.digests, dated: D1}, remote.inputs_hash)
    assert plan([RUNTIME], {RUNTIME.ref: today}, day=DAY)[0].action == SKIP
    # Rebuilt the same day: the dated tag keeps naming the image it was first given to.
    changed = Remote({**remote.digests, dated: D2}, "old")
    (step,) = plan([RUNTIME], {RUNTIME.ref: changed}, day=DAY)
    assert (step.action, step.dated) == (BUILD, None)
    # A stale alias and a missing dated tag are fixed in one re-point.
    stale = published(RUNTIME, missing=(2,))
    (step,) = plan([RUNTIME], {RUNTIME.ref: stale}, day=DAY)
    assert step.action == RETAG and step.retag == (RUNTIME.refs[2], dated)


def test_plan_lists_every_tag_in_order() -> None:
    text = format_plan(plan([JUPYTER, RUNTIME], {}))
    assert text.index(RUNTIME.ref) < text.index(JUPYTER.ref)
    assert all(tag in text for tag in RUNTIME.tags + JUPYTER.tags)
    assert text.splitlines()[-1] == "plan: 2 to build, 0 to re-point, 0 to skip"


def test_a_plan_without_push_plans_no_push() -> None:
    text = format_plan(plan([JUPYTER, RUNTIME], {}), push=False)
    assert "push " not in text.replace("push nothing (--no-push)", "")
    assert text.count("build and verify; push nothing (--no-push)") == 2


def _publish_args(base_image: str, registry: str, report: Path, *extra: str) -> list[str]:
    return ["publish", "--torch", TORCH, "--cuda", CUDA, "--os", OS, "--variant", "runtime", "--builder", "buildkit",
            "--base-image", base_image, *ca_bundle_args(), "--allow-no-gpu", "--registry", registry,
            "--report", str(report), *extra]


@pytest.fixture(scope="module")
def local_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """A registry for the module that a test may stop and start again (its storage removed after)."""
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def first_run(signed_publish: dict[str, Any]) -> dict[str, Any]:
    """`imagebuilder publish` of the real runtime image to an empty registry: build, smoke
    tests (CPU mode), push of every tag. It is conftest's signed_publish (signed too, with
    BuildKit: test_signing's tests read the same publish); its report, registry, output and how
    long it took. Its images go after test_signing's last test."""
    assert (TORCH, CUDA, OS) == (SIGNED_TORCH, SIGNED_CUDA, SIGNED_OS)
    return signed_publish


def _head(ref: str) -> str | None:
    return HttpRegistry(config={}).digest(ref)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.registry
def test_first_run_builds_verifies_and_pushes_every_tag(first_run: dict[str, Any]) -> None:
    (image,) = first_run["report"]["images"]
    assert first_run["report"]["ok"] is True
    assert (image["action"], image["status"], image["built"], image["verified"]) == (BUILD, PUSHED, True, True)
    assert image["verify"]["require_gpu"] is False or image["verify"]["gpu_count"]
    dated = f"{image['ref'].rsplit(':', 1)[0]}:{image['image']}-{datetime.now(timezone.utc):%Y%m%d}"
    assert set(image["pushed"]) == {*image["tags"], dated} and len(image["tags"]) >= 2
    assert len(set(image["pushed"].values())) == 1  # every tag names the one image, the dated one too
    for ref, digest in image["pushed"].items():
        assert _head(ref) == digest
    labels = HttpRegistry(config={}).labels(image["ref"])
    assert labels is not None and labels[HASH] == image["inputs_hash"]
    # Its family's (support.policy's IMAGE_FAMILIES): the main job's layers (CUDA 12.1, the same cu124
    # lock) served every install step; only what follows the image's own files ran.
    assert "imagebuilder-uv" in Path(image["build"]["log"]).read_text(), "no install step in the log"
    assert not installed_torch(image["build"]["log"]), "the install steps ran again"
    summary = first_run["stdout"]
    assert "RESULT" in summary and "pushed" in summary and f"{len(image['tags'])}/{len(image['tags'])}" in summary


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.registry
def test_pulled_images_have_the_reported_digests(docker_engine: Any, first_run: dict[str, Any]) -> None:
    import docker

    (image,) = first_run["report"]["images"]
    client = docker.from_env()
    try:
        for ref, digest in image["pushed"].items():
            docker_engine.remove_image(ref, force=False)  # untag only: the other tags keep the layers
            docker_engine.pull(ref)
            repo_digests = client.images.get(ref).attrs["RepoDigests"]
            assert f"{ref.rsplit(':', 1)[0]}@{digest}" in repo_digests
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.registry
def test_second_run_skips_and_pushes_nothing(base_image: str, first_run: dict[str, Any], tmp_path: Path) -> None:
    (before,) = first_run["report"]["images"]
    started = time.monotonic()
    done = imagebuilder(*_publish_args(base_image, first_run["registry"], tmp_path / "second.json"))
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-4000:]
    (image,) = json.loads((tmp_path / "second.json").read_text())["images"]
    assert (image["action"], image["status"], image["built"], image["pushed"]) == (SKIP, SKIPPED, False, {})
    assert image["digest"] == next(iter(before["pushed"].values()))
    assert seconds < 30, f"an unchanged nightly run took {seconds:.0f}s"
    for ref, digest in before["pushed"].items():
        assert _head(ref) == digest


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.registry
def test_the_next_day_adds_only_the_dated_tag(base_image: str, first_run: dict[str, Any], tmp_path: Path) -> None:
    (before,) = first_run["report"]["images"]
    digest = next(iter(before["pushed"].values()))
    tomorrow = datetime.now(timezone.utc).date() + timedelta(days=1)
    done = imagebuilder(*_publish_args(base_image, first_run["registry"], tmp_path / "next.json",
                                       "--date", tomorrow.isoformat()))
    assert done.returncode == 0, done.stderr[-4000:]
    (image,) = json.loads((tmp_path / "next.json").read_text())["images"]
    dated = f"{image['ref'].rsplit(':', 1)[0]}:{image['image']}-{tomorrow:%Y%m%d}"
    assert (image["action"], image["status"], image["built"]) == (RETAG, RETAGGED, False)
    assert set(image["pushed"]) - set(before["pushed"]) == {dated}  # the only new tag
    assert _head(dated) == digest
    for ref, was in before["pushed"].items():
        assert _head(ref) == was  # nothing else moved, yesterday's dated tag included


# Issue 30: another release with common pins. 2.5 after 2.6 (cu124 wheels, Python 3.11, the same
# base): their locks pin the same nvidia wheels but for cuSPARSELt (2.5 has none).
OTHER_TORCH = "2.5"
_GROUP_LOCK = re.compile(r"/run/imagebuilder/layers/([a-z-]+)\.lock")
_UPLOADED = re.compile(r'"PUT /v2/\S+/blobs/uploads/\S*[?&]digest=(sha256(?::|%3A)[0-9a-f]{64})\S* HTTP/[\d.]+" 201 ')


def _group_layers(ref: str) -> dict[str, str]:
    """The image's wheel-group layers as the registry holds them: group name -> layer digest.
    Each layer of the linux/amd64 manifest is paired, in order, with the config's history entry
    that made it; a group's RUN names its lock file (/run/imagebuilder/layers/GROUP.lock)."""
    registry = HttpRegistry(config={})
    found = registry.manifest(ref)
    assert found is not None, ref
    document, media_type = found
    if media_type in INDEXES or document.get("mediaType") in INDEXES:
        child = registry.manifest(f"{ref.rsplit(':', 1)[0]}@{pick_manifest(document, 'linux/amd64')}")
        assert child is not None, ref
        document = child[0]
    config = registry.image_config(ref, "linux/amd64")
    assert config is not None, ref
    made = [entry.get("created_by", "") for entry in config[0]["history"] if not entry.get("empty_layer")]
    layers = [layer["digest"] for layer in document["layers"]]
    assert len(made) == len(layers), (len(made), len(layers))
    groups = {m[1]: digest for by, digest in zip(made, layers) if (m := _GROUP_LOCK.search(by))}
    assert groups, f"no wheel-group layer in {ref}'s history"
    return groups


def _uploaded_digests(log: str) -> set[str]:
    """The blobs a docker-registry access log shows uploaded (a completed upload's PUT); a
    cross-repository mount or a HEAD is not an upload."""
    return {m[1].replace("%3A", ":") for m in _UPLOADED.finditer(log)}


def test_uploaded_digests_reads_completed_uploads_only() -> None:
    hexa, hexb = "a" * 64, "b" * 64
    log = (f'127.0.0.1 - - [x] "PUT /v2/ns/t/blobs/uploads/u1?_state=S%3D&digest=sha256:{hexa} HTTP/1.1" 201 0 "" "b"\n'
           f'127.0.0.1 - - [x] "PUT /v2/ns/t/blobs/uploads/u2?digest=sha256%3A{hexb} HTTP/1.1" 201 0 "" "b"\n'
           f'127.0.0.1 - - [x] "POST /v2/ns/t/blobs/uploads/?mount=sha256:{"c" * 64}&from=ns/c HTTP/1.1" 201 0 "" "b"\n'
           f'127.0.0.1 - - [x] "HEAD /v2/ns/t/blobs/sha256:{"d" * 64} HTTP/1.1" 200 0 "" "b"\n'
           f'127.0.0.1 - - [x] "PUT /v2/ns/t/blobs/uploads/u3?digest=sha256:{"e" * 64} HTTP/1.1" 400 0 "" "b"\n')
    assert _uploaded_digests(log) == {f"sha256:{hexa}", f"sha256:{hexb}"}


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.registry
def test_a_release_with_common_pins_shares_their_layers_and_uploads_none_of_them(
        docker_engine: Any, base_image: str, first_run: dict[str, Any], tmp_path: Path) -> None:
    """2.5 published into the namespace 2.6 went to. Every wheel group whose pins the two locks
    share is one layer, the same digest in both images: the groups below the first that differs
    come from 2.6's BuildKit layers, and a shared group above it (NCCL) is installed again and
    comes out byte-identical. The registry's log shows the publish uploaded none of them (the
    report says the registry had them), and did upload the groups that differ."""
    matrix = load_matrix(default_matrix_path())
    locks = load_locks(locks_dir(matrix))
    pins = {}
    for torch in (TORCH, OTHER_TORCH):
        spec = resolve(matrix, Request(torch, CUDA, None, "runtime", OS, base_image=base_image))
        lock = locks.lock_for(spec, matrix)
        assert lock is not None, spec.key
        pins[torch] = {group.name: group.lock.pins for group in wheel_groups(lock)}
    order = list(pins[TORCH])
    shared = [name for name in order if pins[TORCH][name] == pins[OTHER_TORCH].get(name)]
    differ = [name for name in order if name not in shared]
    # What the test stands on (facts of the committed locks): shared groups on both sides of one that differs.
    assert differ and any(order.index(name) > order.index(differ[0]) for name in shared), (shared, differ)
    assert {"cuda-libraries", "cublas", "cudnn", "nccl"} <= set(shared), shared

    address = first_run["address"]
    from support.registry import access_log

    log = access_log(address)
    offset = log.stat().st_size
    report = tmp_path / "other.json"
    done = imagebuilder("publish", "--torch", OTHER_TORCH, "--cuda", CUDA, "--os", OS, "--variant", "runtime",
                        "--builder", "buildkit", "--base-image", base_image, *ca_bundle_args(), "--allow-no-gpu",
                        "--registry", first_run["registry"], "--report", str(report))
    (image,) = json.loads(report.read_text())["images"] if report.exists() else [{}]
    try:
        assert done.returncode == 0, f"publish failed:\n{done.stdout}\n{done.stderr[-6000:]}"
        assert (image["status"], image["verified"]) == (PUSHED, True)
        with log.open("rb") as f:
            f.seek(offset)
            uploaded = _uploaded_digests(f.read().decode(errors="replace"))
    finally:
        if image.get("ref"):  # every local tag of 2.5 (REPOSITORY:2.5.1-...), none of 2.6's
            repository, tag = image["ref"].rsplit(":", 1)
            remove_local_tags(docker_engine, f"{repository}:{tag.split('-', 1)[0]}-")
    ours, theirs = _group_layers(image["ref"]), _group_layers(first_run["image"]["ref"])
    assert set(ours) == set(pins[OTHER_TORCH]) and set(theirs) == set(pins[TORCH])
    for name in shared:
        assert ours[name] == theirs[name], f"{name}: the same pins, another layer"
    for name in set(differ) & set(ours):
        assert ours[name] != theirs[name], name
    assert not uploaded & {ours[name] for name in shared}, "a shared group's layer was uploaded again"
    assert ours["torch"] in uploaded  # the log is read right: what differs did go up
    reported = {layer["digest"]: layer for layer in image["layers"]}
    assert all(reported[ours[name]]["in_registry_before"] is True for name in shared)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.registry
def test_a_missing_alias_is_pointed_at_the_published_image(docker_engine: Any, base_image: str,
                                                           first_run: dict[str, Any]) -> None:
    (before,) = first_run["report"]["images"]
    digest = next(iter(before["pushed"].values()))
    image = rendered_signed(first_run["registry"], base_image, buildkit=True)
    assert image.inputs_hash == before["inputs_hash"]
    alias = f"alias-{uuid.uuid4().hex[:6]}"
    with_alias = replace(image, tags=(*image.tags, alias))  # an alias the registry never saw
    registry = HttpRegistry(config={})
    (step,) = plan([with_alias], lookup(registry, [with_alias]))
    assert (step.action, step.retag) == (RETAG, (with_alias.refs[-1],))
    (outcome,) = publish([step], engine=docker_engine, builder=ClassicBuilder(docker_engine),
                                 registry=registry, options=RunOptions(matrix_path=default_matrix_path()))
    assert outcome.status == RETAGGED and outcome.pushed[with_alias.refs[-1]] == digest
    assert _head(with_alias.refs[-1]) == digest


def _put_labelled_image(refs: Sequence[str], labels: dict[str, str]) -> str:
    """A one-layer OCI image whose config carries `labels`, put under every ref through the
    registry API (loopback http, no engine): all a plan reads of a published image."""
    import gzip
    import io
    import tarfile

    tar = io.BytesIO()
    tarfile.open(fileobj=tar, mode="w").close()
    layer = gzip.compress(tar.getvalue(), mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
                         "rootfs": {"type": "layers",
                                    "diff_ids": ["sha256:" + hashlib.sha256(tar.getvalue()).hexdigest()]}}).encode()
    digests = set()
    for ref in refs:
        r = parse_reference(ref)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **put_blob(r.host, r.repository, config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        **put_blob(r.host, r.repository, layer)}],
        }).encode()
        digests.add(put_manifest(r.host, r.repository, r.reference, manifest, OCI_MANIFEST))
    (digest,) = digests
    return str(digest)


@pytest.mark.registry
def test_a_dry_run_renders_for_the_builder_the_run_builds_with(local_registry: LocalRegistry,
                                                                empty_security_mirror: str, tmp_path: Path) -> None:
    """The registry holds what a BuildKit publish pushes (the BuildKit render's inputs hash
    under every tag and today's dated tag): `publish --builder buildkit --dry-run` plans to
    skip it. The dry run decides the builder where the run does (engine.select), so it
    renders the same Dockerfile and computes the same inputs hash; it used to render for the
    classic builder and plan `build ... inputs changed`."""
    from imagebuilder.engine.select import detect_buildkit

    if detect_buildkit()[0] is None:
        _unavailable("no docker CLI here builds with BuildKit")
    # Named in FROM; where a daemon answers, the dry run reads its OS as the run does (the
    # security fixes, from a suite made here: no network).
    base_image = "imagebuilder-base:bookworm"
    registry = f"{local_registry.address}/imagebuilder-test/dry-{uuid.uuid4().hex[:8]}"
    image = rendered_signed(registry, base_image, buildkit=True, mirror=empty_security_mirror)
    assert image.inputs_hash != rendered_signed(registry, base_image, mirror=empty_security_mirror).inputs_hash  # the builder matters
    today = datetime.now(timezone.utc).date()
    digest = _put_labelled_image([*image.refs, dated_ref(image, today)], {HASH: image.inputs_hash})
    dry = imagebuilder(*_publish_args(base_image, registry, tmp_path / "dry.json", "--dry-run"),
                       env_extra={"IMAGEBUILDER_SECURITY_MIRROR": empty_security_mirror})
    assert dry.returncode == 0, dry.stderr[-4000:]
    rows = [line.split(None, 3) for line in dry.stdout.splitlines() if line[:1].isdigit()]
    assert [(action, ref) for _, action, ref, _ in rows] == [(SKIP, image.ref)], dry.stdout
    assert f"published as {digest.removeprefix('sha256:')[:12]}" in dry.stdout


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.registry
def test_a_registry_that_goes_down_fails_the_run_and_claims_nothing(
        docker_engine: Any, base_image: str, local_registry: LocalRegistry, first_run: dict[str, Any],
        request: pytest.FixtureRequest) -> None:
    from smoke_tests.result import Result

    from imagebuilder.verify.report import VerifyReport

    (verified,) = first_run["report"]["images"]
    # The runtime image's plan and tags in a fresh namespace, built from a small Dockerfile of
    # its own (a unique layer and the SBOM file the runner labels): what fails here is the
    # push, and rebuilding torch twice with the classic builder took 15 minutes.
    namespace = f"imagebuilder-test/down-{uuid.uuid4().hex[:8]}"
    # Its images go after it (first_run's registry is another one now, whose cleanup missed these).
    request.addfinalizer(lambda: remove_local_tags(docker_engine, namespace))
    rendered = rendered_signed(f"{local_registry.address}/{namespace}", base_image)
    image = replace(rendered, files={}, dockerfile=(
        f"FROM {base_image}\n"
        f"RUN mkdir -p /opt/imagebuilder && echo '{{\"down\": \"{uuid.uuid4().hex}\"}}' > {SBOM_PATH}\n"))
    registry = HttpRegistry(config={})
    steps = plan([image], lookup(registry, [image]))
    assert [s.action for s in steps] == [BUILD]
    options = RunOptions(matrix_path=default_matrix_path(), push_retries=2, push_backoff=0.2)

    def recorded(engine: Any, registry: Any, ref: str, _: RunOptions) -> VerifyReport:
        # The same image the first run smoke-tested (same rendered inputs, same layers): its verdict.
        checks = tuple(Result.from_dict(c) for c in verified["verify"]["checks"])
        return VerifyReport(ref, "docker", (), checks, require_gpu=False)

    def stop_before_push(phase: str, step: Step) -> None:
        if phase == "push":
            local_registry.stop()

    try:
        outcomes = list(publish(steps, engine=docker_engine, builder=ClassicBuilder(docker_engine),
                                        registry=registry, options=options, on_event=stop_before_push, verifier=recorded))
    finally:
        local_registry.start()
    (outcome,) = outcomes
    assert outcome.status == FAILED and outcome.pushed == {}
    assert "push failed" in outcome.reason and image.ref in outcome.reason
    with pytest.raises(PublishFailed, match="1 of 1 images failed"):
        raise_if_failed(outcomes)
    assert all(_head(ref) is None for ref in image.refs)  # the registry is back: nothing is there

    # Back up: the same plan completes; every tag names what the push reported. The rebuild
    # (a new creation date) takes the tags and removes the first build, its steps too.
    failed_build = docker_engine.inspect_image(image.ref)
    (outcome,) = publish(plan([image], lookup(registry, [image])), engine=docker_engine,
                                 builder=ClassicBuilder(docker_engine), registry=registry, options=options, verifier=recorded)
    assert outcome.status == PUSHED and set(outcome.pushed) == set(image.refs)
    assert all(_head(ref) == digest for ref, digest in outcome.pushed.items())
    assert registry.labels(image.ref) == docker_engine.image_labels(image.ref)
    assert not docker_engine.image_exists(failed_build["Id"]) and not docker_engine.image_exists(failed_build["Parent"])


# --------------------------------------------------------------------------- failures in the runner


@pytest.mark.docker
@pytest.mark.parametrize("keep_going, jupyter_status, other_status", [
    (True, FAILED, SKIPPED),
    (False, NOT_RUN, NOT_RUN),
])
def test_a_failed_runtime_fails_its_jupyter(docker_engine: Any, base_image: str, image_repo: str,
                                            keep_going: bool, jupyter_status: str, other_status: str) -> None:
    runtime, jupyter = _images(f"{image_repo}/pytorch")
    broken = replace(runtime, dockerfile=f"FROM {base_image}\nRUN echo broken-{uuid.uuid4().hex} && exit 3\n", files={})
    other = replace(runtime, tags=("other",))  # published already: skipped, never built
    steps = [Step(broken, BUILD, "not in the registry"), Step(jupyter, BUILD, "base image rebuilt"),
             Step(other, SKIP, "unchanged", D1)]
    outcomes = list(publish(steps, engine=docker_engine, builder=ClassicBuilder(docker_engine),
                                    registry=HttpRegistry(config={}), options=RunOptions(matrix_path=SMALL, keep_going=keep_going)))
    assert [o.status for o in outcomes] == [FAILED, jupyter_status, other_status]
    assert "build failed" in outcomes[0].reason and "exit code 3" in outcomes[0].reason
    if keep_going:
        assert outcomes[1].reason == f"its base image {runtime.ref} failed"
    else:
        assert "--keep-going" in outcomes[1].reason
    assert not docker_engine.image_exists(runtime.ref) and not docker_engine.image_exists(jupyter.ref)
    summary = format_summary(outcomes)
    assert all(o.step.image.tags[0] in summary for o in outcomes)
    with pytest.raises(PublishFailed):
        raise_if_failed(outcomes)


# --------------------------------------------------------------------------- the nightly merge and the dry run
# Against a fresh registry each: the platform images the per-platform jobs would have pushed
# are stand-ins (a config blob and a manifest per platform, written through the registry API),
# so these need no engine and no build.

MERGE_COORDINATES = ("--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--os", "debian12")


@pytest.fixture
def fresh_registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    with running_registry(tmp_path / "registry") as reg:
        yield reg


def _storage(reg: LocalRegistry) -> dict[str, str]:
    """Every path under the registry's storage with the sha256 of its bytes ('' for a folder)."""
    root = reg.root / "data"
    return {str(p.relative_to(root)): "" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def _api(reg: LocalRegistry, ref: str) -> tuple[str, str]:
    """(the repository's API url, the tag) of a ref in `reg`."""
    r = parse_reference(ref)
    return f"http://{reg.address}/v2/{r.repository}", r.reference


def _push_stand_in(reg: LocalRegistry, ref: str, platform: str, layer: bytes | None = None) -> str:
    """Put a tiny image of `platform` under `ref`, as a per-platform publish job would have (with
    `layer`: that one layer, as it is); its digest."""
    from imagebuilder.registry.manifests import DOCKER_MANIFEST

    url, tag = _api(reg, ref)
    os_name, _, architecture = platform.partition("/")
    config = json.dumps({"architecture": architecture, "os": os_name, "config": {},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    layers = [] if layer is None else [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                                        "size": len(layer), "digest": _upload_blob(url, layer)}]
    manifest = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "layers": layers,
                           "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                      "size": len(config), "digest": _upload_blob(url, config)}}).encode()
    request = urllib.request.Request(f"{url}/manifests/{tag}", data=manifest, method="PUT",
                                     headers={"Content-Type": DOCKER_MANIFEST})
    with urllib.request.urlopen(request) as r:
        return str(r.headers["Docker-Content-Digest"])


def _upload_blob(url: str, data: bytes) -> str:
    """Upload `data` into the repository at `url` (its API url, _api's); its digest."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with urllib.request.urlopen(urllib.request.Request(f"{url}/blobs/uploads/", data=b"", method="POST")) as r:
        location = r.headers["Location"]
    location += ("&" if "?" in location else "?") + f"digest={digest}"
    urllib.request.urlopen(urllib.request.Request(location, data=data, method="PUT",
                                                  headers={"Content-Type": "application/octet-stream"})).close()
    return digest


def _get_manifest(reg: LocalRegistry, ref: str) -> tuple[str, dict[str, Any]] | None:
    from imagebuilder.registry.manifests import ACCEPT

    url, tag = _api(reg, ref)
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/manifests/{tag}", headers={"Accept": ACCEPT})) as r:
            return r.headers["Content-Type"], json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def _tag(ref: str, platform: str) -> str:
    """The tag (no repository) of a ref's platform image."""
    return parse_reference(platform_ref(ref, platform)).reference


def _stand_ins(reg: LocalRegistry, refs: list[str], *, leave_out: tuple[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Both platforms' images under every ref but `leave_out` (ref, platform); ref -> platform -> digest."""
    pushed: dict[str, dict[str, str]] = {}
    for ref in refs:
        for platform in BOTH:
            if (ref, platform) != leave_out:
                pushed.setdefault(ref, {})[platform] = _push_stand_in(reg, platform_ref(ref, platform), platform)
    return pushed


def _merge(registry: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return imagebuilder("publish", *MERGE_COORDINATES, "--registry", registry, "--platform", ",".join(BOTH),
                        "--merge-only", *extra)


@pytest.mark.registry
def test_merge_only_merges_every_complete_tag_reports_each_and_fails_naming_the_rest(
        fresh_registry: LocalRegistry, tmp_path: Path) -> None:
    from imagebuilder.registry.manifests import OCI_INDEX

    registry = f"{fresh_registry.address}/ns"
    refs = [ref for image in merge_images(registry) for ref in image.refs]
    missing = refs[0]  # the first tag in the order lacks its arm64 image; every later one has both
    pushed = _stand_ins(fresh_registry, refs, leave_out=(missing, "linux/arm64"))
    report = tmp_path / "merge.json"
    done = _merge(registry, "--report", str(report))
    assert done.returncode == 1, done.stderr
    # Every tag whose platforms are there is an index over exactly them ...
    for ref in refs[1:]:
        got = _get_manifest(fresh_registry, ref)
        assert got is not None, f"{ref} was not merged:\n{done.stdout}\n{done.stderr}"
        media_type, index = got
        assert media_type == OCI_INDEX
        assert {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
                for m in index["manifests"]} == pushed[ref]
    assert _get_manifest(fresh_registry, missing) is None
    # ... each tag is reported, and the job fails at the end naming the one it could not merge.
    lines = [line for line in done.stdout.splitlines() if line.startswith("index ")]
    assert len(lines) == len(refs)
    assert f"index {missing}: skipped: {_tag(missing, 'linux/arm64')} is not in the registry" in done.stdout
    assert all(f"index {ref}: written sha256:" in done.stdout for ref in refs[1:])
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"1 of {len(refs)} tags could not be made indexes" in error
    assert f": {parse_reference(missing).reference}; the other {len(refs) - 1} are indexes" in error
    document = json.loads(report.read_text())
    assert document["ok"] is False
    assert [(i["ref"], i["status"]) for i in document["indexes"]] == [
        (missing, "skipped"), *((ref, "written") for ref in refs[1:])]
    # A rerun writes nothing new: the merged tags are unchanged, the missing one still fails.
    before = _storage(fresh_registry)
    again = _merge(registry)
    assert again.returncode == 1
    assert all(f"index {ref}: unchanged sha256:" in again.stdout for ref in refs[1:])
    assert _storage(fresh_registry) == before


def _push_index_stand_in(reg: LocalRegistry, ref: str, platforms: tuple[str, ...]) -> dict[str, str]:
    """Put an OCI index under `ref` over a tiny image of each of `platforms`, as the containerd store
    pushes a multi-platform image; platform -> its image's digest."""
    from imagebuilder.registry.manifests import ACCEPT, OCI_INDEX

    url, tag = _api(reg, ref)
    entries, digests = [], {}
    for platform in platforms:
        image = f"{ref}-stand-in-{platform.rpartition('/')[2]}"
        digests[platform] = _push_stand_in(reg, image, platform)
        request = urllib.request.Request(f"{url}/manifests/{digests[platform]}", headers={"Accept": ACCEPT})
        with urllib.request.urlopen(request) as r:
            media_type, size = r.headers["Content-Type"], len(r.read())
        os_name, _, architecture = platform.partition("/")
        entries.append({"mediaType": media_type, "size": size, "digest": digests[platform],
                        "platform": {"os": os_name, "architecture": architecture}})
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{url}/manifests/{tag}", data=body, method="PUT",
                                                  headers={"Content-Type": OCI_INDEX})).close()
    return digests


@pytest.mark.registry
def test_merge_only_refuses_a_platform_tag_whose_image_is_of_another_platform(
        fresh_registry: LocalRegistry) -> None:
    """Through the registry API: an amd64 image under TAG-arm64 (plain, or the only image of an
    index) fails its tag's index and nothing is written for it; an index with both platforms'
    images (the multi-platform base of test_buildkit) joins by its arm64 image."""
    registry = f"{fresh_registry.address}/ns"
    refs = [ref for image in merge_images(registry) for ref in image.refs]
    _stand_ins(fresh_registry, refs)
    plain, indexed, both = refs[:3]
    _push_stand_in(fresh_registry, platform_ref(plain, "linux/arm64"), "linux/amd64")
    _push_index_stand_in(fresh_registry, platform_ref(indexed, "linux/arm64"), ("linux/amd64",))
    arm64 = _push_index_stand_in(fresh_registry, platform_ref(both, "linux/arm64"), BOTH)["linux/arm64"]
    done = _merge(registry)
    assert done.returncode == 1, done.stderr
    for ref in (plain, indexed):
        assert (f"index {ref}: failed: {_tag(ref, 'linux/arm64')} is a linux/amd64 image, not linux/arm64 "
                "(its image config says so)") in done.stdout
        assert _get_manifest(fresh_registry, ref) is None
    got = _get_manifest(fresh_registry, both)
    assert got is not None, done.stdout
    assert {m["digest"] for m in got[1]["manifests"] if m["platform"]["architecture"] == "arm64"} == {arm64}
    assert all(f"index {ref}: written sha256:" in done.stdout for ref in refs[2:])
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"2 of {len(refs)} tags could not be made indexes" in error


@pytest.mark.registry
def test_the_report_s_layers_of_an_index_come_from_each_platform_s_manifest_in_a_real_registry(
        fresh_registry: LocalRegistry) -> None:
    """What --report lists of an image published for two platforms, read through the registry
    API: each platform manifest's layer with its digest and size; and what a push would have
    asked first, a HEAD of each in the image's repository (another repository has none)."""
    from imagebuilder.registry.reference import pinned

    ref = f"{fresh_registry.address}/ns/pytorch:2.11-runtime"
    layers = {platform: os.urandom(1000 + n) for n, platform in enumerate(BOTH)}
    manifests = {platform: _push_stand_in(fresh_registry, platform_ref(ref, platform), platform, layers[platform])
                 for platform in BOTH}
    registry = HttpRegistry(config={})
    index = registry.put_index(ref, registry.index_for(ref, [(manifests[p], p) for p in BOTH]))
    found = published_layers(registry, pinned(ref, index))
    digests = {platform: "sha256:" + hashlib.sha256(layer).hexdigest() for platform, layer in layers.items()}
    assert found.reason is None
    assert [(layer.platform, layer.manifest, layer.digest, layer.size, layer.in_registry_before)
            for layer in found.layers or ()] == [
        (platform, manifests[platform], digests[platform], len(layers[platform]), True) for platform in BOTH]
    assert check_before(registry, ref, (ref,)).had == dict.fromkeys(digests.values(), True)
    other = f"{fresh_registry.address}/ns/other:x"
    assert check_before(registry, other, (ref,)).had == dict.fromkeys(digests.values(), False)


@pytest.mark.registry
def test_merge_only_dry_run_lists_the_plan_and_leaves_the_registry_byte_identical(
        fresh_registry: LocalRegistry, tmp_path: Path) -> None:
    registry = f"{fresh_registry.address}/ns"
    refs = [ref for image in merge_images(registry) for ref in image.refs]
    # An empty registry: the plan, every tag waiting for both platforms' images, and exit 0.
    empty = _merge(registry, "--dry-run")
    assert empty.returncode == 0, empty.stderr
    for ref in refs:
        assert f"index {ref}: would skip: {_tag(ref, 'linux/amd64')}, {_tag(ref, 'linux/arm64')} are not in " \
               "the registry; publish --platform linux/amd64,linux/arm64 first" in empty.stdout
    # Both platforms' images but one: the plan writes all the others, and the dry run writes nothing.
    _stand_ins(fresh_registry, refs, leave_out=(refs[-1], "linux/amd64"))
    before = _storage(fresh_registry)
    report = tmp_path / "plan.json"
    done = _merge(registry, "--dry-run", "--report", str(report))
    assert done.returncode == 0, done.stderr
    assert _storage(fresh_registry) == before
    assert all(_get_manifest(fresh_registry, ref) is None for ref in refs)
    assert all(f"index {ref}: would write sha256:" in done.stdout for ref in refs[:-1])
    assert f"index {refs[-1]}: would skip: {_tag(refs[-1], 'linux/amd64')} is not in" in done.stdout
    document = json.loads(report.read_text())
    assert document["dry_run"] is True
    assert [(i["ref"], i["status"]) for i in document["indexes"]] == [
        *((ref, "write") for ref in refs[:-1]), (refs[-1], "skip")]
    # What the dry run said it would write is what the merge writes.
    planned = {i["ref"]: i["digest"] for i in document["indexes"] if i["status"] == "write"}
    assert _merge(registry).returncode == 1
    assert {ref: _head(ref) for ref in refs[:-1]} == planned


@pytest.mark.registry
def test_dry_run_shows_every_tag_and_index_the_run_would_write_and_reports_the_plan(
        fresh_registry: LocalRegistry, tmp_path: Path) -> None:
    from imagebuilder.build.platforms import platform_tags

    registry = f"{fresh_registry.address}/ns"
    (runtime,) = [image for image in merge_images(registry) if image.spec.variant == "runtime"]
    day = date(2026, 12, 1)
    before = _storage(fresh_registry)
    report = tmp_path / "plan.json"
    done = imagebuilder("publish", *MERGE_COORDINATES, "--variant", "runtime", "--registry", registry,
                        "--platform", ",".join(BOTH), "--builder", "buildkit", "--dry-run", "--date", day.isoformat(),
                        "--report", str(report))
    assert done.returncode == 0, done.stderr
    assert _storage(fresh_registry) == before
    document = json.loads(report.read_text())
    assert document["dry_run"] is True and document["images"] == []
    planned = {entry["ref"]: entry for entry in document["planned"]}
    for platform in BOTH:
        image = replace(runtime, tags=platform_tags(runtime.tags, platform))
        dated = dated_ref(image, day)
        # Every tag it pushes, the day's dated one included, is on the plan and in the report.
        for ref in (*image.refs, dated):
            assert parse_reference(ref).reference in done.stdout, ref
        assert planned[image.ref]["action"] == BUILD and planned[image.ref]["push"] == [*image.refs, dated]
    # And every index it writes after the pushes, over each platform's tag.
    for ref in runtime.refs:
        tags = [_tag(ref, platform) for platform in BOTH]
        assert f"index {ref}: would write over linux/amd64, linux/arm64 after this run writes {', '.join(tags)}" \
            in done.stdout
    assert [(i["ref"], i["status"]) for i in document["indexes"]] == [(ref, "write") for ref in runtime.refs]


@pytest.mark.docker
@pytest.mark.registry
def test_dry_run_with_a_base_image_plans_the_images_of_its_os_as_the_run_does(
        base_image: str, fresh_registry: LocalRegistry, tmp_path: Path) -> None:
    registry = f"{fresh_registry.address}/ns"
    report = tmp_path / "plan.json"
    done = imagebuilder("publish", "--torch", TORCH, "--cuda", CUDA, "--base-image", base_image, "--registry", registry,
                        "--dry-run", "--report", str(report))
    assert done.returncode == 0, done.stderr
    # What the run builds: the base image is Debian 12, so the debian12 images, every variant.
    listed = imagebuilder("matrix", "--torch", TORCH, "--cuda", CUDA, "--os", OS, "--base-image", base_image,
                          "--format", "json")
    expected = {f"{registry}/pytorch:{row['tag']}" for row in json.loads(listed.stdout)}
    assert len(expected) == 4
    assert {entry["ref"] for entry in json.loads(report.read_text())["planned"]} == expected
    assert f"--os {OS}: read from {base_image}'s /etc/os-release" in done.stderr
