"""How a BuildKit build leaves the builder: layer compression, provenance, registry caches.

Pure: these values become `docker buildx build` options. With Docker's containerd image
store, BuildKit's `type=image` exporter keeps exactly the blobs it compressed (zstd with all
cores, or gzip at a level), and `docker push` then sends those blobs as they are: the image
id is the digest of the index that is pushed, so what verify ran is what the registry gets,
byte for byte. The classic image store keeps only unpacked layers (`docker push`
recompresses them with gzip), so there compression is not ours to choose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

from ..errors import BadRequest

DUAL = "gzip+zstd"
ESTARGZ = "estargz"
ZSTD_CHUNKED = "zstd:chunked"
ORDERED = (ESTARGZ, ZSTD_CHUNKED)  # what publish writes itself, ordered by the image's start (publish/estargz.py)
# gzip+zstd: every platform's image twice, a gzip manifest first and a zstd one after it in one
# index (publish/dual.py), for engines that pull no zstd (Docker < 23, enroot < 4.0: they take
# the first entry of their platform) beside ones that prefer zstd (Podman, CRI-O: containers/image
# reads the zstd entry's annotation). BuildKit exports the zstd image into the store (what verify
# runs), then the same build again, every step cached, as gzip (GZIP_SUFFIX's tag).
CACHE_REPOSITORY = "imagebuilder-cache"


def _either(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1]


class UnknownCompression(BadRequest):
    compression: str
    template = "--compression {compression!r} is not a compression; give {known}"


class BadCompression(BadRequest):
    compression: str
    level: int
    template = "--compression-level {level} is not a {compression} level; {compression} takes {low}..{high}"


class LevelOfDual(BadRequest):
    level: int
    template = ("--compression-level {level} sets one compression's level; " + DUAL + " exports each "
                "at BuildKit's default: drop --compression-level, or give gzip or zstd")


class LevelWithoutCompression(BadRequest):
    level: int
    template = "--compression-level {level} sets the level of --compression: give --compression {known} with it"


@dataclass(frozen=True)
class Compression:
    """The layers' compression: the one home of its names, levels and default."""

    # BuildKit's own defaults: zstd level 3 ("default" in klauspost/compress), gzip level 6.
    # eStargz is gzip, each file's chunks a gzip member of their own, with a table of contents at
    # the end: a node whose containerd runs the stargz snapshotter mounts it and fetches what is
    # read, when it is read (lazy pulling); any other puller pulls it as gzip.
    # zstd:chunked is eStargz's layout with zstd frames: written by publish alone (BuildKit 0.13
    # has no such exporter); the stargz snapshotter (0.10+) pulls it lazily, others as zstd.
    LEVELS: ClassVar[Mapping[str, range]] = {"zstd": range(0, 23), "gzip": range(0, 10), "estargz": range(0, 10),
                                             ZSTD_CHUNKED: range(0, 23)}
    NAMES: ClassVar[tuple[str, ...]] = (*LEVELS, DUAL)
    # What build and publish export when nothing is asked, where BuildKit exports into the
    # containerd store: pulled by Docker >= 23 and containerd >= 1.5 (every current Kubernetes
    # node), and compressed with every core where `--load`'s gzip uses one.
    DEFAULT: ClassVar[str] = "zstd"
    PUSHED: ClassVar[str] = "gzip"  # what `docker push` compresses with, where the store keeps no blobs

    kind: str
    """"zstd", "gzip", "estargz", "zstd:chunked" or "gzip+zstd" (NAMES)."""
    level: int | None = None
    """None: BuildKit's default for `kind`."""

    def __post_init__(self) -> None:
        if self.kind not in self.NAMES:
            raise UnknownCompression(compression=self.kind, known=_either(self.NAMES))
        if self.kind == DUAL:
            if self.level is not None:
                raise LevelOfDual(level=self.level)
            return
        levels = self.LEVELS[self.kind]
        if self.level is not None and self.level not in levels:
            raise BadCompression(compression=self.kind, level=self.level, low=levels.start, high=levels.stop - 1)

    @classmethod
    def asked(cls, kind: str | None, level: int | None) -> Compression | None:
        """--compression and --compression-level as one value, checked before anything runs (dry
        runs too); None when neither is given: the engine's default (export_decision.decide_export)."""
        if kind is None:
            if level is not None:
                raise LevelWithoutCompression(level=level, known=_either(cls.NAMES))
            return None
        return cls(kind, level)

    @classmethod
    def levels_help(cls) -> str:
        """The levels each takes, as --compression-level's help says them: "zstd 0-22, gzip 0-9, ..."."""
        return ", ".join(f"{name} {r.start}-{r.stop - 1}" for name, r in cls.LEVELS.items())

    @property
    def exported(self) -> Compression:
        """What BuildKit exports into the image store, verify runs and the registry cache
        keeps: zstd for gzip+zstd and zstd:chunked, else this."""
        return Compression("zstd") if self.kind in (DUAL, ZSTD_CHUNKED) else self

    @property
    def also(self) -> Compression | None:
        """The second export of gzip+zstd (gzip, tagged gzip_ref()); None: one export."""
        return Compression("gzip") if self.kind == DUAL else None

    @property
    def media_suffix(self) -> str:
        """How its exported layers' media types end: eStargz layers are gzip ones."""
        kind = self.exported.kind
        return "+gzip" if kind == "estargz" else f"+{kind}"


