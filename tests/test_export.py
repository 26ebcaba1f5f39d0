"""How BuildKit builds leave the builder (compression, provenance, caches), the pull preflight
for compressions, and provenance read back: pure, as tables."""

from __future__ import annotations

from typing import Any

import pytest

from imagebuilder.engine.api import Pushed
from imagebuilder.engine.export import Compression, Export, cache_ref, cannot_pull, compression_of, output_args
from imagebuilder.engine.export_decision import (ChunkedAtPublish, CompressionUnavailable, ExportDecision,
                                                 ExportNeedsBuildKit, Ordered, decide_export)
from imagebuilder.errors import BadRequest
from imagebuilder.registry.reference import RegistryTarget
from imagebuilder.trust.provenance import built_from
from imagebuilder.verify.preflight import HostFacts, preflight

CACHE = "127.0.0.1:5000/ml/imagebuilder-cache:2.6.0-cuda12.1-cudnn9-debian12-runtime"


@pytest.mark.parametrize("export, expected", [
    (None, ["--load"]),
    (Export(), ["--load", "--provenance=false"]),
    (Export(Compression("zstd"), provenance=True),
     ["--output", "type=image,compression=zstd,force-compression=true,oci-mediatypes=true", "--provenance=mode=max"]),
    (Export(Compression("gzip", 9)),
     ["--output", "type=image,compression=gzip,force-compression=true,oci-mediatypes=true,compression-level=9",
      "--provenance=false"]),
    (Export(Compression("zstd"), cache_from=(CACHE,), cache_to=CACHE),
     ["--output", "type=image,compression=zstd,force-compression=true,oci-mediatypes=true", "--provenance=false",
      "--cache-from", f"type=registry,ref={CACHE},registry.insecure=true",
      "--cache-to", f"type=registry,ref={CACHE},mode=min,oci-mediatypes=true,image-manifest=true,compression=zstd,"
                    "force-compression=true,ignore-error=true,registry.insecure=true"]),
    # The cache's blobs are the image's: compressed as the image's layers are.
    (Export(Compression("gzip", 9), cache_to=CACHE),
     ["--output", "type=image,compression=gzip,force-compression=true,oci-mediatypes=true,compression-level=9",
      "--provenance=false",
      "--cache-to", f"type=registry,ref={CACHE},mode=min,oci-mediatypes=true,image-manifest=true,compression=gzip,"
                    "force-compression=true,ignore-error=true,registry.insecure=true"]),
    # eStargz: gzip that a stargz snapshotter mounts lazily; its cache's blobs are the image's too.
    (Export(Compression("estargz"), cache_to=CACHE),
     ["--output", "type=image,compression=estargz,force-compression=true,oci-mediatypes=true", "--provenance=false",
      "--cache-to", f"type=registry,ref={CACHE},mode=min,oci-mediatypes=true,image-manifest=true,compression=estargz,"
                    "force-compression=true,ignore-error=true,registry.insecure=true"]),
    # publish's cache export beside verify: no image, and a failed export fails that build.
    (Export(Compression("zstd"), cache_from=(CACHE,), cache_to=CACHE, image=False),
     ["--output", "type=cacheonly", "--provenance=false",
      "--cache-from", f"type=registry,ref={CACHE},registry.insecure=true",
      "--cache-to", f"type=registry,ref={CACHE},mode=min,oci-mediatypes=true,image-manifest=true,compression=zstd,"
                    "force-compression=true,registry.insecure=true"]),
    (Export(cache_from=("ghcr.io/acme/imagebuilder-cache:k",)),
     ["--load", "--provenance=false", "--cache-from", "type=registry,ref=ghcr.io/acme/imagebuilder-cache:k"]),
])
def test_output_args(export: Export | None, expected: list[str]) -> None:
    assert output_args(export) == expected


@pytest.mark.parametrize("asked, buildkit, store, expected", [
    # Docker 26 + the containerd store + buildx: what was asked; nothing asked: zstd, build's and
    # publish's default (not --load's gzip on one core)
    (None, True, True, Export(Compression("zstd"), provenance=True)),
    (Compression("zstd"), True, True, Export(Compression("zstd"), provenance=True)),
    (Compression("zstd", 9), True, True, Export(Compression("zstd", 9), provenance=True)),
    (Compression("gzip"), True, True, Export(Compression("gzip"), provenance=True)),  # for old pullers
    (Compression("gzip", 4), True, True, Export(Compression("gzip", 4), provenance=True)),
    # The classic store (Docker 20.10, or 24+ without the snapshotter) or the classic builder:
    # docker push compresses with gzip, nothing to choose.
    (None, True, False, None),
    (Compression("gzip"), False, False, None),
    (None, False, True, None),
])
def test_publish_exports(asked: Compression | None, buildkit: bool, store: bool, expected: Export | None) -> None:
    decision = decide_export(asked, command="publish", buildkit=buildkit, image_store=store)
    assert decision.export == expected and decision.ordered is None and not decision.gzip_too


