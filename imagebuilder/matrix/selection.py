"""Filters or a request -> the images they select, resolved (Selection): one reading of the
coordinates that render, build, matrix, lock and publish share (per_platform renders them).

Two readings of the coordinates (torch, CUDA, Python, variant, OS):
- a *request* (`build`, `render`): one image per variant, defaults filled in;
- *filters* (`matrix`, `render --all`, `publish`): every matching image of the matrix, where
  a torch + CUDA pair the release has no exact wheels for selects the image a request for
  that pair builds (minor-version fallback), not nothing.
The base image override and the OS it implies apply to both.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..errors import BadRequest
from .model import VARIANTS, Matrix
from .resolve import BuildSpec, Request, check_filters, enumerate_matrix, find_cuda, find_torch, resolve

ALL = "all"  # --variant all: runtime, devel, then jupyter and devel-jupyter FROM those two

Note = Callable[[str], None]
ReadOsRelease = Callable[[str], str]  # image reference -> its /etc/os-release text


class NothingSelected(BadRequest):
    template = "no image of the matrix matches these filters; see `imagebuilder matrix`"


@dataclass(frozen=True)
class Selection:
    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    variant: str | None = None  # a variant, ALL, or None (filters: every variant)
    os: str | None = None
    base_image: str | None = None
    strict: bool = False
    platform_bases: tuple[tuple[str, str], ...] = ()  # --base-image PLATFORM=IMAGE

    def for_platform(self, platform: str) -> Selection:
        """The selection one platform builds: its own --base-image PLATFORM=IMAGE if given."""
        return replace(self, base_image=dict(self.platform_bases).get(platform, self.base_image),
                       platform_bases=())

    def check_platform_bases(self, platforms: Sequence[str]) -> None:
        """A --base-image PLATFORM=IMAGE for a platform that is not built would be ignored."""
        unused = [p for p, _ in self.platform_bases if p not in platforms]
        if unused:
            raise BadRequest(f"--base-image {unused[0]}=... is for {unused[0]}, which is not asked for "
                             f"(platforms: {', '.join(platforms)}); add --platform {','.join([*platforms, *unused])} "
                             "or drop it")

    def request(self, variant: str | None) -> Request:
        if self.torch is None or self.cuda is None:
            raise BadRequest("give --torch and --cuda")
        return Request(self.torch, self.cuda, self.python, variant, self.os, self.base_image, self.strict)

    @property
    def variants(self) -> list[str | None]:
        return list(VARIANTS) if self.variant == ALL else [self.variant]


# --------------------------------------------------------------------------- base image OS


class BaseImageOs(BadRequest):
    """The base image's OS and the request disagree, or the matrix knows no such OS."""


def parse_os_release(text: str) -> dict[str, str]:
    """/etc/os-release as a dict (shell-style quoting, comments and blank lines allowed)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            words = shlex.split(value)
        except ValueError:
            words = [value]
        fields[key] = words[0] if words else ""
    return fields


def os_of_release(matrix: Matrix, release: dict[str, str]) -> str | None:
    """The matrix OS an os-release describes (ID + VERSION_ID: debian 12 -> debian12)."""
    name = f"{release.get('ID', '')}{release.get('VERSION_ID', '')}"
    return name if name in matrix.oses else None


def settle_os(matrix: Matrix, selection: Selection, read_os_release: ReadOsRelease | None,
              note: Note) -> Selection:
    """With --base-image, the OS is the base image's: read it when a daemon can be asked (and
    infer --os from it, or refuse a --os that disagrees); otherwise say what is assumed."""
    base = selection.base_image
    if base is None:
        return selection
    if read_os_release is None:
        if selection.os is not None:
            return selection
        # One base image is one OS: the filters then select that OS's images, not every OS's.
        note(f"--base-image {base} is assumed to run {matrix.defaults.os} (not inspected: render asks no "
             "Docker daemon, and the other commands found none); pass --os if it runs another OS")
        return replace(selection, os=matrix.defaults.os)
    release = parse_os_release(read_os_release(base))
    pretty = release.get("PRETTY_NAME") or f"{release.get('ID', '?')} {release.get('VERSION_ID', '')}".strip()
    found = os_of_release(matrix, release)
    if found is None:
        raise BaseImageOs(f"--base-image {base} runs {pretty}, which matrix.yaml has no OS entry for; "
                          f"use a base image of one of: {', '.join(matrix.oses)}")
    if selection.os is not None and selection.os != found:
        raise BaseImageOs(f"--os {selection.os} but --base-image {base} runs {found} ({pretty}); "
                          f"drop --os or pass --os {found}")
    if selection.os is None:
        note(f"--os {found}: read from {base}'s /etc/os-release")
    return replace(selection, os=found)


# --------------------------------------------------------------------------- selection


def select_specs(matrix: Matrix, selection: Selection) -> list[BuildSpec]:
    """Every image the filters select, the base image override applied."""
    variant = None if selection.variant == ALL else selection.variant
    check_filters(matrix, selection.torch, selection.cuda, selection.python, selection.os, selection.strict)
    if selection.torch and selection.cuda:
        torch, cuda = find_torch(matrix, selection.torch), find_cuda(matrix, selection.cuda)
        if not any(wheel.cuda == cuda.key for wheel in torch.variants):
            return _resolve_each(matrix, replace(selection, variant=variant))
    return list(enumerate_matrix(matrix, selection.torch, selection.cuda, selection.python, variant,
                                 selection.os, base_image=selection.base_image))


def _resolve_each(matrix: Matrix, selection: Selection) -> list[BuildSpec]:
    """The images a request for this torch + CUDA makes, for each OS and variant the filters
    leave open; combinations that cannot be built are left out unless asked for exactly."""
    specs = []
    exact = selection.os is not None and selection.variant is not None
    for os_name in [selection.os] if selection.os else list(matrix.oses):
        for variant in [selection.variant] if selection.variant else list(VARIANTS):
            try:
                specs.append(resolve(matrix, replace(selection, os=os_name).request(variant)))
            except BadRequest:
                if exact:
                    raise
    return specs
