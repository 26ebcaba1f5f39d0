"""Ordered layers kept from one publish to the next: a republish writes only what changed.

`publish --compression zstd:chunked|estargz` reads the image out of the engine, records its start
and writes every layer again (estargz.py). A nightly changes one or two layers of a dozen; the
others would come out byte for byte as last time, because a written layer depends only on:
  - the uncompressed layer (its diff_id),
  - the format and level,
  - the profile's paths that this layer holds, in the profile's order (estargz/order.py: they,
    their parents and link targets go first, then the landmark; nothing else moves): the key
    takes them as a set (layer_key says why),
  - zstd:chunked's copied chunks of the layer's files (the profile's pages, writer.py), and
  - the writer itself: writer_fingerprint() is the digest of what it writes of a fixed small
    layer in that format, so a change to the writer's bytes (or to the zstd library) is a new key, with no
    version number to forget.
So each written layer is recorded under that key (its blob digest, size, TOC digest and the
annotations its manifest entry needs, and the repositories it went to), beside the names of the
layer's entries by diff_id (what the profile's paths are looked up in, without reading the layer).
A later publish whose key matches, and whose target repository has the blob (a HEAD, or a
cross-repository mount from one it went to), puts the recorded entry in its manifest: the layer is
neither written nor uploaded. A record whose blob the registry lacks is written again.

The start profile is kept too, by what it depends on: the image's layers (diff_ids), its run
configuration (user, env, working directory; labels left out) and the start command. And the
small parts of the engine's save (manifest, config, attestation), by the local image's id: when
the profile and every layer are known, that image is not read out of the engine at all.

The files live in cache_folder()/ordered-layers (scan/graph_cache.py); a folder that cannot be
written costs only the time.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from ..atomic import write_atomic
from ..estargz.order import prioritize
from ..estargz.toc import clean_name
from ..estargz.profile import StartProfile
from ..estargz.saved import SavedImage
from ..estargz.writer import Written, write_estargz
from ..registry.reference import parse_reference
from ..scan.graph_cache import cache_folder

FORMAT = 1  # of the files kept here: another FORMAT is another folder, never misread
REPOSITORIES_KEPT = 8


class BlobRegistry(Protocol):
    def has_blob(self, ref: str, digest: str) -> bool: ...

    def mount(self, ref: str, digest: str, source: str) -> bool: ...


@cache
def writer_fingerprint(codec: str) -> str:
    """The digest of what the writer writes of a fixed layer, ordered by a fixed profile, in
    `codec`: the writer's version, as its bytes say it (a few ms, once per process)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("etc/a", b"a" * 5000), ("usr/lib/b.so", bytes(range(256)) * 40), ("usr/c", b"")):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_000.5, 0o644
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    written = write_estargz(buffer, io.BytesIO(), ("/usr/lib/b.so",), level=3, codec=codec, chunk_size=4096,
                            workers=1)
    described = f"{written.digest} {sorted(written.annotations().items())} {sorted(written.storage_annotations.items())}"
    return hashlib.sha256(described.encode()).hexdigest()


def layer_key(diff_id: str, codec: str, level: int, found: Sequence[str],
              chunks: Mapping[str, Collection[int]] | None = None) -> str:
    """What a written layer's bytes depend on, as one digest (the module's docstring), but the
    order of the profile's paths within its prefetched span: a start whose processes run beside
    each other (a shell pipeline, a compiler spawned) opens them in another order on each run
    (bench/bench_republish.py: the base layer's 25 files, rewritten on every republish while
    keyed by order), and the snapshotter fetches the span in one range read whatever its order.
    A reused layer holds the same files before its landmark, in the order of the run that wrote it."""
    document: dict[str, Any] = {"format": FORMAT, "writer": writer_fingerprint(codec), "diff_id": diff_id,
                                "codec": codec, "level": level, "prefetch": sorted(found)}
    if chunks:
        document["chunks"] = {path: sorted(indices) for path, indices in sorted(chunks.items())}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def profile_key(inspect: Mapping[str, Any], start: Sequence[str], platform: str) -> str:
    """What a start profile depends on: the image's layers, how it runs, the start."""
    config = {k: v for k, v in (inspect.get("Config") or {}).items() if k != "Labels"}
    document = {"format": FORMAT, "diff_ids": list((inspect.get("RootFS") or {}).get("Layers") or []),
                "config": config, "start": list(start), "platform": platform}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def present(registry: BlobRegistry, ref: str, digest: str, repositories: Sequence[str]) -> bool:
    """Whether `ref`'s repository has blob `digest`, or now does: mounted from one of
    `repositories` (host/repository) of the same registry, where it went before."""
    if registry.has_blob(ref, digest):
        return True
    target = parse_reference(ref)
    sources = [f"{repository}@{digest}" for repository in repositories if repository != target.name]
    return any(parse_reference(source).api_host == target.api_host and registry.mount(ref, digest, source)
               for source in sources)