@pytest.mark.parametrize("asked, buildkit, store, expected", [
    (None, True, True, Export(Compression("zstd"))),  # not --load's gzip on one core
    (Compression("gzip"), True, True, Export(Compression("gzip"))),  # asked for
    (Compression("zstd", 19), True, True, Export(Compression("zstd", 19))),
    (None, True, False, None),  # the classic store: --load, as docker build does
    (None, False, True, None),  # the classic builder
])
def test_build_defaults_to_zstd_where_buildkit_exports_into_the_store(
        asked: Compression | None, buildkit: bool, store: bool, expected: Export | None) -> None:
    decision = decide_export(asked, command="build", buildkit=buildkit, image_store=store)
    assert decision.for_image("2.6.0-cuda12.1-cudnn9-py3.11-debian12-runtime", lambda ref: False) == expected


def test_build_imports_its_registry_cache_where_the_registry_has_it_and_publish_exports_it_too() -> None:
    target = RegistryTarget.parse("127.0.0.1:5000/ml")
    key = "2.6.0-cuda12.1-cudnn9-debian12-runtime"
    build = decide_export(None, command="build", buildkit=True, image_store=True, cache=target)
    assert build.for_image(key, lambda ref: ref == CACHE) == Export(Compression("zstd"), cache_from=(CACHE,))
    assert build.for_image(key, lambda ref: False) == Export(Compression("zstd"))
    publish = decide_export(None, command="publish", buildkit=True, image_store=True, cache=target)
    assert publish.for_image(key, lambda ref: False) == Export(Compression("zstd"), provenance=True, cache_to=CACHE)


@pytest.mark.parametrize("asked, ordered", [
    (Compression("estargz"), Ordered("estargz", None)), (Compression("estargz", 4), Ordered("estargz", 4)),
    (Compression("zstd:chunked"), Ordered("zstd:chunked", None)),
    (Compression("zstd:chunked", 12), Ordered("zstd:chunked", 12))])
def test_publish_exports_ordered_layers_as_zstd_and_pushes_them_itself(asked: Compression, ordered: Ordered) -> None:
    decision = decide_export(asked, command="publish", buildkit=True, image_store=True)
    assert decision == ExportDecision(Export(Compression("zstd"), provenance=True), ordered=ordered, cache_to=True)
    assert decision.describe().startswith("zstd, exported by BuildKit")


def test_build_exports_estargz_itself_and_refuses_zstd_chunked_before_any_daemon() -> None:
    assert decide_export(Compression("estargz"), command="build", buildkit=True, image_store=True).export == Export(
        Compression("estargz"))
    with pytest.raises(ChunkedAtPublish):
        decide_export(Compression("zstd:chunked"), command="build", buildkit=True, image_store=None)


@pytest.mark.parametrize("asked, cache, said", [
    (Compression("zstd"), None, "--compression zstd needs BuildKit: the classic builder"),
    (Compression("gzip", 9), None, "--compression-level needs BuildKit: the classic builder"),
    (None, RegistryTarget.parse("127.0.0.1:5000/ml"), "--cache-from-registry needs BuildKit: the classic builder"),
])
def test_the_classic_builder_asked_for_refuses_an_export_before_any_daemon(
        asked: Compression | None, cache: RegistryTarget | None, said: str) -> None:
    with pytest.raises(ExportNeedsBuildKit, match=said):
        decide_export(asked, command="build", buildkit=False, image_store=None, cache=cache)
    assert decide_export(Compression("gzip"), command="publish", buildkit=False, image_store=None).export is None


