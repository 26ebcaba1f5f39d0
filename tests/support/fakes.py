"""Small fakes, each behaving as the real thing does where the tests look, each typed against the
protocol of imagebuilder's that it stands in for (the `if TYPE_CHECKING` block at the end)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imagebuilder.lock.index import WheelMetadata

if TYPE_CHECKING:
    from imagebuilder.engine.api import Running
    from imagebuilder.lock.base_pin import DigestSource, ImageInspector
    from imagebuilder.lock.index import Index
    from imagebuilder.squashfs.make import LayerRegistry


@dataclasses.dataclass
class TickingBuild:
    """A fake background build (engine.api.Running): it runs for `busy` waits, then ends with
    `rc`, noting "cache exported" in `timeline` when one is given; stopping ends it with -2."""

    busy: int
    rc: int
    timeline: list[str] | None = None
    stopped: bool = False
    ended_at = None

    def wait(self, timeout: float | None = None) -> int | None:
        if self.stopped:
            return -2
        if self.busy > 0:
            self.busy -= 1
            return None
        if self.timeline is not None:
            self.timeline.append("cache exported")
        return self.rc

    def stop(self) -> None:
        self.stopped = True


@dataclasses.dataclass
class FakeImages:
    """The engine's local images, as a base image's pin reads them: ref -> (image id, RepoDigests)."""

    images: Mapping[str, tuple[str, tuple[str, ...]]]

    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        return self.images.get(ref)


@dataclasses.dataclass
class FakeDigests:
    """A registry, as a base image's pin reads it: ref -> the manifest digest it names."""

    digests: Mapping[str, str]

    def digest(self, ref: str) -> str | None:
        return self.digests.get(ref)


class CannedIndex:
    """Canned answers: project -> Python -> versions with a wheel; every wheel's metadata
    requires `requires` (one torch release's requirements)."""

    def __init__(self, wheels: dict[str, dict[Version, set[Version]]], requires: tuple[Requirement, ...]) -> None:
        self.wheels = wheels
        self.requires = requires

    def versions_with_wheels(self, project: str, python: Version, platform: str = "linux/amd64",
                             abi: str | None = None) -> tuple[Version, ...]:
        return tuple(sorted(self.wheels[project][python], reverse=True))

    def wheel_metadata(self, project: str, version: Version, python: Version,
                       platform: str = "linux/amd64") -> WheelMetadata:
        return WheelMetadata(project, version, self.requires, SpecifierSet(">=3.9"), "torch-2.5.1-cp312-cp312-x.whl")


class CannedLayerRegistry:
    """One image of one gzip layer whose config's environment is `env`, and whose blob arrives
    as `arrives` (a corrupt link, when it differs)."""

    def __init__(self, env: Sequence[str], arrives: bytes | None = None) -> None:
        from squashfs_images import E, compress, layer_tar

        self.blob, _ = compress(layer_tar([E("a", data="a")]), "gzip")
        self.env = list(env)
        self.arrives = self.blob if arrives is None else arrives
        self.asked: list[str] = []

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None:
        from squashfs_images import sha256

        return {"layers": [{"digest": sha256(self.blob), "size": len(self.blob)}]}, \
            "application/vnd.oci.image.manifest.v1+json"

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        return {"config": {"Env": self.env}}, ()

    def download_blob(self, ref: str, digest: str, out: IO[bytes]) -> None:
        self.asked.append(digest)
        out.write(self.arrives)


if TYPE_CHECKING:  # mypy's proof that each fake is what it stands in for
    _running: Running = TickingBuild(0, 0)
    _images: ImageInspector = FakeImages({})
    _digests: DigestSource = FakeDigests({})
    _index: Index = CannedIndex({}, ())
    _layers: LayerRegistry = CannedLayerRegistry([])
