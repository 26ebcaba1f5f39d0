"""The planners of the commands that build and lock (and of render, which shows build's plan):
a Selection (selection.py) per platform -> rendered images in build order, every one checked
before anything builds; so the commands read the same request the same way, and the CLI only
parses options and prints what comes back. publish's planner is publish/planner.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from .build import (
    Exists, Reading, ReadOsState, RenderedImage, RenderOptions, RenderRequest, check_each_platform, check_for_any_os,
    each_platform, for_command, host_platform,
)
from .engine.api import BuilderKind
from .engine.export import Compression
from .engine.export_decision import decide_export
from .lock import DigestSource, LockSet, UvCompile, default_uv, parse_extras, pin_base
from .lock import command as locking
from .matrix import Matrix, Note, NothingSelected, ReadOsRelease, Selection, select_specs, settle_os
from .registry import RegistryTarget

# --------------------------------------------------------------------------- build


def requested(plan: Sequence[tuple[str, RenderedImage]]) -> RenderedImage:
    """The image a one-variant, one-platform request asked for: the last one built (a parent
    that comes along is built first)."""
    return plan[-1][1]


def needs_buildkit(platforms: Sequence[str], host: str | None = None) -> bool:
    """Another platform than the host's is built by BuildKit only."""
    return any(platform != (host or host_platform()) for platform in platforms)


BUILD_READING = Reading(request=True, notices=True)


def plan_build(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str],
               read_os_release: ReadOsRelease | None, exists: Exists, note: Note,
               read_os_state: ReadOsState | None = None) -> list[tuple[str, RenderedImage]]:
    """`build` (and `render`, which shows it): (platform, image) in build order, every
    platform's images resolved and checked (wheels for the platform; BuildKit for a foreign
    one; no --base-image PLATFORM=IMAGE for a platform not asked for) before anything builds."""
    per_platform = each_platform(matrix, selection, options, platforms, BUILD_READING,
                                 read_os_release=read_os_release, note=note, exists=exists,
                                 read_os_state=read_os_state)
    return [(each.platform, image) for each in per_platform for image in each.images]


def check_build(matrix: Matrix, selection: Selection, asked: RenderRequest, platforms: Sequence[str],
                kind: BuilderKind = "buildkit", compression: Compression | None = None,
                cache_from_registry: RegistryTarget | None = None) -> None:
    """What `plan_build` refuses without asking a daemon, checked before one is asked (issue 29):
    a wrong request (a --with against the pins, an unknown torch) is exit 2 with its own line,
    also where no daemon answers. `kind`: the builder as far as it is known before probing
    for one; BuildKit refuses nothing the classic builder takes, so what only the classic
    one refuses waits for the decided builder; the classic builder asked for refuses an export
    (--compression, --cache-from-registry) here. The export is decided from the request alone,
    and no image is rendered: each is only checked (per_platform.check_each_platform)."""
    decide_export(compression, command="build", buildkit=kind == "buildkit", image_store=None,
                  cache=cache_from_registry)
    options = for_command(matrix, asked, kind)
    check_for_any_os(matrix, selection, lambda chosen: check_each_platform(
        matrix, chosen, options, platforms, BUILD_READING))


# --------------------------------------------------------------------------- lock


def lock_selected(matrix: Matrix, selection: Selection, *, uv: str | None, extras: Sequence[str],
                  index_url: str | None, extra_index_urls: Sequence[str], progress: Note,
                  note: Note, registry: DigestSource, recorded: LockSet | None = None) -> locking.LockPlan:
    """`lock`: resolve every selected image's requirements (the PyPI builds unless --cuda asks
    for another), a line on `progress` per set as it is done (against `recorded`, for --check);
    base images pinned through the local engine (when one answers) or `registry`."""
    from .engine.docker import answering_engine

    engine = answering_engine()
    selection = settle_os(matrix, selection, engine.os_release if engine else None, note)
    specs = select_specs(matrix, selection)
    if selection.cuda is None:
        specs = locking.pypi_builds(specs)
    if not specs:
        raise NothingSelected()
    wanted = parse_extras((*matrix.extras, *extras))
    total, finished = len(locking.set_names(specs, wanted)), []

    def done(name: str, outcome: locking.Outcome) -> None:
        finished.append(name)
        progress(f"[{len(finished)}/{total}] {locking.outcome_line(name, outcome, recorded)}")

    with UvCompile(uv or default_uv()) as resolver:
        return locking.lock_images(specs, matrix, resolver=resolver,
                                   pin=lambda image: pin_base(image, engine, registry),
                                   extras=wanted, index_url=index_url, extra_index_urls=extra_index_urls,
                                   progress=done)