def kept_layers(store: LayerStore, registry: BlobRegistry, ref: str, diff_ids: Sequence[str], files: Sequence[str],
                codec: str, level: int, copied: Mapping[str, Collection[int]] | None = None) -> dict[int, Written]:
    """The layers (by index) kept for this order (the profile's `files`, and the `copied` chunks)
    whose blob `ref`'s repository has, or now does."""
    hits = {}
    for index, diff_id in enumerate(diff_ids):
        found, held = store.found(diff_id, files), store.held(diff_id, copied or {})
        kept = (store.record(layer_key(diff_id, codec, level, found, held))
                if found is not None and held is not None else None)
        if kept is not None and present(registry, ref, kept[0].digest, kept[1]):
            hits[index] = kept[0]
    return hits


def _written_of(record: Mapping[str, Any]) -> Written:
    fields = dict(record["written"])
    fields["prioritized"] = tuple(fields["prioritized"])
    return Written(**fields)


def _profile_of(document: Mapping[str, Any]) -> StartProfile:
    return StartProfile(tuple(document["files"]), tuple(document["command"]), str(document["user"]),
                        float(document["seconds"]),
                        {path: (int(read[0]), int(read[1])) for path, read in document["reads"].items()},
                        document["before_mark"],
                        {path: tuple((int(a), int(b)) for a, b in ranges)
                         for path, ranges in document.get("pages", {}).items()})


class LayerStore:
    """The records under `folder` (cache_folder()/ordered-layers/FORMAT by default)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else cache_folder() / "ordered-layers" / str(FORMAT)

    # -- layers

    def names(self, diff_id: str) -> tuple[str, ...] | None:
        """The layer's entry names as its tar spells them; None: never seen here."""
        try:
            return tuple(json.loads(gzip.decompress(self._path("names", diff_id, ".json.gz").read_bytes())))
        except (OSError, ValueError):
            return None

    def keep_names(self, diff_id: str, tar_path: Path) -> None:
        """The entry names of the layer tar at `tar_path` (its headers read), unless kept."""
        if self._path("names", diff_id, ".json.gz").exists():
            return
        with tarfile.open(tar_path, mode="r:") as tar:
            names = tar.getnames()
        self._write(self._path("names", diff_id, ".json.gz"), gzip.compress(json.dumps(names).encode(), 6))

    def found(self, diff_id: str, prefetched: Sequence[str]) -> tuple[str, ...] | None:
        """The profile's paths the layer holds, in the order written (order.prioritize's `found`);
        None where the layer's names are not known here."""
        if not prefetched:
            return ()
        names = self.names(diff_id)
        if names is None:
            return None
        return prioritize([tarfile.TarInfo(name) for name in names], prefetched).found

    def held(self, diff_id: str, copied: Mapping[str, Collection[int]]) -> dict[str, Collection[int]] | None:
        """The part of `copied` (image path -> chunks) whose files this layer holds; None where
        the layer's names are not known here."""
        if not copied:
            return {}
        names = self.names(diff_id)
        if names is None:
            return None
        return {path: copied[path] for path in sorted({"/" + clean_name(name) for name in names}) if path in copied}

    def record(self, key: str) -> tuple[Written, tuple[str, ...]] | None:
        """The layer written under `key` and the repositories it went to; None: none kept."""
        try:
            document = json.loads(self._path("layers", key, ".json").read_text())
            return _written_of(document), tuple(document["repositories"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def keep(self, key: str, written: Written, ref: str) -> None:
        """`written` went up into `ref`'s repository."""
        kept = self.record(key)
        repository = parse_reference(ref).name
        before = [r for r in (kept[1] if kept is not None and kept[0] == written else ()) if r != repository]
        document = {"written": asdict(written), "repositories": [repository, *before][:REPOSITORIES_KEPT]}
        self._write(self._path("layers", key, ".json"), json.dumps(document, sort_keys=True).encode())

    # -- the start profile, and the small parts of a save

    def profile(self, key: str) -> StartProfile | None:
        try:
            return _profile_of(json.loads(self._path("profiles", key, ".json").read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def keep_profile(self, key: str, profile: StartProfile) -> None:
        self._write(self._path("profiles", key, ".json"), json.dumps(profile.to_json()).encode())

    def image(self, image_id: str, platform: str) -> SavedImage | None:
        """The save of the local image `image_id` less its layers (SavedImage.layers empty)."""
        try:
            document = json.loads(self._path("images", f"{image_id} {platform}", ".json").read_text())
            return SavedImage(document["manifest"], base64.b64decode(document["config"]), (), document["platform"],
                              document["manifest_digest"], document["attestation"],
                              {digest: base64.b64decode(body) for digest, body in document["blobs"].items()})
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def keep_image(self, image_id: str, platform: str, saved: SavedImage) -> None:
        document = {"manifest": saved.manifest, "config": base64.b64encode(saved.config).decode(),
                    "platform": saved.platform, "manifest_digest": saved.manifest_digest,
                    "attestation": saved.attestation,
                    "blobs": {digest: base64.b64encode(body).decode() for digest, body in saved.blobs.items()
                              if digest.startswith("sha256:")}}
        self._write(self._path("images", f"{image_id} {platform}", ".json"), json.dumps(document).encode())

    def _path(self, kind: str, key: str, suffix: str) -> Path:
        return self.folder / kind / (hashlib.sha256(key.encode()).hexdigest()[:32] + suffix)

    def _write(self, path: Path, data: bytes) -> None:
        try:
            write_atomic(path, data)
        except OSError:
            pass  # an unwritable cache costs the next publish the time, nothing else