@pytest.mark.parametrize("asked, buildkit, store, cache, said", [
    (Compression("zstd"), True, False, None, "--compression zstd needs BuildKit"),
    (Compression("gzip", 9), False, False, None, "--compression-level needs BuildKit"),
    (None, False, False, RegistryTarget.parse("127.0.0.1:5000/ml"), "--cache-from-registry needs BuildKit"),
])
def test_what_only_the_containerd_store_gives_is_a_bad_request_elsewhere(
        asked: Compression | None, buildkit: bool, store: bool, cache: RegistryTarget | None, said: str) -> None:
    with pytest.raises(CompressionUnavailable, match=said) as e:
        decide_export(asked, command="build", buildkit=buildkit, image_store=store, cache=cache)
    assert e.value.exit_code == 2 and "containerd-snapshotter" in str(e.value)


@pytest.mark.parametrize("kind, level, said", [
    ("gzip", 10, "--compression-level 10 is not a gzip level; gzip takes 0..9"),
    ("zstd", 23, "zstd takes 0..22"),
    ("zstd", -1, "--compression-level -1 is not a zstd level"),
    ("estargz", 10, "estargz takes 0..9"),
    ("zstd:chunked", 23, "zstd:chunked takes 0..22"),
    ("lz4", None, "--compression 'lz4' is not a compression; give zstd, gzip, estargz, zstd:chunked or gzip+zstd"),
    (None, 3, "--compression-level 3 sets the level of --compression: give --compression zstd, gzip, estargz, zstd:chunked or gzip+zstd"),
])
def test_bad_compressions(kind: str | None, level: int | None, said: str) -> None:
    with pytest.raises(BadRequest) as e:
        Compression.asked(kind, level)
    assert said in str(e.value)


@pytest.mark.parametrize("kind, level, expected", [
    (None, None, None),  # the engine's default (choose)
    ("zstd", None, Compression("zstd")),
    ("gzip", 0, Compression("gzip", 0)),
    ("estargz", 9, Compression("estargz", 9)),
])
def test_compression_asked(kind: str | None, level: int | None, expected: Compression | None) -> None:
    assert Compression.asked(kind, level) == expected


def test_cache_ref_is_one_tag_per_image_beside_the_images() -> None:
    assert cache_ref(RegistryTarget.parse("127.0.0.1:5000/ml/"), "2.6.0-cuda12.1-cudnn9-debian12-runtime") == CACHE


ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"


@pytest.mark.parametrize("media, expected", [
    ([GZIP, ZSTD, "application/vnd.in-toto+json"], "zstd"),
    ([GZIP, "application/vnd.oci.image.config.v1+json"], "gzip"),
    ([DOCKER_GZIP], "gzip"),
    (["application/vnd.in-toto+json"], None),
])
def test_compression_of(media: list[str], expected: str | None) -> None:
    assert compression_of(media) == expected


@pytest.mark.parametrize("compression, version, refused", [
    ("zstd", "20.10.24+dfsg1", True),
    ("zstd", "23.0.0", False),
    ("zstd", "26.1.5+dfsg1", False),
    ("gzip", "20.10.24", False),
    (None, "20.10.24", False),
    ("zstd", None, False),
])
def test_cannot_pull(compression: str | None, version: str | None, refused: bool) -> None:
    assert (cannot_pull(compression, version) is not None) == refused


def test_preflight_says_in_one_line_that_the_daemon_cannot_pull_zstd() -> None:
    why = cannot_pull("zstd", "20.10.24+dfsg1")
    checked = preflight(HostFacts(compression="zstd", compression_error=why), allow_no_gpu=True)
    assert not checked.ok
    (problem,) = checked.problems
    assert problem.name == "compression" and "\n" not in problem.detail
    assert "Docker 20.10.24+dfsg1" in problem.detail and "--compression gzip" in problem.detail


def test_uploaded_bytes_count_only_the_blobs_this_push_sent() -> None:
    blobs = {"sha256:" + "a" * 64: (1000, ZSTD), "sha256:" + "b" * 64: (20, ZSTD), "sha256:" + "c" * 64: (5, "")}
    assert Pushed("sha256:d", frozenset({"a" * 12, "c" * 12})).uploaded_bytes(blobs) == 1005
    assert Pushed("sha256:d", frozenset()).uploaded_bytes(blobs) == 0


PREDICATE: dict[str, Any] = {
    "predicateType": "https://slsa.dev/provenance/v0.2",
    "builder": {"id": ""},
    "materials": [{"uri": "pkg:docker/imagebuilder-base@bookworm?platform=linux%2Famd64",
                   "digest": {"sha256": "e8ae"}}],
    "invocation": {"parameters": {"frontend": "dockerfile.v0", "args": {
        "label:org.opencontainers.image.revision": "0" * 40,
        "label:io.imagebuilder.matrix": "matrix.yaml sha256:12ab",
        "label:io.imagebuilder.lock": "locks/x.txt sha256:34cd",
        "build-arg:IGNORED": "1"}}},
}


