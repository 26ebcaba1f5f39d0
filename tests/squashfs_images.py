"""Synthetic images for the squashfs tests: layer tars written entry by entry (whiteouts,
opaque folders, hard and symbolic links, modes), pushed with their config into a real local
registry as an OCI image."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from support.registry import put_blob, put_manifest

MTIME = 1_700_000_000


@dataclass(frozen=True)
class E:
    """One tar entry: kind is dir, file, sym, hard or fifo; data a file's bytes or a link's target."""

    name: str
    kind: str = "file"
    data: bytes | str = b""
    mode: int = 0o644


def layer_tar(entries: Sequence[E]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.mtime, info.mode, info.uid, info.gid = MTIME, entry.mode, 1000, 1000
            body = None
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
            elif entry.kind == "file":
                data = entry.data if isinstance(entry.data, bytes) else entry.data.encode()
                info.size, body = len(data), io.BytesIO(data)
            elif entry.kind in ("sym", "hard"):
                info.type = tarfile.SYMTYPE if entry.kind == "sym" else tarfile.LNKTYPE
                info.linkname = str(entry.data)
            elif entry.kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, body)
    return buffer.getvalue()


def compress(tar: bytes, how: str) -> tuple[bytes, str]:
    """The layer blob and its media type: gzip, zstd, estargz, zstd:chunked (imagebuilder's
    writer, as publish --compression writes them) or none."""
    base = "application/vnd.oci.image.layer.v1.tar"
    if how in ("estargz", "zstd:chunked"):
        from imagebuilder.estargz.writer import write_estargz

        out = io.BytesIO()
        write_estargz(io.BytesIO(tar), out, codec=how, workers=1)
        return out.getvalue(), base + ("+gzip" if how == "estargz" else "+zstd")
    if how == "gzip":
        return gzip.compress(tar), base + "+gzip"
    if how == "zstd":
        return subprocess.run(["zstd", "-q", "-c"], input=tar, capture_output=True, check=True).stdout, base + "+zstd"
    return tar, base


def push_image(host: str, repository: str, tag: str, layers: Sequence[tuple[Sequence[E], str]],
               config: Mapping[str, Any]) -> str:
    """An OCI image of `layers` (entries, compression) and `config` under REPOSITORY:TAG of
    the registry at HOST; its manifest's digest."""
    descriptors = []
    for entries, how in layers:
        blob, media_type = compress(layer_tar(entries), how)
        descriptors.append({**put_blob(host, repository, blob), "mediaType": media_type})
    document = {"architecture": "amd64", "os": "linux", "config": dict(config),
                "rootfs": {"type": "layers", "diff_ids": []}}
    config_blob = {**put_blob(host, repository, json.dumps(document).encode()),
                   "mediaType": "application/vnd.oci.image.config.v1+json"}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": config_blob, "layers": descriptors}).encode()
    return put_manifest(host, repository, tag, manifest, "application/vnd.oci.image.manifest.v1+json")


def push_index(host: str, repository: str, tag: str, image_digest: str, size: int) -> str:
    """An OCI index over one linux/amd64 image under REPOSITORY:TAG."""
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                       "digest": image_digest, "size": size,
                                       "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
    return put_manifest(host, repository, tag, index, "application/vnd.oci.image.index.v1+json")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