GZIP_SUFFIX = "-gzip"


def gzip_ref(ref: str) -> str:
    """The tag of gzip+zstd's gzip image, locally and in the registry (TAG-gzip): the registry
    API cannot drop a tag and keep its manifest, so the tag stays, naming the gzip image alone."""
    return ref + GZIP_SUFFIX


@dataclass(frozen=True)
class Export:
    """What a BuildKit build exports besides the image itself."""

    compression: Compression | None = None
    """The layers' compression in the image store; None: the builder's default (`--load`)."""
    provenance: bool = False
    """Attach BuildKit's SLSA provenance (mode=max) to the image's index."""
    cache_from: tuple[str, ...] = ()
    """Registry cache refs (HOST/NS/imagebuilder-cache:KEY) to import."""
    cache_to: str | None = None
    """The registry cache ref to export the image's layers and every step's cache key to (mode=min)."""
    image: bool = True
    """False: no image, only the registry cache (`--output type=cacheonly`): publish's export of
    the cache, run beside verify once the image is in the store (its blobs compressed already)."""

    def describe(self) -> str:
        c = self.compression
        what = "as the builder stores them" if c is None else (
            f"{c.kind}" + (f" level {c.level}" if c.level is not None else "") + ", exported by BuildKit and pushed as verified")
        return what + ("; SLSA provenance (mode=max)" if self.provenance else "")


class CacheHome(Protocol):
    """Where registry caches go: registry.reference's RegistryTarget (--registry, --cache-from-registry),
    declared here so that the engine imports nothing of registry/."""

    def repository(self, name: str) -> str: ...


def cache_ref(registry: CacheHome, key: str) -> str:
    """The registry ref of an image's build cache: one tag per image key beside its images."""
    return f"{registry.repository(CACHE_REPOSITORY)}:{key}"


def _insecure(ref: str) -> bool:
    host = ref.split("/", 1)[0]
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0][1:]
    return name in ("localhost", "::1") or name.startswith("127.")


def output_args(export: Export | None) -> list[str]:
    """The options that replace `--load`: `type=image` with the chosen compression (the image
    store keeps those blobs), provenance, caches. None: `--load`, as before."""
    if export is None:
        return ["--load"]
    args: list[str] = []
    if not export.image:
        args += ["--output", "type=cacheonly"]
    elif export.compression is None:
        args.append("--load")
    else:
        c = export.compression.exported
        output = f"type=image,compression={c.kind},force-compression=true,oci-mediatypes=true"
        if c.level is not None:
            output += f",compression-level={c.level}"
        args += ["--output", output]
    args.append("--provenance=mode=max" if export.provenance else "--provenance=false")
    for ref in export.cache_from:
        args += ["--cache-from", f"type=registry,ref={ref}" + (",registry.insecure=true" if _insecure(ref) else "")]
    if export.cache_to is not None:
        ref = export.cache_to
        # mode=min: the image's own layers, compressed as the image's are, so the cache's blobs are
        # the image's blobs (no second compression) and the image's push mounts them from the cache's
        # repository instead of uploading them again; the cache keys of every step, the venv stage's
        # included, go too, so an empty builder matches `COPY --link --from=venv` without that stage's
        # layer. mode=max would compress and upload the venv stage's own multi-GB layer as well.
        # force-compression: the base's layers too (without it the cache keeps their gzip blobs).
        # ignore-error: an image build does not fail for its cache; a cache-only build is its cache.
        compression = export.compression.exported.kind if export.compression is not None else Compression.DEFAULT
        args += ["--cache-to", f"type=registry,ref={ref},mode=min,oci-mediatypes=true,image-manifest=true,"
                 f"compression={compression},force-compression=true"
                 + (",ignore-error=true" if export.image else "") + (",registry.insecure=true" if _insecure(ref) else "")]
    return args


ZSTD_DOCKER = "23.0"  # moby/moby#41759: dockerd pulls zstd layers from Docker 23.0 on


def compression_of(media_types: Iterable[str]) -> str | None:
    """"zstd" when any layer is zstd-compressed, "gzip" when all compressed ones are gzip."""
    kinds = {m.rsplit("+", 1)[1] for m in media_types
             if "layer" in m and "+" in m and m.rsplit("+", 1)[1] in Compression.NAMES}
    if "zstd" in kinds:
        return "zstd"
    if "gzip" in kinds or any(m.endswith(".tar.gzip") for m in media_types):
        return "gzip"
    return None


def cannot_pull(compression: str | None, server_version: str | None, instead: str | None = None) -> str | None:
    """Why a daemon of `server_version` cannot pull layers of `compression`; None: it can
    (or there is nothing to judge). `instead`: a gzip image of the same to name (gzip_ref())."""
    from packaging.version import Version

    if compression != "zstd" or not server_version:
        return None
    try:
        version = Version(server_version.split("+")[0].split("-")[0])
    except ValueError:  # InvalidVersion, or a number too long for int()
        return None
    if version >= Version(ZSTD_DOCKER):
        return None
    return (f"the image's layers are zstd-compressed and this daemon (Docker {server_version}) pulls only "
            f"gzip ones (zstd needs Docker >= {ZSTD_DOCKER} or containerd >= 1.5): "
            + (f"pull {instead} instead (its gzip image), " if instead else "")
            + f"upgrade the engine, or publish the image with --compression {DUAL}")
