"""What the ordered push's reuse tests (tests/test_layer_reuse.py) run over without a daemon: a
local image as the engine's save streams it (an OCI layout of gzip layers), an engine that serves
such saves and counts them, and a registry that keeps its blobs and manifests in memory."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Iterator, Mapping
from typing import IO, Any

from imagebuilder.registry.reference import parse_reference

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def add_files(tar: tarfile.TarFile, files: Mapping[str, bytes], *, mode: int = 0o644) -> None:
    """`files` (name -> content) into `tar`, each file's folder (0755) before them, at one mtime."""
    for name in sorted({name.rsplit("/", 1)[0] for name in files if "/" in name}):
        info = tarfile.TarInfo(name + "/")
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
        tar.addfile(info)
    for name, data in files.items():
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
        tar.addfile(info, io.BytesIO(data))


def layer_tar(files: Mapping[str, bytes]) -> bytes:
    """A layer tar of `files` (name -> content), its folders before them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_files(tar, files)
    return out.getvalue()


def oci_save(layers: list[bytes], env: str = "A=1") -> tuple[bytes, dict[str, Any]]:
    """The save's tar of an image of these layer tars (each gzipped), and its `docker image
    inspect` (Id: the top index's digest, as the containerd store says it)."""
    blobs: dict[str, bytes] = {}

    def put(data: bytes) -> dict[str, Any]:
        blobs[digest_of(data)] = data
        return {"digest": digest_of(data), "size": len(data)}

    diff_ids = [digest_of(layer) for layer in layers]
    config = {"architecture": "amd64", "os": "linux", "config": {"Env": [env]},
              "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST, "config": put(json.dumps(config).encode()),
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                       **put(gzip.compress(layer, mtime=0))} for layer in layers]}).encode()
    image = {"mediaType": MANIFEST, **put(manifest), "platform": {"architecture": "amd64", "os": "linux"}}
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": [image]}).encode()
    top = {"mediaType": INDEX, **put(index)}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        files = {f"blobs/sha256/{d.split(':')[1]}": data for d, data in sorted(blobs.items())}
        files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [top]}).encode()
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    inspect = {"Id": top["digest"], "Config": {"Env": [env], "Labels": {"built": "now"}},
               "RootFS": {"Type": "layers", "Layers": diff_ids}}
    return out.getvalue(), inspect


class SavingEngine:
    """The local images (ref -> their layer tars), each save it streamed counted in `saves`."""

    def __init__(self) -> None:
        self.images: dict[str, tuple[bytes, dict[str, Any]]] = {}
        self.saves: list[str] = []

    def add(self, ref: str, layers: list[bytes], env: str = "A=1") -> None:
        self.images[ref] = oci_save(layers, env)

    def save_image(self, ref: str) -> Iterator[bytes]:
        self.saves.append(ref)
        data = self.images[ref][0]
        return iter([data[i:i + 65536] for i in range(0, len(data), 65536)])

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return self.images[ref][1]


class MemoryRegistry:
    """Blobs by repository (host/name), manifests by (repository, tag or digest); each blob
    upload and mount recorded."""

    def __init__(self) -> None:
        self.blobs: dict[str, dict[str, bytes]] = {}
        self.manifests: dict[tuple[str, str], bytes] = {}
        self.uploads: list[tuple[str, str]] = []
        self.mounts: list[tuple[str, str, str]] = []

    def has_blob(self, ref: str, digest: str) -> bool:
        return digest in self.blobs.get(parse_reference(ref).name, {})

    def upload_blob(self, ref: str, digest: str, source: IO[bytes], size: int) -> None:
        data = source.read()
        assert len(data) == size and digest_of(data) == digest
        if not self.has_blob(ref, digest):
            self.uploads.append((parse_reference(ref).name, digest))
            self.blobs.setdefault(parse_reference(ref).name, {})[digest] = data

    def mount(self, ref: str, digest: str, source: str) -> bool:
        found = self.blobs.get(parse_reference(source).name, {}).get(digest)
        if found is None:
            return False
        self.mounts.append((parse_reference(ref).name, digest, parse_reference(source).name))
        self.blobs.setdefault(parse_reference(ref).name, {})[digest] = found
        return True

    def put_manifest(self, ref: str, body: bytes, media_type: str) -> Mapping[str, str]:
        r = parse_reference(ref)
        self.manifests[(r.name, r.reference)] = body
        return {}

    def digest(self, ref: str) -> str | None:
        r = parse_reference(ref)
        body = self.manifests.get((r.name, r.reference))
        return digest_of(body) if body is not None else None

    def manifest(self, ref: str) -> dict[str, Any]:
        r = parse_reference(ref)
        loaded: dict[str, Any] = json.loads(self.manifests[(r.name, r.reference)])
        return loaded