def test_built_from_reads_revision_matrix_and_lock_out_of_the_provenance() -> None:
    found = built_from(PREDICATE)
    assert (found.revision, found.matrix, found.lock) == ("0" * 40, "matrix.yaml sha256:12ab", "locks/x.txt sha256:34cd")
    assert found.base == ("pkg:docker/imagebuilder-base@bookworm?platform=linux%2Famd64@sha256:e8ae",)
    first = found.lines()[0]
    assert first == f"built from: revision {'0' * 40}, matrix matrix.yaml sha256:12ab, lock locks/x.txt sha256:34cd"


# --- Docker 20.10 and Docker 26, from canned daemon answers ------------------------------

DOCKER_20_INFO = {"ServerVersion": "20.10.24+dfsg1", "Driver": "overlay2",
                  "DriverStatus": [["Backing Filesystem", "extfs"], ["Supports d_type", "true"]]}
DOCKER_26_INFO = {"ServerVersion": "26.1.5+dfsg1", "Driver": "overlayfs",
                  "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}


@pytest.mark.parametrize("info, keeps", [(DOCKER_20_INFO, False), (DOCKER_26_INFO, True), ({}, False)])
def test_only_the_containerd_store_keeps_what_buildkit_compressed(info: dict[str, Any], keeps: bool) -> None:
    from imagebuilder.engine.docker import stores_manifests

    assert stores_manifests(info) is keeps


DIGEST = "sha256:" + "2c" * 32
PUSH_EVENTS: dict[str, list[dict[str, Any]]] = {
    # Docker 20.10 (and the classic store): an aux record carries the digest.
    "20.10": [{"status": "The push refers to repository [127.0.0.1:5000/ml/x]"},
              {"status": "Pushed", "progressDetail": {}, "id": "63681898ca21"},
              {"status": "Layer already exists", "progressDetail": {}, "id": "a777dcce7b79"},
              {"status": f"1: digest: {DIGEST} size: 855"},
              {"progressDetail": {}, "aux": {"Tag": "1", "Digest": DIGEST, "Size": 855}}],
    # Docker 26 with the containerd store: no aux record, only the status line.
    "26": [{"status": "The push refers to repository [127.0.0.1:5000/ml/x]"},
           {"status": "Pushed", "progressDetail": {}, "id": "63681898ca21"},
           {"status": "Mounted from ml/y", "progressDetail": {}, "id": "a777dcce7b79"},
           {"status": f"1: digest: {DIGEST} size: 855"}],
}


@pytest.mark.parametrize("engine", sorted(PUSH_EVENTS))
def test_the_pushed_digest_and_uploaded_blobs_read_from_either_engines_stream(engine: str) -> None:
    from imagebuilder.engine.docker import DockerEngine

    class Api:
        def push(self, repository: str, tag: str, stream: bool, decode: bool) -> list[dict[str, Any]]:
            return PUSH_EVENTS[engine]

    class Client:
        api = Api()

    docker_engine = DockerEngine()
    docker_engine._client_obj = Client()  # type: ignore[assignment]
    pushed = docker_engine.push_counted("127.0.0.1:5000/ml/x:1")
    assert pushed.digest == DIGEST and pushed.uploaded == frozenset({"63681898ca21"})


@pytest.mark.parametrize("kind, suffix", [("zstd", "+zstd"), ("gzip", "+gzip"), ("estargz", "+gzip")])
def test_estargz_layers_are_gzip_ones_to_every_puller(kind: str, suffix: str) -> None:
    assert Compression(kind).media_suffix == suffix
    assert compression_of([f"application/vnd.oci.image.layer.v1.tar{suffix}"]) == suffix[1:]


def test_estargz_needs_the_containerd_store_and_takes_gzip_levels() -> None:
    with pytest.raises(CompressionUnavailable, match="--compression estargz needs BuildKit"):
        decide_export(Compression("estargz"), command="publish", buildkit=True, image_store=False)
    assert Compression("estargz", 9).level == 9
    with pytest.raises(BadRequest, match="estargz takes 0..9"):
        Compression("estargz", 10)
