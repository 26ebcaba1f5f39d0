"""The one loop over the platforms that build, publish and `render --all` share: per platform,
the selection settled (the base image's OS), its images chosen (a request or filters), a
jupyter image's parent added where it is missing, and each image planned (image_plan) and
rendered (render) once: a parent is rendered once per command and platform, whichever of its
children needs its inputs hash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

from .. import resources
from ..errors import BadRequest
from ..matrix.model import Matrix
from ..matrix.resolve import BuildSpec, resolve
from ..matrix.selection import NothingSelected, Note, ReadOsRelease, Selection, select_specs, settle_os
from ..scan.fixes import OsState
from .image_plan import check_image, image_tags, plain_tags, plan_image, repository_of
from .platforms import arch, host_platform
from .render import RenderedImage, render
from .render_options import RenderOptions, Target
from .tags import image_ref

if TYPE_CHECKING:
    from ..engine.docker import DockerEngine

Exists = Callable[[str], bool]  # image reference -> whether the engine has it
ReadOsState = Callable[[str, str], OsState]  # base image, Debian architecture -> its OS's state (scan.updates.OsStates)


def never(ref: str) -> bool:
    return False


def build_order(images: Iterable[RenderedImage]) -> list[RenderedImage]:
    """Runtime images before the jupyter images built FROM them; otherwise as given."""
    images = list(images)
    ours = {image.ref for image in images}
    first = [i for i in images if i.depends_on is None or i.depends_on not in ours]
    return first + [i for i in images if i not in first]


@dataclass
class Renderer:
    """A command's renders, each image once per options (so once per platform): keyed by value."""

    matrix: Matrix
    carried: Mapping[str, bytes] = field(default_factory=lambda: resources.carried_files())
    done: dict[tuple[str, str, RenderOptions], RenderedImage] = field(default_factory=dict)

    def image(self, spec: BuildSpec, options: RenderOptions) -> RenderedImage:
        key = (spec.key, spec.base_image, options)
        if key not in self.done:
            parent = self.image(spec.parent, options) if spec.parent is not None else None
            self.done[key] = render(plan_image(spec, self.matrix, options, self.carried, parent))
        return self.done[key]


def render_spec(spec: BuildSpec, matrix: Matrix, options: RenderOptions = RenderOptions()) -> RenderedImage:
    """One image (a jupyter image's parent rendered first, for its inputs hash)."""
    return Renderer(matrix).image(spec, options)


@dataclass(frozen=True)
class Reading:
    """How a command reads its selection on each platform."""

    request: bool  # build, render: one image per variant asked for; else filters (every match)
    parents: bool = True  # a jupyter image's parent comes along when it is not selected (nor there)
    notices: bool = False  # the requested images' notices go to `note`
    # publish --platform: every platform's images under their own tags, and a release without
    # CUDA wheels for a platform left out of it (filters, not a request).
    multi: bool = False
    # False (publish --merge-only, render --all): nothing is built here, so no platform is
    # foreign to this host and no release's wheels are checked (filters list what the matrix
    # has); the images are still planned, for the request's other refusals and their refs.
    builds: bool = True


@dataclass(frozen=True)
class PlatformImages:
    platform: str
    images: tuple[RenderedImage, ...]  # in build order
    plain_refs: tuple[str, ...]  # every image's refs without a platform's suffix: an index joins them


def platform_options(options: RenderOptions, platform: str, *, own_tags: bool = False, builds: bool = True,
                     host: str | None = None) -> RenderOptions:
    """The options for `platform`: its locks and its Target. Each platform builds from its own
    lock and, where it `builds`, is checked for its wheels; a foreign one says so (its wheels
    install natively) and goes under its own tags, as every platform does with `own_tags`
    (publish --platform)."""
    if not builds:  # its lock, and nothing else of the platform's: nothing is built for it
        return replace(options, locks=options.locks.for_platform(platform))
    foreign = platform != (host or host_platform())
    target = Target(platform, platform_tags=foreign or own_tags, foreign_platform=platform if foreign else None)
    return replace(options, locks=options.locks.for_platform(platform), target=target)


@dataclass(frozen=True)
class _Chosen:
    """One platform's images before any is rendered."""

    platform: str
    options: RenderOptions  # the platform's own (platform_options)
    specs: tuple[BuildSpec, ...]  # the images to make, a jupyter image's missing parent before it
    asked: frozenset[str]  # the keys selected (the parents that came along are not)
    plain_refs: tuple[str, ...]  # every image's refs without a platform's suffix


