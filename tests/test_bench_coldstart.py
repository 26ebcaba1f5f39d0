"""bench/bench_coldstart.py's pure parts (no Docker): the one-layer variant spliced from an image's
manifest and config (bench/manifests.py), the bytes one image adds to another, the link's rates;
the Slurm path's layer and whiteout rules and its arithmetic (bench/coldstart_slurm.py).

The images here are what BuildKit would write for the real rendered Dockerfiles of the 2.6 and
2.5 cu124 runtime images: one history entry per instruction of the final stage, RUNs recorded
with their build args and without their mounts, as `docker history` shows them."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.bench_coldstart import link_bytes_per_s, parse_rates
from bench.coldstart_slurm import SlurmStart, layer_tar_filter, overlay_options, pairs, ratio, whiteout_target
from bench.manifests import Image, added_bytes, layer_labels, splice_venv_layer, wheel_group_layers
from imagebuilder.build.layers import GROUPS
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.lock.lockfile import load_locks
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve
from imagebuilder.resources import default_matrix_path

ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"


def _history(dockerfile: str) -> list[dict[str, Any]]:
    """The history BuildKit writes for the final stage of `dockerfile` on an imported base."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")))
    final = text.rsplit("\nFROM ", 1)[1].splitlines()[1:]
    history: list[dict[str, Any]] = [{"created_by": "", "comment": "Imported from -"}]
    for line in filter(None, (line.strip() for line in final)):
        keyword, _, rest = line.partition(" ")
        if keyword == "RUN":
            command = re.sub(r"^(--mount=\S+\s+)*", "", rest)
            history.append({"created_by": f"RUN |1 DEBIAN_FRONTEND=noninteractive /bin/bash -o pipefail -c {command}"})
        elif keyword in ("COPY", "ADD"):
            history.append({"created_by": f"{line} # buildkit"})
        else:
            history.append({"created_by": f"{line} # buildkit", "empty_layer": True})
    return history


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _image(torch: str) -> Image:
    """The cu124 runtime image of `torch` (Debian 12, Python 3.11) as the registry would hold it."""
    matrix = load_matrix(default_matrix_path())
    spec = resolve(matrix, Request(torch, "12.4", variant="runtime", os="debian12", python="3.11"))
    rendered = render(spec, matrix, RenderOptions(buildkit=True, locks=load_locks(default_matrix_path().parent / "locks")))
    history = _history(rendered.dockerfile)
    made = [entry for entry in history if not entry.get("empty_layer")]
    layers = [{"mediaType": ZSTD, "digest": _digest(f"{torch}-{n}"), "size": 1000 + n} for n in range(len(made))]
    config = {"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/opt/venv/bin:/usr/bin"]},
              "history": history, "rootfs": {"type": "layers", "diff_ids": [_digest(f"diff-{torch}-{n}")
                                                                          for n in range(len(made))]}}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(torch),
                           "size": 500},
                "layers": layers, "annotations": {"org.opencontainers.image.created": "2026-12-03T00:00:00Z"}}
    return Image(f"127.0.0.1:5000/ns/pytorch:{torch}", manifest, config)


def _venv(layers: int = 1, media_type: str = ZSTD) -> Image:
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest("vc"), "size": 9},
                "layers": [{"mediaType": media_type, "digest": _digest(f"venv-{n}"), "size": 5000} for n in range(layers)]}
    config = {"rootfs": {"type": "layers", "diff_ids": [_digest(f"venv-diff-{n}") for n in range(layers)]},
              "history": [{"created_by": "COPY /opt/venv /opt/venv # buildkit"}] * layers}
    return Image("127.0.0.1:5000/ns/pytorch-onelayer:venv", manifest, config)


@pytest.mark.parametrize("torch, groups", [
    ("2.6", [name for name, _ in GROUPS]),
    ("2.5", [name for name, _ in GROUPS if name != "cusparselt"]),  # its lock has no cuSPARSELt
])
def test_the_wheel_group_layers_are_found_by_the_lock_each_run_installs(torch: str, groups: list[str]) -> None:
    image = _image(torch)
    found = wheel_group_layers(image.config)
    assert found == list(range(2, 2 + len(groups)))  # above the base and the apt layer, one run
    assert [layer_labels(image.config)[index] for index in found] == groups
    labels = layer_labels(image.config)
    # The apt layer's RUN starts by adding the OS's security suite to apt's sources (issue 56).
    assert labels[0] == "Imported from -" and labels[1].startswith('RUN echo "deb http://deb.debian.org/')
    assert len(labels) == len(image.manifest["layers"])


