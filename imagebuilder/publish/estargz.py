"""`publish --compression estargz|zstd:chunked`: the verified image pushed as eStargz (or
zstd:chunked: the same layout in zstd frames) layers ordered by its start.

BuildKit exports the image into the store as zstd (every core; the registry cache keeps those
blobs) and verify runs it as usual. At the push, instead of `docker push`:
  1. the start profile (estargz/profile.py): the image run once, as its user, with the start
     that matters (`import torch` and a first `torch.compile`), the files it opened recorded;
     it runs while the engine's save of the image is read and each layer spooled uncompressed
     (estargz/saved.py, each checked against its diff_id);
  2. each layer written as eStargz (estargz/writer.py): the profile's files it holds first, the
     prefetch landmark, the rest; its gzip members (zstd frames) compressed on every core. A layer is uploaded
     while the next one is written;
  3. the config (its diff_ids those of the eStargz streams), the manifest (each layer with the
     TOC digest the stargz snapshotter checks, and how much of the profile it holds) and, when
     BuildKit attached provenance, an index over the manifest and that attestation, whose
     subject stays the zstd manifest the build exported (named in SOURCE_ANNOTATION), go up
     through the registry API, under each tag, each tag confirmed as `docker push`'s are.
     zstd:chunked pushes a second manifest over the same blobs, with containers/storage's
     annotations, marked zstd in the index (_readers says why).

The profile and its command are in the report and in the manifest's annotations.

A republish skips what an earlier one did (layer_reuse.py): a layer kept under the same key whose
blob the repository has is not written or uploaded, a kept profile is not run, and an image whose
profile and layers are all known is not read out of the engine.
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..build.platforms import host_platform
from ..engine.export import ESTARGZ, ORDERED, ZSTD_CHUNKED, Compression
from ..engine.progress import human_size
from ..estargz.profile import TORCH_START, StartProfile, start_profile
from ..estargz.saved import SavedImage, save_layers
from ..estargz.toc import DEFAULT_CHUNK_SIZE
from ..estargz.writer import Written, write_estargz
from ..estargz.zstdchunked import DEFAULT_LEVEL as ZSTD_LEVEL
from ..registry.manifests import OCI_INDEX, OCI_MANIFEST, REFERENCE_DIGEST, ZSTD_ANNOTATION
from ..registry.reference import pinned
from .layer_reuse import LayerStore, kept_layers, layer_key, profile_key

LAYER_TYPES = {ESTARGZ: "application/vnd.oci.image.layer.v1.tar+gzip",
               ZSTD_CHUNKED: "application/vnd.oci.image.layer.v1.tar+zstd"}
NAMES = {ESTARGZ: "eStargz", ZSTD_CHUNKED: "zstd:chunked"}
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
PROFILE_COMMAND = "io.imagebuilder.start-profile.command"
PROFILE_DIGEST = "io.imagebuilder.start-profile.digest"
PROFILE_FILES = "io.imagebuilder.start-profile.files"
PROFILE_BYTES = "io.imagebuilder.start-profile.bytes"
PROFILE_CHUNKS = "io.imagebuilder.start-profile.copied-chunks"
SOURCE_ANNOTATION = "io.imagebuilder.estargz.source"
LEVELS = {ESTARGZ: 6, ZSTD_CHUNKED: ZSTD_LEVEL}
SAY_EVERY = 10.0
T = TypeVar("T")


class EstargzRegistry(Protocol):
    def has_blob(self, ref: str, digest: str) -> bool: ...

    def upload_blob(self, ref: str, digest: str, source: Any, size: int) -> None: ...

    def put_manifest(self, ref: str, body: bytes, media_type: str) -> Mapping[str, str]: ...

    def digest(self, ref: str) -> str | None: ...

    def mount(self, ref: str, digest: str, source: str) -> bool: ...


class ImageSaver(Protocol):
    def save_image(self, ref: str) -> Iterator[bytes]: ...

    def inspect_image(self, ref: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Converted:
    digest: str
    """What the tags name: the index (with provenance) or the manifest."""
    manifest: str
    uploaded: int
    profile: StartProfile | None
    layers: tuple[Written, ...]
    seconds: Mapping[str, float]
    reused: tuple[int, ...] = ()
    """The layers (by index) an earlier publish wrote and the registry had: neither written nor uploaded."""
    saved: bool = True
    """Whether the engine's save was read (not when the profile and every layer were known)."""
    profiled: bool = True
    """Whether the start ran (not when its profile was kept for this image's layers and config)."""

    def to_json(self) -> dict[str, Any]:
        return {"format": self.layers[0].codec if self.layers else None, "manifest": self.manifest,
                "profile": self.profile.to_json() if self.profile else None,
                "layers": [{"digest": w.digest, "size": w.size, "toc_digest": w.toc_digest,
                            "prioritized_files": len(w.prioritized), "prioritized_bytes": w.prioritized_bytes,
                            "reused": index in self.reused}
                           for index, w in enumerate(self.layers)],
                "reused_layers": len(self.reused), "written_layers": len(self.layers) - len(self.reused),
                "saved": self.saved, "profiled": self.profiled,
                **{k: round(v, 2) for k, v in self.seconds.items()}}


