"""The one export decision: (compression, builder, image store, cache) -> what a build exports,
how publish pushes, and the registry cache's from and to, or the refusal. Pure, read as a table
(`decide_export`): build, publish and their checks before any daemon is asked all call it.

| asked                 | BuildKit + containerd store             | elsewhere (classic builder or store)      |
|-----------------------|-----------------------------------------|-------------------------------------------|
| nothing               | zstd (Compression.DEFAULT)              | `--load`; docker push's gzip              |
| zstd, gzip (+ level)  | that, exported by BuildKit              | refused but plain gzip                    |
| gzip+zstd             | zstd, then a cached gzip build (TAG-gzip)| refused                                  |
| estargz               | build: BuildKit's; publish: zstd, pushed ordered by publish | refused                  |
| zstd:chunked          | build: refused; publish: as estargz     | refused                                   |
| --cache-from-registry | imported where the registry has it      | refused                                   |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from ..errors import BadRequest
from .export import DUAL, ORDERED, ZSTD_CHUNKED, CacheHome, Compression, Export, cache_ref

Command = Literal["build", "publish"]


class ChunkedAtPublish(BadRequest):
    template = ("--compression " + ZSTD_CHUNKED + " is written by publish (its layers ordered by the image's start); "
                "build exports zstd: give --compression zstd, or publish")


class CompressionUnavailable(BadRequest):
    asked: str
    template = ("{asked} needs BuildKit (buildx) exporting into Docker's containerd image store "
                "(daemon.json: {{\"features\": {{\"containerd-snapshotter\": true}}}}); this engine "
                "recompresses on push with gzip: drop the option, or use such an engine")


class ExportNeedsBuildKit(BadRequest):
    asked: str
    template = ("{asked} needs BuildKit: the classic builder exports nothing of its own (docker push compresses "
                "with gzip at its level); drop the option, or use --builder buildkit")


@dataclass(frozen=True)
class Ordered:
    """publish's own push of --compression estargz or zstd:chunked (publish/estargz.py)."""

    codec: str
    level: int | None
    """None: the codec's default (publish/estargz.LEVELS)."""


@dataclass(frozen=True)
class ExportDecision:
    export: Export | None
    """What BuildKit exports into the image store (verify runs it; the registry cache keeps its
    blobs); None: `--load` (build) or the classic builder, and `docker push`'s gzip (publish)."""
    ordered: Ordered | None = None
    """publish: the layers pushed ordered by the image's start, written by publish itself."""
    gzip_too: bool = False
    """gzip+zstd: `export` is zstd, and each image is built again, every step cached, as gzip,
    tagged gzip_ref() (build/run.py), which publish pushes too (push.push_dual)."""
    cache: CacheHome | None = None
    """Where each image's registry cache lives (cache_ref()): imported where the registry has it."""
    cache_to: bool = False
    """publish: each image's cache exported there too (build only imports it)."""

    def describe(self) -> str:
        """The `layers:` line a run prints (gzip+zstd named as asked)."""
        if self.export is None:
            return "gzip (docker push compresses them)"
        if self.gzip_too:  # zstd exported, and gzip after it
            return replace(self.export, compression=Compression(DUAL)).describe()
        return self.export.describe()

    def for_image(self, key: str, cached: Callable[[str], bool]) -> Export | None:
        """The export of the image of `key`: with its registry cache imported where `cached` says
        the registry has it (BuildKit fails a build whose cache is missing), and exported to it."""
        if self.export is None or self.cache is None:
            return self.export
        ref = cache_ref(self.cache, key)
        found = (ref,) if cached(ref) else ()
        return replace(self.export, cache_from=(*self.export.cache_from, *found),
                       cache_to=ref if self.cache_to else self.export.cache_to)


def decide_export(asked: Compression | None, *, command: Command, buildkit: bool, image_store: bool | None,
                  cache: CacheHome | None = None) -> ExportDecision:
    """`asked` (--compression, --compression-level) for `command` with BuildKit or the classic builder,
    and an image store that keeps what BuildKit compressed (the containerd store) or not; None: not
    known yet (the checks before any daemon is asked: only what the builder refuses is refused then).
    `cache`: build's --cache-from-registry, publish's --registry (its cache exported beside the images)."""
    if command == "build" and asked is not None and asked.kind == ZSTD_CHUNKED:
        raise ChunkedAtPublish()
    if not (buildkit and image_store in (True, None)):
        wanted = []
        if asked is not None and asked.kind != Compression.PUSHED:
            wanted.append(f"--compression {asked.kind}")
        if asked is not None and asked.level is not None:
            wanted.append("--compression-level")
        if command == "build" and cache is not None:
            wanted.append("--cache-from-registry")
        if wanted:
            raise (ExportNeedsBuildKit if image_store is None else CompressionUnavailable)(asked=" and ".join(wanted))
        return ExportDecision(None)
    compression = asked or Compression(Compression.DEFAULT)
    gzip_too = compression.kind == DUAL  # zstd exported (Compression.exported), then gzip
    if command == "build":
        return ExportDecision(Export(compression.exported), gzip_too=gzip_too, cache=cache)
    ordered = Ordered(compression.kind, compression.level) if compression.kind in ORDERED else None
    exported = Compression(Compression.DEFAULT) if ordered else compression.exported
    return ExportDecision(Export(exported, provenance=True), ordered=ordered, gzip_too=gzip_too,
                          cache=cache, cache_to=True)