def test_the_one_layer_variant_has_the_venv_in_the_groups_place_and_the_rest_unchanged() -> None:
    image, venv = _image("2.6"), _venv()
    manifest_bytes, config_bytes = splice_venv_layer(image, venv)
    manifest, config = json.loads(manifest_bytes), json.loads(config_bytes)
    layers = image.manifest["layers"]
    assert manifest["layers"] == [layers[0], layers[1], venv.manifest["layers"][0], *layers[10:]]
    diff_ids = image.config["rootfs"]["diff_ids"]
    assert config["rootfs"]["diff_ids"] == [diff_ids[0], diff_ids[1], venv.config["rootfs"]["diff_ids"][0],
                                            *diff_ids[10:]]
    assert manifest["config"] == {**image.manifest["config"], "digest": "sha256:" + hashlib.sha256(config_bytes).hexdigest(),
                                  "size": len(config_bytes)}
    assert manifest["annotations"] == image.manifest["annotations"] and config["config"] == image.config["config"]
    labels = layer_labels(config)
    assert len(labels) == len(manifest["layers"]) and wheel_group_layers(config) == []
    assert labels[2] == "venv, one layer"
    made = [entry for entry in config["history"] if not entry.get("empty_layer")]
    assert made[2]["created_by"].startswith("COPY --chown=1000:1000 /opt/venv /opt/venv # ")
    assert labels[3:] == layer_labels(image.config)[10:]
    # The instructions that made no layer are all kept, in order.
    assert [e for e in config["history"] if e.get("empty_layer")] == [e for e in image.config["history"]
                                                                      if e.get("empty_layer")]


def _between(image: Image) -> Image:
    """A layer that is no group's between two groups' layers."""
    history = list(image.config["history"])
    at = next(n for n, entry in enumerate(history) if "cublas.lock" in entry["created_by"])
    history.insert(at, {"created_by": "RUN true"})
    layers = list(image.manifest["layers"])
    layers.insert(3, {"mediaType": ZSTD, "digest": _digest("x"), "size": 1})
    diff_ids = list(image.config["rootfs"]["diff_ids"])
    diff_ids.insert(3, _digest("x-diff"))
    return Image(image.ref, {**image.manifest, "layers": layers},
                 {**image.config, "history": history, "rootfs": {"type": "layers", "diff_ids": diff_ids}})


def _fewer_history(image: Image) -> Image:
    return Image(image.ref, image.manifest, {**image.config, "history": image.config["history"][1:]})


@pytest.mark.parametrize("image, venv, message", [
    (_between, _venv, "not one run of layers"),
    (_fewer_history, _venv, "they must be as many"),
    (lambda image: image, lambda: _venv(layers=2), "it must have one"),
    (lambda image: image, lambda: _venv(media_type="application/vnd.oci.image.layer.v1.tar+gzip"), "tar+gzip"),
])
def test_a_splice_that_would_not_be_the_same_image_is_refused(image: Callable[[Image], Image],
                                                               venv: Callable[[], Image], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        splice_venv_layer(image(_image("2.6")), venv())


def test_the_bytes_an_image_adds_are_those_of_the_blobs_the_other_lacks() -> None:
    def image(blobs: dict[str, int]) -> Image:
        config, *layers = ({"digest": digest, "size": size} for digest, size in blobs.items())
        return Image("r", {"config": config, "layers": layers}, {})

    first, second = image({"c1": 10, "a": 100, "b": 200}), image({"c2": 11, "a": 100, "d": 300})
    assert (first.bytes, second.bytes) == (310, 411)
    assert added_bytes(second, first) == 311 and added_bytes(first, first) == 0


@pytest.mark.parametrize("text, rates", [
    ("1gbit,200mbit", ("1gbit", "200mbit")),
    (" 500mbit , none ", ("500mbit", "none")),
    ("1.5gbit", ("1.5gbit",)),
])
def test_rates_are_tc_rates_or_none(text: str, rates: tuple[str, ...]) -> None:
    assert parse_rates(text) == rates


@pytest.mark.parametrize("text", ["", ",", "fast", "1gbps", "200MB", "100mbit,1GB"])
def test_a_rate_tc_would_read_otherwise_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="1gbit,200mbit"):
        parse_rates(text)