def reuse_summary(converted: Mapping[str, Any]) -> str:
    """How an ordered push's layers went up (Converted.to_json()), for the publish's summary."""
    return (f"{NAMES.get(converted['format'], converted['format'])} layers: {converted['written_layers']} written, "
            f"{converted['reused_layers']} reused from an earlier publish"
            + ("" if converted["saved"] else "; the engine's save not read")
            + ("" if converted["profiled"] or converted["profile"] is None else "; its start profile kept"))


@dataclass(frozen=True)
class _Known:
    """What the reuse store had of the local image before the publish read anything."""
    diff_ids: tuple[str, ...]
    profile_key: str
    profile: StartProfile | None
    image_id: str
    platform: str
    saved: SavedImage | None


def _failing_first(profiled: Future[StartProfile] | None, on_progress: Callable[[int], None]) -> Callable[[int], None]:
    """`on_progress`, raising the start profile's error as soon as it has one: a start command
    that fails at once is said then, not after the whole image was read."""
    def checked(done: int) -> None:
        if profiled is not None and profiled.done() and profiled.exception() is not None:
            profiled.result()
        on_progress(done)

    return checked


@dataclass(frozen=True)
class EstargzPublisher:
    """Made at the edge (publish/command.py), handed to the run in RunOptions.estargz."""

    engine: ImageSaver
    registry: EstargzRegistry
    level: int = LEVELS[ESTARGZ]
    codec: str = ESTARGZ
    """ESTARGZ (eStargz) or ZSTD_CHUNKED."""
    start: tuple[str, ...] | None = TORCH_START
    """The start to profile; None: no profile (every layer says .no.prefetch.landmark)."""
    start_timeout: float = 600.0
    """--start-timeout: seconds the profiled start may take."""
    workdir: Path | None = None
    """Where the layers are spooled (their uncompressed size, and one eStargz at a time)."""
    say: Callable[[str], None] = print
    reuse: LayerStore | None = None
    """Layers (and start profiles) kept from earlier publishes (layer_reuse.py); None: all written anew."""

    def push(self, ref: str, refs: Sequence[str], platform: str | None) -> Converted:
        """The local image `ref` as ordered eStargz (zstd:chunked) under each of `refs`; each tag confirmed."""
        folder = Path(tempfile.mkdtemp(prefix=".imagebuilder-estargz-", dir=self.workdir))
        seconds: dict[str, float] = {}
        platform = platform or host_platform()
        try:
            started = time.monotonic()
            known = self._known(ref, platform)
            profile = known.profile if known is not None else None
            saved, hits = None, {}
            if known is not None and (profile is not None or self.start is None):
                hits = self._hits(ref, known.diff_ids, profile)  # all of them, and a kept save: no save
                saved = known.saved if len(hits) == len(known.diff_ids) else None
            if saved is None:
                saved, ran = self._save(ref, folder, platform, profile is None)
                seconds["save_s"] = time.monotonic() - started
                if ran is not None:
                    profile = ran
                    seconds["profile_s"] = ran.seconds
                    self.say(f"{ref}: its start opened {len(ran.files)} files ({' '.join(ran.command)[:80]})")
                if known is not None:
                    self._keep(known, saved, profile)
                    hits = self._hits(ref, [layer.diff_id for layer in saved.layers], profile)
            started = time.monotonic()
            diff_ids = [layer.diff_id for layer in saved.layers] if saved.layers or known is None else known.diff_ids
            written, uploaded = self._layers(ref, saved, diff_ids, profile, folder, hits)
            seconds["estargz_s"] = time.monotonic() - started
            digest, manifest = _put(ref, refs, saved, written, profile, self.registry)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return Converted(digest, manifest, uploaded, profile, tuple(written), seconds, reused=tuple(sorted(hits)),
                         saved="save_s" in seconds, profiled="profile_s" in seconds)

    def _save(self, ref: str, folder: Path, platform: str, profile: bool) -> tuple[SavedImage, StartProfile | None]:
        """The engine's save of `ref` read into `folder`, and (`profile`) its start profile, run beside."""
        with ThreadPoolExecutor(1, thread_name_prefix="start-profile") as pool:
            profiled = pool.submit(self._profile, ref) if self.start is not None and profile else None
            saved = save_layers(ref, self.engine.save_image(ref), folder, platform,
                                on_progress=_failing_first(profiled,
                                                           self._every(f"{ref}: reading its layers", SAY_EVERY)))
            ran = (self._wait(profiled, f"{ref}: its start profile still runs ({' '.join(self.start or ())[:60]})")
                   if profiled is not None else None)
        return saved, ran

    def _known(self, ref: str, platform: str) -> _Known | None:
        """What the reuse store knows of the local image `ref`; None without a store."""
        if self.reuse is None:
            return None
        inspect = self.engine.inspect_image(ref)
        key, image_id = profile_key(inspect, self.start or (), platform), str(inspect.get("Id"))
        return _Known(tuple((inspect.get("RootFS") or {}).get("Layers") or ()), key,
                      self.reuse.profile(key) if self.start is not None else None,
                      image_id, platform, self.reuse.image(image_id, platform))

    def _keep(self, known: _Known, saved: SavedImage, profile: StartProfile | None) -> None:
        """The names of the save's layers, the profile and the save's small parts, for the next publish."""
        assert self.reuse is not None
        for layer in saved.layers:
            self.reuse.keep_names(layer.diff_id, layer.path)
        if profile is not None and known.profile is None:
            self.reuse.keep_profile(known.profile_key, profile)
        if known.saved is None and tuple(saved.config_json["rootfs"]["diff_ids"]) == known.diff_ids:
            self.reuse.keep_image(known.image_id, known.platform, saved)

    def _hits(self, ref: str, diff_ids: Sequence[str], profile: StartProfile | None) -> dict[int, Written]:
        files = profile.prefetched() if profile is not None else ()
        return (kept_layers(self.reuse, self.registry, ref, diff_ids, files, self.codec, self.level,
                            self._copied(profile)) if self.reuse else {})

    def _copied(self, profile: StartProfile | None) -> dict[str, frozenset[int]]:
        """The chunks to copy before the landmark: zstd:chunked's prefetch by chunk (writer.py)."""
        return profile.copied(DEFAULT_CHUNK_SIZE) if profile is not None and self.codec == ZSTD_CHUNKED else {}

    def _wait(self, future: Future[T], still: str) -> T:
        """The result of `future`, saying `still` every SAY_EVERY seconds until it is there."""
        while True:
            try:
                return future.result(timeout=SAY_EVERY)
            except FutureTimeout:
                self.say(still)

    def _profile(self, ref: str) -> StartProfile:
        assert self.start is not None
        return start_profile(ref, self.start, timeout=self.start_timeout)

    def _every(self, what: str, interval: float, last: list[float] | None = None) -> Callable[[int], None]:
        """A progress callback saying `what` and the bytes done at most every `interval` s; `last`
        (the time it last spoke) shared by the callbacks of one phase, so no gap between two
        layers is longer than `interval`."""
        clock = last if last is not None else [time.monotonic()]

        def on_progress(done: int) -> None:
            if time.monotonic() - clock[0] >= interval:
                clock[0] = time.monotonic()
                self.say(f"{what}: {human_size(done)}")

        return on_progress

    def _layers(self, ref: str, saved: SavedImage, diff_ids: Sequence[str], profile: StartProfile | None,
                folder: Path, hits: Mapping[int, Written]) -> tuple[list[Written], int]:
        """Each layer written and uploaded (the upload of one beside the writing of the next), but
        those in `hits`, kept from an earlier publish and in the registry."""
        files = profile.prefetched() if profile is not None else ()
        copied = self._copied(profile)
        layers = dict(enumerate(saved.layers))
        count = len(diff_ids)
        written: list[Written] = []
        uploads: list[Future[int]] = []
        clock = [time.monotonic()]
        with ThreadPoolExecutor(1, thread_name_prefix="estargz-upload") as uploader:
            for index in range(count):
                if index in hits:
                    written.append(hits[index])
                    if index in layers:
                        layers[index].path.unlink()
                    continue
                layer = layers[index]
                out = folder / f"layer-{index + 1}.blob"
                with open(layer.path, "rb") as source, open(out, "wb") as sink:
                    done = write_estargz(source, sink, files, level=self.level, codec=self.codec, on_progress=self._every(
                        f"{ref}: {NAMES[self.codec]} layer {index + 1}/{count} of {human_size(layer.size)}",
                        SAY_EVERY, clock), copied=copied)
                layer.path.unlink()
                written.append(done)
                uploads.append(uploader.submit(self._upload, ref, done, out, layer.diff_id, copied))
            uploaded = sum(self._wait(upload, f"{ref}: uploading its {NAMES[self.codec]} layers") for upload in uploads)
        return written, uploaded

    def _upload(self, ref: str, written: Written, path: Path, diff_id: str, copied: Mapping[str, frozenset[int]]) -> int:
        """The blob up (unless the registry has it), then kept for the next publish."""
        sent = _upload(self.registry, ref, written, path)
        if self.reuse is not None and (held := self.reuse.held(diff_id, copied)) is not None:
            self.reuse.keep(layer_key(diff_id, self.codec, self.level, written.prioritized, held), written, ref)
        return sent


