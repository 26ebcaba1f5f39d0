"""`imagebuilder squashfs IMAGE -o FILE`: the squashfs published beside an image, onto a node.

The tag is resolved to its digest (an index to its image for the platform), the artifact found
through the referrers API or its fallback tag (artifact.py), its signature checked with `--key`
before a byte of it is downloaded, the blob streamed into a temp file beside FILE (a line every
15 s), checked against its digest, and renamed over FILE: a reader sees no file or the whole one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from ..errors import BadRequest, ImageBuilderError
from ..platforms import DEFAULT_PLATFORM
from ..registry.heartbeat import every
from ..registry.manifests import INDEXES
from ..registry.reference import pinned
from ..trust.cosign import Cosign
from .artifact import ArtifactRegistry, find_artifact
from .make import HEARTBEAT_S, human, sha256_file


class FetchError(ImageBuilderError):
    """The squashfs could not be fetched."""


class NoImage(BadRequest):
    template = "the registry has no image {image}; check the name and the tag"


class NoPlatform(FetchError):
    template = "{image} has no {platform} image; give the platform it has with --platform"


class NoSquashfs(FetchError):
    template = ("no squashfs was published for {image} ({digest}); publish it with `imagebuilder publish "
                "--squashfs`, or import the image with enroot")


class Corrupt(FetchError):
    template = "the squashfs of {image} arrived with digest {actual}, not {digest}; try again"


class OutputIsFolder(BadRequest):
    template = "-o {path} is a folder; give the squashfs file's path"


class NoOutputFolder(BadRequest):
    template = "-o {path}: the folder {folder} does not exist"


class NoSpace(FetchError):
    template = ("{folder} has {free} free, and the squashfs of {image} is {size}; free some space there or give -o a "
                "file on another disk")


def check_space(folder: Path, size: int, image: str) -> None:
    """Room for the squashfs's `size` bytes on the disk of `folder`, before a byte is fetched
    (a full disk would read as a registry that stopped answering)."""
    free = shutil.disk_usage(folder).free
    if free < size:
        raise NoSpace(folder=folder, free=human(free), image=image, size=human(size))


class FetchRegistry(ArtifactRegistry, Protocol):
    def download_blob(self, ref: str, digest: str, out: IO[bytes]) -> None: ...


@dataclass(frozen=True)
class Fetched:
    path: Path
    image: str
    """REPOSITORY@DIGEST of the image the squashfs is of."""
    artifact: str
    size: int
    seconds: float
    annotations: Mapping[str, str]


class OutputNotWritable(BadRequest):
    template = "-o {path}: cannot write in {folder} ({detail}); give -o a file in a folder you can write"


class AlreadyServed(ImageBuilderError):
    template = "{path} is served already (by an earlier --lazy); release it first: imagebuilder squashfs-release {path}"


def work_folder(output: Path) -> Path:
    """The folder beside FILE with its cache, chunk table and log, while `--lazy` serves FILE."""
    return output.parent / f".{output.name}.lazy"


def check_output(path: Path) -> None:
    """-o's value, refused before any registry is asked."""
    try:
        if path.is_dir():
            raise OutputIsFolder(path=path)
        if not path.parent.is_dir():
            raise NoOutputFolder(path=path, folder=path.parent)
        served = work_folder(path).exists()
    except PermissionError as e:
        raise OutputNotWritable(path=path, folder=path.parent, detail=e.strerror) from e
    if served:
        raise AlreadyServed(path=path)
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise OutputNotWritable(path=path, folder=path.parent, detail="permission denied")


def image_digest(registry: ArtifactRegistry, image: str, platform: str) -> str:
    """REPOSITORY@DIGEST of the image manifest `image` names for `platform`."""
    found = registry.manifest(image)
    if found is None:
        raise NoImage(image=image)
    document, media_type = found
    if media_type in INDEXES or document.get("mediaType") in INDEXES:
        wanted = dict(zip(("os", "architecture", "variant"), platform.split("/")))
        for entry in document.get("manifests") or []:
            described = entry.get("platform") or {}
            if all(described.get(key) == value for key, value in wanted.items()):
                return pinned(image, str(entry["digest"]))
        raise NoPlatform(image=image, platform=platform)
    descriptor = registry.descriptor(image)
    if descriptor is None:
        raise NoImage(image=image)
    return pinned(image, str(descriptor["digest"]))


def checked_artifact(registry: ArtifactRegistry, image: str, *, key: str | None, platform: str,
                     cosign: Cosign | None, say: Callable[[str], None]) -> tuple[str, str, Mapping[str, Any]]:
    """(REPOSITORY@DIGEST of the image, of its artifact, the squashfs layer's descriptor), the
    artifact's signature checked with `key`."""
    target = image_digest(registry, image, platform)
    found = find_artifact(registry, target)
    if found is None:
        raise NoSquashfs(image=image, digest=target.partition("@")[2])
    artifact, layer = found
    if key is not None:
        (cosign or Cosign().require()).verify(key, artifact)
        say(f"{artifact}: signature verified with {key}")
    return target, artifact, layer


def fetch_squashfs(registry: FetchRegistry, image: str, output: Path, *, key: str | None = None,
                   platform: str = DEFAULT_PLATFORM, cosign: Cosign | None = None,
                   say: Callable[[str], None]) -> Fetched:
    started = time.monotonic()
    target, artifact, layer = checked_artifact(registry, image, key=key, platform=platform, cosign=cosign, say=say)
    return download_squashfs(registry, image, output, target, artifact, layer, started=started, say=say)


def download_squashfs(registry: FetchRegistry, image: str, output: Path, target: str, artifact: str,
                      layer: Mapping[str, Any], *, started: float, say: Callable[[str], None]) -> Fetched:
    """The squashfs blob `layer` of `artifact` (checked_artifact's answer for `image`) as FILE,
    its digest checked, written atomically."""
    digest, size = str(layer["digest"]), int(layer.get("size") or 0)
    check_space(output.parent, size, image)
    manifest = registry.manifest(artifact)
    annotations: Mapping[str, Any] = (manifest[0].get("annotations") or {}) if manifest else {}
    say(f"{image}: downloading its squashfs ({human(size)}, {artifact.rpartition('@')[2][:19]})")
    fd, temp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".part", dir=output.parent)
    part = Path(temp)
    try:
        with os.fdopen(fd, "w+b") as out:
            def progress() -> None:
                done = part.stat().st_size if part.exists() else 0
                say(f"{image}: {human(done)} of {human(size)} after {time.monotonic() - started:.0f} s")

            with every(HEARTBEAT_S, progress, name="squashfs-heartbeat"):
                registry.download_blob(target, digest, out)
        actual = sha256_file(part)
        if actual != digest:
            raise Corrupt(image=image, actual=actual, digest=digest)
        part.chmod(0o644)
        os.replace(part, output)
    finally:
        part.unlink(missing_ok=True)
    return Fetched(output, target, artifact, size, time.monotonic() - started,
                   {str(k): str(v) for k, v in annotations.items()})
