"""saved.py: an OCI layout as `docker save` streams it, read once: layers spooled uncompressed
(zstd, gzip or as they are), each checked against the config's diff_id; the platform's image
and its attestation picked from nested indexes. Fast: the layout is made here, no daemon."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from imagebuilder.estargz.saved import SMALL, LayerNotAsVerified, SaveUnreadable, save_layers

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layout(layers: list[tuple[bytes, bytes]], diff_ids: list[str] | None = None,
            architecture: str = "amd64") -> tuple[bytes, list[bytes]]:
    """The save's tar: (compressed blob, uncompressed tar) per layer, BuildKit's nesting (index.json
    -> an index -> the image manifest and its attestation)."""
    blobs: dict[str, bytes] = {}

    def put(data: bytes) -> dict[str, Any]:
        blobs[_digest(data)] = data
        return {"digest": _digest(data), "size": len(data)}

    config = json.dumps({"architecture": architecture, "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": diff_ids or [_digest(tar) for _, tar in layers]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST, "config": put(config),
                           "layers": [put(blob) for blob, _ in layers]}).encode()
    image = {"mediaType": MANIFEST, **put(manifest), "platform": {"architecture": architecture, "os": "linux"}}
    statement = json.dumps({"mediaType": MANIFEST, "config": put(b"{}"), "layers": [put(b"{\"_type\": 1}")]}).encode()
    attestation = {"mediaType": MANIFEST, **put(statement),
                   "annotations": {"vnd.docker.reference.digest": image["digest"],
                                   "vnd.docker.reference.type": "attestation-manifest"}}
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": [image, attestation]}).encode()
    top = {"mediaType": INDEX, **put(index)}
    files = {f"blobs/sha256/{d.split(':')[1]}": data for d, data in sorted(blobs.items())}
    files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [top]}).encode()
    files["oci-layout"] = b'{"imageLayoutVersion": "1.0.0"}'
    return _tar(files), [tar for _, tar in layers]


def _zstd(data: bytes) -> bytes:
    return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True).stdout


def _chunks(data: bytes, size: int = 100_000) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def test_every_layer_is_spooled_uncompressed_and_checked_and_the_attestation_found(tmp_path: Path) -> None:
    big = _tar({"opt/venv/lib/big.so": os.urandom(SMALL + 4096)})  # over SMALL compressed: spooled as it streams
    small = _tar({"etc/hostname": b"node\n"})
    plain = _tar({"data/f": b"x" * 5000})
    save, tars = _layout([(_zstd(big), big), (gzip.compress(small), small), (plain, plain)])
    seen: list[int] = []
    image = save_layers("x:1", _chunks(save), tmp_path, "linux/amd64", on_progress=seen.append)
    assert [layer.path.read_bytes() for layer in image.layers] == tars
    assert [layer.diff_id for layer in image.layers] == [_digest(tar) for tar in tars]
    assert image.platform == {"architecture": "amd64", "os": "linux"}
    assert image.attestation is not None and image.manifest_digest.startswith("sha256:")
    assert image.config_json["rootfs"]["diff_ids"] == [layer.diff_id for layer in image.layers]
    assert seen and seen == sorted(seen)  # said as the big blob streamed


def test_a_layer_that_is_not_its_diff_id_is_refused(tmp_path: Path) -> None:
    layer = _tar({"a": b"a"})
    save, _ = _layout([(layer, layer)], diff_ids=["sha256:" + "0" * 64])
    with pytest.raises(LayerNotAsVerified, match="layer 0 of x:1 unpacks to sha256:"):
        save_layers("x:1", _chunks(save), tmp_path, "linux/amd64")


def test_a_save_without_the_platform_s_image_is_refused(tmp_path: Path) -> None:
    layer = _tar({"a": b"a"})
    save, _ = _layout([(layer, layer)], architecture="arm64")
    with pytest.raises(SaveUnreadable, match="no linux/amd64 image manifest"):
        save_layers("x:1", _chunks(save), tmp_path, "linux/amd64")