def pushed_as(codec: str, level: int, start: Sequence[str] | None) -> str:
    """The line that says how --compression estargz|zstd:chunked goes up (the run and the dry run)."""
    return (f"pushed as: {NAMES[codec]}, level {level}, "
            + (f"ordered by what `{shlex.join(start)}` opens" if start else "unordered (no start profile)"))


def asked_layers(compression: Compression, start: Sequence[str] | None) -> str:
    """What --compression asks of the layers, as a dry run says it (the run says what it chose)."""
    if compression.kind in ORDERED:
        level = compression.level if compression.level is not None else LEVELS[compression.kind]
        return "layers: zstd, exported by BuildKit; " + pushed_as(compression.kind, level, start)
    return (f"layers: {compression.kind}" + (f" level {compression.level}" if compression.level is not None else "")
            + ", exported by BuildKit and pushed as verified")


def _upload(registry: EstargzRegistry, ref: str, written: Written, path: Path) -> int:
    """The blob into `ref`'s repository unless it is there; the bytes uploaded."""
    try:
        if registry.has_blob(ref, written.digest):
            return 0
        with open(path, "rb") as blob:
            registry.upload_blob(ref, written.digest, blob, written.size)
        return written.size
    finally:
        path.unlink(missing_ok=True)


def _put(ref: str, refs: Sequence[str], saved: SavedImage, written: Sequence[Written],
         profile: StartProfile | None, registry: EstargzRegistry) -> tuple[str, str]:
    """The config, manifest (and index with the attestation) up, and every tag on it:
    (what the tags name, the manifest's digest)."""
    config = saved.config_json
    config["rootfs"] = {**config["rootfs"], "diff_ids": [w.diff_id for w in written]}
    config_body = _canonical(config)
    config_digest = _blob(registry, ref, config_body)
    annotations = {SOURCE_ANNOTATION: saved.manifest_digest}
    if profile is not None:
        annotations |= {PROFILE_COMMAND: json.dumps(list(profile.command)),
                        PROFILE_DIGEST: "sha256:" + hashlib.sha256("\n".join(profile.files).encode()).hexdigest(),
                        PROFILE_FILES: str(len(profile.files))}
    bodies = [_canonical({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                          "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": len(config_body)},
                          "layers": [{"mediaType": LAYER_TYPES[w.codec], "digest": w.digest, "size": w.size,
                                      "annotations": {**reader(w), PROFILE_FILES: str(len(w.prioritized)),
                                                      PROFILE_BYTES: str(w.prioritized_bytes),
                                                      **({PROFILE_CHUNKS: str(w.copied_chunks)} if w.copied_chunks
                                                         else {})}} for w in written],
                          "annotations": annotations}) for reader in _readers(written, saved.platform)]
    entries: list[dict[str, Any]] = []
    for body in bodies:
        manifest_digest = "sha256:" + hashlib.sha256(body).hexdigest()
        registry.put_manifest(pinned(ref, manifest_digest), body, OCI_MANIFEST)
        entries.append({"mediaType": OCI_MANIFEST, "digest": manifest_digest, "size": len(body),
                        **({"platform": dict(saved.platform)} if saved.platform else {}),
                        **({"annotations": {ZSTD_ANNOTATION: "true"}} if entries else {})})
    digest = str(entries[0]["digest"])
    top, top_type, top_body = digest, OCI_MANIFEST, bodies[0]
    if saved.attestation is not None:
        entries.append(_attestation(ref, saved, digest, registry))
    if len(entries) > 1:
        top_body = _canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
        top, top_type = "sha256:" + hashlib.sha256(top_body).hexdigest(), OCI_INDEX
        registry.put_manifest(pinned(ref, top), top_body, OCI_INDEX)
    for tag in refs:
        registry.put_manifest(tag, top_body, top_type)
    return top, digest


