"""Pure: which platforms an image is built for, and which base image each platform starts FROM.

`--platform linux/amd64,linux/arm64` and `--base-image [PLATFORM=]IMAGE` (repeatable) are
parsed here; whether a release has CUDA wheels for a platform is matrix data
(`TorchRelease.platforms`). The host's platform keeps an image's plain tags; an image for
another platform gets `-{arch}` after each tag, since one local tag holds one image
(image_plan decides an image's tags and base on its platform).
"""

from __future__ import annotations

import platform as _host
from collections.abc import Iterable, Mapping, Sequence

from ..errors import BadRequest
from ..matrix.model import Matrix, TorchRelease
from ..platforms import DEFAULT_PLATFORM, PLATFORMS, platform_of_machine
from ..registry.reference import parse_reference


class UnknownPlatform(BadRequest):
    requested: str
    template = "unknown platform {requested!r}; known: " + ", ".join(PLATFORMS)


class NoWheelsForPlatform(BadRequest):
    torch: str
    platform: str
    first: str | None

    def describe(self) -> str:
        f = self.fields
        since = (f"the first release that has them is torch {f['first']}" if f["first"]
                 else "no release in the matrix has them")
        return f"torch {f['torch']} has no CUDA wheels for {f['platform']} on PyPI; {since}"


def host_platform() -> str:
    return platform_of_machine(_host.machine()) or DEFAULT_PLATFORM


def arch(platform: str) -> str:
    return platform.rpartition("/")[2]


def parse_platforms(text: str | None) -> tuple[str, ...]:
    """"linux/amd64,linux/arm64" -> both, in that order, each once; None -> the host's."""
    if not text:
        return (host_platform(),)
    wanted: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part not in PLATFORMS:
            raise UnknownPlatform(requested=part)
        if part not in wanted:
            wanted.append(part)
    return tuple(wanted)


def parse_base_images(values: Iterable[str]) -> dict[str | None, str]:
    """`IMAGE` (every platform) and `PLATFORM=IMAGE` -> {None or platform: image}."""
    bases: dict[str | None, str] = {}
    for value in values:
        key, sep, image = value.partition("=")
        platform = key if sep and "/" in key and ":" not in key else None
        if platform is None:
            image = value
        elif platform not in PLATFORMS:
            raise UnknownPlatform(requested=platform)
        if not image:
            raise BadRequest(f"--base-image {value!r} names no image; give IMAGE or PLATFORM=IMAGE")
        parse_reference(image, "--base-image")
        if platform in bases and bases[platform] != image:
            raise BadRequest(f"--base-image given twice for {platform or 'every platform'}: "
                             f"{bases[platform]} and {image}; give one")
        bases[platform] = image
    return bases


def base_for(bases: Mapping[str | None, str], platform: str) -> str | None:
    return bases.get(platform, bases.get(None))


def check_platform(matrix: Matrix, torch: TorchRelease, platform: str) -> None:
    """A bad request when PyPI carries no CUDA wheels of `torch` for `platform`."""
    if platform in torch.platforms:
        return
    newer = sorted((t for t in matrix.torches.values() if platform in t.platforms), key=lambda t: t.version)
    raise NoWheelsForPlatform(torch=str(torch.version), platform=platform,
                              first=newer[0].key if newer else None)


def platform_tags(tags: Sequence[str], platform: str) -> tuple[str, ...]:
    """One platform's tags: publish pushes each platform under these before an index joins them."""
    return tuple(f"{tag}-{arch(platform)}" for tag in tags)