@pytest.mark.parametrize("rate, per_s", [("1gbit", 125e6), ("200mbit", 25e6), ("800kbit", 1e5), ("none", None)])
def test_the_link_passes_the_rate_in_bytes(rate: str, per_s: float | None) -> None:
    assert link_bytes_per_s(rate) == per_s


# --- the Slurm path (bench/coldstart_slurm.py) ----------------------------------------------


@pytest.mark.parametrize(("media_type", "flag"), [
    (ZSTD, "--zstd"),
    ("application/vnd.oci.image.layer.v1.tar+gzip", "--gzip"),
    ("application/vnd.docker.image.rootfs.diff.tar.gzip", "--gzip"),
    ("application/vnd.oci.image.layer.v1.tar", ""),
])
def test_each_layer_is_unpacked_with_its_media_type_s_decompressor(media_type: str, flag: str) -> None:
    assert layer_tar_filter(media_type) == flag


def test_a_layer_tar_cannot_read_is_refused() -> None:
    with pytest.raises(ValueError, match="not a tar layer"):
        layer_tar_filter("application/vnd.oci.image.layer.v1.tar+lz4")


@pytest.mark.parametrize(("name", "target"), [
    (".wh.gone", "gone"), (".wh..wh..opq", None), ("keep", None), ("a.wh.b", None), (".wh..hidden", ".hidden")])
def test_an_aufs_whiteout_names_the_file_it_hides(name: str, target: str | None) -> None:
    assert whiteout_target(name) == target


def test_overlayfs_gets_the_top_layer_first(tmp_path: Path) -> None:
    layers = [tmp_path / "1", tmp_path / "2", tmp_path / "0"]  # bottom to top, enroot's "0" on top
    assert overlay_options(layers) == f"lowerdir={tmp_path}/0:{tmp_path}/2:{tmp_path}/1"


def test_a_path_s_total_is_its_steps_and_the_ratio_is_published_over_enroot() -> None:
    enroot = SlurmStart("enroot", "1gbit", [("fetch", 30.0), ("unpack", 50.0), ("mksquashfs", 120.0)])
    published = SlurmStart("published", "1gbit", [("fetch", 40.0), ("squashfuse", 0.5), ("import torch", 9.5)])
    assert (enroot.total, published.total) == (200.0, 50.0)
    assert ratio(published, enroot) == "0.25x"
    assert ratio(published, None) == ratio(None, enroot) == ratio(published, SlurmStart("enroot", "1gbit")) == "-"


def test_each_pass_at_a_rate_pairs_enroot_with_the_published_start_after_it() -> None:
    runs = [SlurmStart(path, rate, [("s", seconds)]) for path, rate, seconds in (
        ("enroot", "1gbit", 100.0), ("published", "1gbit", 30.0), ("enroot", "200mbit", 200.0),
        ("published", "200mbit", 120.0), ("enroot", "1gbit", 110.0), ("published", "1gbit", 33.0),
        ("published", "200mbit", 1.0))]
    assert [(rate, a.total if a else None, b.total if b else None) for (rate, a), b in pairs(runs)] == [
        ("1gbit", 100.0, 30.0), ("200mbit", 200.0, 120.0), ("1gbit", 110.0, 33.0), ("200mbit", None, 1.0)]
    assert pairs(runs[:1]) == [(("1gbit", runs[0]), None)]
    with_lazy = [*runs[:2], SlurmStart("lazy", "1gbit", [("s", 12.0)]), *runs[2:4],
                 SlurmStart("lazy", "200mbit", [("s", 40.0)])]
    assert [(rate, a.total if a else None, b.total if b else None) for (rate, a), b in pairs(with_lazy, "lazy")] == [
        ("1gbit", 100.0, 12.0), ("200mbit", 200.0, 40.0)]
    assert [b.total if b else None for _, b in pairs(with_lazy)] == [30.0, 120.0]  # published, as before