def _readers(written: Sequence[Written], platform: Mapping[str, str] | None) -> list[Callable[[Written], dict[str, str]]]:
    """The layer annotations of each manifest pushed, in the index's order. zstd:chunked has two
    sets that no one manifest may carry (estargz/zstdchunked.py), so two manifests over the same
    blobs: the snapshotter's first, which containerd and Podman 4 take (the first of their
    platform), then containers/storage's, marked zstd, which containers/image >= 5.25 (Podman
    4.5+, CRI-O) prefers, as it does gzip+zstd's zstd entry. Without a platform an index could not
    tell them apart for either: the snapshotter's alone."""
    if not written or not written[0].storage_annotations or not platform:
        return [Written.annotations]
    return [Written.annotations, lambda w: dict(w.storage_annotations)]


def _attestation(ref: str, saved: SavedImage, digest: str, registry: EstargzRegistry) -> dict[str, Any]:
    """BuildKit's attestation manifest, its blobs copied, its index entry naming `digest`."""
    entry = saved.attestation
    assert entry is not None
    document = json.loads(saved.blobs[entry["digest"]])
    for blob in [document["config"], *(document.get("layers") or [])]:
        _blob(registry, ref, saved.blobs[blob["digest"]])
    registry.put_manifest(pinned(ref, entry["digest"]), saved.blobs[entry["digest"]], entry["mediaType"])
    return {**entry, "annotations": {**entry.get("annotations", {}), REFERENCE_DIGEST: digest}}


def _blob(registry: EstargzRegistry, ref: str, body: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    registry.upload_blob(ref, digest, io.BytesIO(body), len(body))
    return digest


def _canonical(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()
