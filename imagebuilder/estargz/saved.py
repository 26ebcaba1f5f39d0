"""A local image's layers as uncompressed tar files: the input the eStargz writer reorders.

The engine's `docker save` (GET /images/NAME/get) of an image in the containerd store is an OCI
layout whose blobs are the ones BuildKit exported (zstd for publish). The stream is read once:
every blob over SMALL is decompressed into a spool file as it passes (zstd by the `zstd` tool,
~1.2 GB/s; gzip by zlib; an uncompressed tar copied), the small ones (manifests, config,
attestations) are kept in memory; then index.json says which blobs are the platform image's
manifest, config and layers, and which attestation manifest goes with it.

Each spooled layer is checked against its diff_id from the image config while it is written:
the eStargz writer reorders exactly the files the verified image holds, or nothing is pushed.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..errors import ImageBuilderError
from ..registry.manifests import INDEXES, REFERENCE_DIGEST

SMALL = 4 << 20
CHUNK = 1 << 20
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"


class SaveUnreadable(ImageBuilderError):
    template = "the engine's save of {ref} cannot be used: {detail}; rerun the publish (the image may have changed)"


class LayerNotAsVerified(ImageBuilderError):
    template = ("layer {index} of {ref} unpacks to {found}, but the image config names {diff_id}: the engine's "
                "store changed under the publish; nothing was pushed: rerun")


@dataclass(frozen=True)
class SavedLayer:
    descriptor: Mapping[str, Any]
    """The layer as the local manifest lists it (compressed digest, size, media type)."""
    diff_id: str
    path: Path
    """The uncompressed tar."""
    size: int


@dataclass(frozen=True)
class SavedImage:
    manifest: Mapping[str, Any]
    config: bytes
    layers: tuple[SavedLayer, ...]
    platform: Mapping[str, Any] | None
    """The local index's platform entry of the image, as it said it."""
    manifest_digest: str = ""
    """The local (as exported) manifest's digest: what BuildKit's provenance names."""
    attestation: Mapping[str, Any] | None = None
    """BuildKit's provenance attestation manifest of the image (its index entry), if the save held one."""
    blobs: Mapping[str, bytes] = field(default_factory=dict)
    """Every small blob of the save, by digest (the attestation's manifest and layers among them)."""

    @property
    def config_json(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.config)
        return loaded