def _choose(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str],
            reading: Reading, *, read_os_release: ReadOsRelease | None, note: Note, exists: Exists,
            host: str | None) -> Iterator[_Chosen]:
    """Each platform's selection settled and its images chosen, in turn (a platform's refusal
    comes before the next platform is read)."""
    selection.check_platform_bases(platforms)
    for platform in platforms:
        chosen = settle_os(matrix, selection.for_platform(platform), read_os_release, note)
        own = platform_options(options, platform, own_tags=reading.multi, builds=reading.builds, host=host)
        if reading.request:
            specs = [resolve(matrix, chosen.request(variant)) for variant in chosen.variants]
        else:
            specs = select_specs(matrix, chosen)
            if not specs:
                raise NothingSelected()
        if reading.multi:
            specs = [spec for spec in specs if platform in spec.torch.platforms]
            if not specs:
                note(f"no selected release has CUDA wheels for {platform}; nothing to publish for it")
                continue
        asked = frozenset(spec.key for spec in specs)
        repository = repository_of(matrix, own)
        if reading.parents:
            specs = _with_parents(specs, partial(_ref, matrix, own), exists)
        refs = tuple(image_ref(repository, tag) for spec in specs for tag in plain_tags(spec, matrix, own))
        yield _Chosen(platform, own, tuple(specs), asked, refs)


def each_platform(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str],
                  reading: Reading, *, read_os_release: ReadOsRelease | None, note: Note,
                  exists: Exists = never, host: str | None = None,
                  read_os_state: ReadOsState | None = None) -> list[PlatformImages]:
    """Every platform's images, each platform's checked before the next is read: nothing is built
    until the whole list is back. `read_os_state`: each base image's OS on the platform, for the
    security fixes its images hold (None: none known, as `render` shows them)."""
    renderer, out = Renderer(matrix), []
    for chosen in _choose(matrix, selection, options, platforms, reading, read_os_release=read_os_release,
                          note=note, exists=exists, host=host):
        own, specs = chosen.options, chosen.specs
        if read_os_state is not None:
            # A jupyter image's parent is rendered for its inputs hash, built here or not.
            bases = dict.fromkeys((spec.parent or spec).base_image for spec in specs)
            states = {base: read_os_state(base, arch(chosen.platform)) for base in bases}
            own = replace(own, target=replace(own.target, os_states=states))
        images = [renderer.image(spec, own) for spec in specs]
        if reading.notices:  # the requested images': what their lock and base pin leave unpinned
            for notice in dict.fromkeys(n for image in images if image.spec.key in chosen.asked for n in image.notices):
                note(notice)
        out.append(PlatformImages(chosen.platform, tuple(build_order(images) if reading.request else images),
                                  chosen.plain_refs))
    return out


def check_each_platform(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str],
                        reading: Reading, *, host: str | None = None) -> None:
    """What `each_platform` refuses (with no daemon to ask and no notes), without rendering an
    image: the checks before any daemon is asked. A jupyter image's parent is checked before it,
    as it is rendered before it."""
    for chosen in _choose(matrix, selection, options, platforms, reading, read_os_release=None,
                          note=lambda text: None, exists=never, host=host):
        checked: set[tuple[str, str]] = set()
        for spec in chosen.specs:
            for each in (spec.parent, spec) if spec.parent is not None else (spec,):
                if (each.key, each.base_image) not in checked:
                    check_image(each, matrix, chosen.options)
                    checked.add((each.key, each.base_image))


def _ref(matrix: Matrix, options: RenderOptions, spec: BuildSpec) -> str:
    """The image's ref as rendered with `options` (its first tag's)."""
    return image_ref(repository_of(matrix, options), image_tags(spec, matrix, options)[0])


def _with_parents(specs: list[BuildSpec], ref: Callable[[BuildSpec], str], exists: Exists) -> list[BuildSpec]:
    """`specs` plus, before each jupyter image, the runtime or devel image it is built FROM when
    that one is neither selected nor (per `exists`) already there."""
    refs = {ref(spec) for spec in specs}
    out: list[BuildSpec] = []
    for spec in specs:
        parent = spec.parent
        if parent is not None and ref(parent) not in refs and not exists(ref(parent)):
            out.append(parent)
            refs.add(ref(parent))
        out.append(spec)
    return out


def check_for_any_os(matrix: Matrix, selection: Selection, check: Callable[[Selection], object]) -> None:
    """`check` (a command's plan, made with no daemon to ask and printing no notes: the run's
    own plan prints them) the selection. A --base-image's OS is read from the image later, so
    without --os any OS of the matrix that the request passes for will do here; else its refusal."""
    base_given = selection.base_image is not None or bool(selection.platform_bases)
    oses = list(matrix.oses) if base_given and selection.os is None else [selection.os]
    refusal: BadRequest | None = None
    for os_name in oses:
        try:
            check(replace(selection, os=os_name))
            return
        except BadRequest as e:
            refusal = refusal or e
    assert refusal is not None
    raise refusal


def base_os_reader(selection: Selection) -> ReadOsRelease | None:
    """How a command that builds nothing (matrix, a dry run, --merge-only) reads --base-image's
    OS: as the run does, through the daemon (pulling the image if it is not here), when one
    answers; None (the OS is then assumed) without a base image or a daemon."""
    engine = base_reader(selection)
    return engine.os_release if engine else None


def base_reader(selection: Selection) -> DockerEngine | None:
    """The daemon that reads --base-image's files for a command that builds nothing, when one
    answers; None without a base image (the matrix's, not pulled for a plan) or a daemon."""
    # Imported here: the docker SDK loads only for a --base-image, not for every render.
    from ..engine.docker import answering_engine

    if selection.base_image is None and not selection.platform_bases:
        return None
    return answering_engine()
