"""publish/layer_reuse.py through the ordered push (publish/estargz.py), without a daemon: a
republish writes and uploads only the layers whose key changed, an unchanged image is not read
out of the engine, a blob the registry lost is written again, another repository mounts the
blobs, and the prefetch set a layer's order depends on is its own, not the whole profile's.
(tests/test_ordered_republish.py does the same with a real engine and registry.)"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from imagebuilder.engine.export import ESTARGZ, ZSTD_CHUNKED
from imagebuilder.estargz.profile import StartProfile
from imagebuilder.estargz.writer import write_estargz
from imagebuilder.publish.estargz import Converted, EstargzPublisher, reuse_summary
from imagebuilder.publish.layer_reuse import LayerStore, profile_key, writer_fingerprint
from imagebuilder.publish.plan import BUILD, PUSHED, Outcome, Step
from imagebuilder.publish.report import format_summary
from support.canned_publish import images
from support.estargz_layers import every_kind_layer
from support.ordered_saves import MemoryRegistry, SavingEngine, layer_tar

REPO = "127.0.0.1:5999/ml/app"
BASE = layer_tar({"usr/lib/libbase.so": b"b" * 300_000, "etc/os-release": b"ID=debian\n"})
VENV = layer_tar({"opt/venv/lib/torch.py": b"import x\n" * 1000, "opt/venv/lib/big.so": bytes(range(256)) * 2000})
APP1 = layer_tar({"app/main.py": b"print(1)\n"})
APP2 = layer_tar({"app/main.py": b"print(2)\n"})
START = ("python3", "-c", "import app")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[SavingEngine, MemoryRegistry, LayerStore]:
    engine = SavingEngine()
    engine.add(f"{REPO}:v1", [BASE, VENV, APP1])
    engine.add(f"{REPO}:v2", [BASE, VENV, APP2])
    return engine, MemoryRegistry(), LayerStore(tmp_path / "cache")


def _publisher(engine: SavingEngine, registry: MemoryRegistry, store: LayerStore | None, tmp_path: Path,
               start: tuple[str, ...] | None = None, codec: str = ZSTD_CHUNKED) -> EstargzPublisher:
    return EstargzPublisher(engine, registry, level=3, codec=codec, start=start, workdir=tmp_path, say=lambda _: None,
                            reuse=store)


def _layers(registry: MemoryRegistry, converted: Converted, repo: str = REPO) -> list[dict[str, Any]]:
    layers: list[dict[str, Any]] = registry.manifest(f"{repo}@{converted.manifest}")["layers"]
    return layers


@pytest.mark.parametrize("profile", [(), ("/usr/lib/big.so",), ("/usr/lib/hard.py", "/nowhere", "usr/lib/small.py"),
                                     ("/opt", "/usr/lib/link.so", "/usr/lib/big.so", "/usr/lib/big.so")])
def test_the_prefetch_set_read_from_the_names_is_the_one_the_writer_moves(tmp_path: Path, profile: tuple[str, ...]) -> None:
    layer = every_kind_layer()
    (tmp_path / "layer.tar").write_bytes(layer)
    store = LayerStore(tmp_path / "cache")
    store.keep_names("sha256:x", tmp_path / "layer.tar")
    written = write_estargz(io.BytesIO(layer), io.BytesIO(), profile, level=3, codec=ZSTD_CHUNKED, workers=1)
    assert store.found("sha256:x", profile) == written.prioritized
    assert store.found("sha256:unknown", profile) == (None if profile else ())


def test_the_writer_fingerprint_is_stable_and_differs_by_format() -> None:
    assert writer_fingerprint(ZSTD_CHUNKED) == writer_fingerprint(ZSTD_CHUNKED)
    assert writer_fingerprint(ZSTD_CHUNKED) != writer_fingerprint(ESTARGZ)


def test_a_republish_writes_and_uploads_only_the_changed_layer(setup: Any, tmp_path: Path) -> None:
    engine, registry, store = setup
    publisher = _publisher(engine, registry, store, tmp_path)
    first = publisher.push(f"{REPO}:v1", [f"{REPO}:v1"], None)
    assert (first.reused, first.saved, len(first.layers)) == ((), True, 3)
    blobs = len(registry.uploads)
    second = publisher.push(f"{REPO}:v2", [f"{REPO}:v2"], None)
    assert second.reused == (0, 1) and second.saved
    assert second.to_json()["written_layers"] == 1 and second.to_json()["reused_layers"] == 2
    new = [digest for _, digest in registry.uploads[blobs:]]
    assert second.layers[2].digest in new and first.layers[0].digest not in new and first.layers[1].digest not in new
    assert second.uploaded == second.layers[2].size
    one, two = _layers(registry, first), _layers(registry, second)
    assert one[:2] == two[:2] and one[2]["digest"] != two[2]["digest"]  # the same entries, annotations and all
    assert reuse_summary(second.to_json()) == "zstd:chunked layers: 1 written, 2 reused from an earlier publish"


def test_an_image_published_before_is_not_read_out_of_the_engine_again(setup: Any, tmp_path: Path) -> None:
    engine, registry, store = setup
    publisher = _publisher(engine, registry, store, tmp_path)
    first = publisher.push(f"{REPO}:v1", [f"{REPO}:v1"], None)
    again = publisher.push(f"{REPO}:v1", [f"{REPO}:v1-again"], None)
    assert engine.saves == [f"{REPO}:v1"]
    assert (again.saved, again.reused, again.uploaded) == (False, (0, 1, 2), 0)
    assert again.manifest == first.manifest and registry.digest(f"{REPO}:v1-again") == first.digest
    assert "the engine's save not read" in reuse_summary(again.to_json())


def test_a_kept_layer_whose_blob_the_registry_lost_is_written_again(setup: Any, tmp_path: Path) -> None:
    engine, registry, store = setup
    publisher = _publisher(engine, registry, store, tmp_path)
    first = publisher.push(f"{REPO}:v1", [f"{REPO}:v1"], None)
    del registry.blobs["127.0.0.1:5999/ml/app"][first.layers[0].digest]
    again = publisher.push(f"{REPO}:v1", [f"{REPO}:v1"], None)
    assert again.reused == (1, 2) and again.saved and again.layers == first.layers
    assert registry.has_blob(REPO, first.layers[0].digest) and again.uploaded == first.layers[0].size


def test_another_repository_of_the_registry_mounts_the_kept_blobs(setup: Any, tmp_path: Path) -> None:
    engine, registry, store = setup
    publisher = _publisher(engine, registry, store, tmp_path)
    first = publisher.push(f"{REPO}:v1", [f"{REPO}:v1"], None)
    engine.images["127.0.0.1:5999/ml/other:v1"] = engine.images[f"{REPO}:v1"]
    other = publisher.push("127.0.0.1:5999/ml/other:v1", ["127.0.0.1:5999/ml/other:v1"], None)
    assert other.reused == (0, 1, 2) and other.uploaded == 0
    assert {(r, d) for r, d, _ in registry.mounts} == {("127.0.0.1:5999/ml/other", w.digest) for w in first.layers}
    elsewhere = "127.0.0.1:6000/ml/app:v1"  # another registry: nothing to mount from, all written
    engine.images[elsewhere] = engine.images[f"{REPO}:v1"]
    assert publisher.push(elsewhere, [elsewhere], None).reused == ()


def test_a_layer_is_written_again_only_where_its_own_prefetch_set_changed(setup: Any, tmp_path: Path) -> None:
    """The kept profiles (as a publish keeps them) stand in for the start: nothing runs. v2's
    start opens another file of VENV: VENV is written again; BASE's files are the same, opened in
    another order (as a pipeline's processes do): it is not."""
    engine, registry, store = setup
    for ref, files in ((f"{REPO}:v1", ("/usr/lib/libbase.so", "/etc/os-release", "/opt/venv/lib/torch.py")),
                       (f"{REPO}:v2", ("/etc/os-release", "/usr/lib/libbase.so", "/opt/venv/lib/big.so",
                                       "/app/main.py"))):
        store.keep_profile(profile_key(engine.inspect_image(ref), START, "linux/amd64"),
                           StartProfile(files, START, "", 1.0))
    publisher = _publisher(engine, registry, store, tmp_path, start=START)
    first = publisher.push(f"{REPO}:v1", [f"{REPO}:v1"], None)
    assert (first.profiled, first.layers[0].prioritized, first.layers[1].prioritized) == (
        False, ("/usr/lib/libbase.so", "/etc/os-release"), ("/opt/venv/lib/torch.py",))
    second = publisher.push(f"{REPO}:v2", [f"{REPO}:v2"], None)
    assert second.reused == (0,) and second.layers[1].prioritized == ("/opt/venv/lib/big.so",)
    assert second.layers[0] == first.layers[0]  # as the first run wrote it
    manifest = registry.manifest(f"{REPO}@{second.manifest}")
    assert json.loads(manifest["annotations"]["io.imagebuilder.start-profile.command"]) == list(START)


def test_without_a_store_every_layer_is_written(setup: Any, tmp_path: Path) -> None:
    engine, registry, _ = setup
    publisher = _publisher(engine, registry, None, tmp_path, codec=ESTARGZ)
    for _ in range(2):
        converted = publisher.push(f"{REPO}:v1", [f"{REPO}:v1"], None)
        assert converted.reused == () and converted.saved
    assert len(engine.saves) == 2


def test_an_unwritable_cache_costs_only_the_reuse(setup: Any, tmp_path: Path) -> None:
    engine, registry, _ = setup
    (tmp_path / "file").write_text("")
    publisher = _publisher(engine, registry, LayerStore(tmp_path / "file" / "cache"), tmp_path)
    for _ in range(2):
        assert publisher.push(f"{REPO}:v1", [f"{REPO}:v1"], None).reused == ()


def test_the_summary_says_per_image_how_many_layers_were_written_and_reused(setup: Any, tmp_path: Path) -> None:
    engine, registry, store = setup
    publisher = _publisher(engine, registry, store, tmp_path)
    publisher.push(f"{REPO}:v1", [f"{REPO}:v1"], None)
    converted = publisher.push(f"{REPO}:v2", [f"{REPO}:v2"], None)
    (image,) = images()
    outcome = Outcome(Step(image, BUILD, "new"), PUSHED, "pushed", estargz=converted.to_json())
    line = format_summary([outcome]).splitlines()[-1]
    assert line == f"{image.tags[0]} zstd:chunked layers: 1 written, 2 reused from an earlier publish"