class _Chunks(io.RawIOBase):
    """The save's chunk iterator as a readable stream (tarfile's stream mode reads it)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._pending = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def save_layers(ref: str, chunks: Iterable[bytes], folder: Path, platform: str,
                on_progress: Callable[[int], None] | None = None) -> SavedImage:
    """Read the save of `ref` (`chunks` of its tar stream) into `folder`: the image of `platform`
    (OS/ARCH) with its layers uncompressed there; SaveUnreadable when the save lacks it."""
    small: dict[str, bytes] = {}
    spooled: dict[str, tuple[Path, int, str]] = {}  # blob digest -> (tar file, size, sha256 of it)
    done = 0
    with tarfile.open(fileobj=io.BufferedReader(_Chunks(iter(chunks)), CHUNK), mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            source = tar.extractfile(member)
            assert source is not None
            name = member.name.lstrip("./")
            if name in ("index.json", "manifest.json", "oci-layout"):
                small[name] = source.read()
                continue
            digest = "sha256:" + name.rsplit("/", 1)[-1]
            if member.size <= SMALL:
                small[digest] = source.read()
                continue
            path = folder / f"layer-{len(spooled)}.tar"
            spooled[digest] = _spool(_Counted(source, done, on_progress), path)
            done += member.size
    return _image(ref, small, spooled, platform, folder)


class _Counted:
    """A blob's stream that tells `on_progress` the save's bytes read so far, as it is read."""

    def __init__(self, source: IO[bytes], before: int, on_progress: Callable[[int], None] | None) -> None:
        self.source, self.done, self.on_progress = source, before, on_progress

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.done += len(data)
        if self.on_progress is not None:
            self.on_progress(self.done)
        return data


def _spool(source: IO[bytes] | _Counted, path: Path) -> tuple[Path, int, str]:
    """The blob `source` uncompressed into `path`: (path, bytes, sha256 of them)."""
    head = source.read(CHUNK)
    if head.startswith(ZSTD_MAGIC):
        return _unzstd(head, source, path)
    hasher, size = hashlib.sha256(), 0
    inflate = zlib.decompressobj(31) if head.startswith(GZIP_MAGIC) else None
    with open(path, "wb") as out:
        while head:
            data = inflate.decompress(head) if inflate is not None else head
            hasher.update(data)
            out.write(data)
            size += len(data)
            head = source.read(CHUNK)
    return path, size, "sha256:" + hasher.hexdigest()


def _unzstd(head: bytes, source: IO[bytes] | _Counted, path: Path) -> tuple[Path, int, str]:
    """A zstd blob through the `zstd` tool (a thread feeds it), hashed as it is written."""
    tool = subprocess.Popen(["zstd", "-d", "-c", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert tool.stdin is not None and tool.stdout is not None
    stdin = tool.stdin

    def feed(block: bytes) -> None:
        try:
            while block:
                stdin.write(block)
                block = source.read(CHUNK)
        except BrokenPipeError:
            pass
        finally:
            stdin.close()

    feeder = threading.Thread(target=feed, args=(head,), name="zstd-feed", daemon=True)
    feeder.start()
    hasher, size = hashlib.sha256(), 0
    with open(path, "wb") as out:
        while data := tool.stdout.read(CHUNK):
            hasher.update(data)
            out.write(data)
            size += len(data)
    feeder.join()
    if tool.wait() != 0:
        raise SaveUnreadable(ref=path.name, detail=f"zstd -d exited with {tool.returncode}")
    return path, size, "sha256:" + hasher.hexdigest()


def _image(ref: str, small: Mapping[str, bytes], spooled: dict[str, tuple[Path, int, str]],
           platform: str, folder: Path) -> SavedImage:
    try:
        entry, attestation = _platform_entry(small, platform)
        manifest = json.loads(small[entry["digest"]])
        config = small[manifest["config"]["digest"]]
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    except (KeyError, ValueError, TypeError) as e:
        raise SaveUnreadable(ref=ref, detail=f"no {platform} image manifest, config or layer list in it ({e!r})") from e
    layers = []
    for index, (descriptor, diff_id) in enumerate(zip(manifest["layers"], diff_ids, strict=True)):
        if descriptor["digest"] in small and descriptor["digest"] not in spooled:  # a small layer
            spooled[descriptor["digest"]] = _spool(io.BytesIO(small[descriptor["digest"]]),
                                                   folder / f"layer-small-{index}.tar")
        if descriptor["digest"] not in spooled:
            raise SaveUnreadable(ref=ref, detail=f"layer {descriptor['digest']} is not in it")
        path, size, found = spooled[descriptor["digest"]]
        if found != diff_id:
            raise LayerNotAsVerified(index=index, ref=ref, found=found, diff_id=diff_id)
        layers.append(SavedLayer(descriptor, diff_id, path, size))
    return SavedImage(manifest, config, tuple(layers), entry.get("platform"), str(entry["digest"]), attestation,
                      dict(small))


def _platform_entry(small: Mapping[str, bytes], platform: str) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """The index entry of the `platform` image (through nested indexes) and its attestation's."""
    os_name, _, architecture = platform.partition("/")
    pending = list(json.loads(small["index.json"]).get("manifests") or [])
    images, attestations = [], {}
    while pending:
        entry = pending.pop(0)
        if entry.get("mediaType") in INDEXES:
            pending += json.loads(small[entry["digest"]]).get("manifests") or []
        elif REFERENCE_DIGEST in (entry.get("annotations") or {}):
            attestations[entry["annotations"][REFERENCE_DIGEST]] = entry
        else:
            images.append(entry)
    for entry in images:
        found = entry.get("platform") or {}
        if not found or (found.get("os"), found.get("architecture")) == (os_name, architecture):
            return entry, attestations.get(entry["digest"])
    raise KeyError(f"no {platform} entry among {len(images)} image manifests")
