"""The planners of the commands that build, publish and lock (and of render, which shows
build's plan): a Selection (selection.py) per platform -> rendered images in build order, every
one checked before anything builds, and the options every image of a command renders with;
so the commands read the same request the same way, and the CLI only parses options and
prints what comes back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import date
from typing import TYPE_CHECKING

from .build import Exists, Reading, ReadOsState, RenderOptions, RenderedImage, each_platform, host_platform, never
from .engine.api import BuilderKind
from .engine.export import ZSTD_CHUNKED, Compression, check_asked, check_build_compression
from .errors import BadRequest
from .estargz.zstdchunked import check_available as check_libzstd
from .lock import DigestSource, LockSet, UvCompile, default_uv, load_locks, locks_dir, parse_extras, pin_base
from .lock import command as locking
from .matrix import Matrix, Note, NothingSelected, ReadOsRelease, Selection, select_specs, settle_os
from .registry import Registry

# publish (verify, signing) and engine.docker are imported inside the functions that use them:
# cli imports this module for every command, and `render` or `--help` need neither.
if TYPE_CHECKING:
    from . import publish
    from .engine.docker import DockerEngine
    from .publish import IndexRegistry
    from .trust import Signer


# --------------------------------------------------------------------------- rendering options


def source_label() -> str:
    """The image's source label (labels.SOURCE): the repository CI builds from."""
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    return f"{server}/{repo}" if server and repo else "imagebuilder"


def render_options(matrix: Matrix, asked: RenderOptions, kind: BuilderKind,
                   repository: str | None = None, *, buildx: bool = True) -> RenderOptions:
    """The options every image of a command renders with: what the command line asked
    (options.rendering), with the matrix's locks, for the builder `kind` that engine.select
    decided (the same for a dry run as for the run); `repository`: publish's, under its
    registry; `buildx`: BuildKit through buildx, which takes named build contexts (the CA
    bundle's), not an old CLI's built-in one."""

    return replace(asked, locks=load_locks(locks_dir(matrix)), repository=repository or asked.repository,
                   source=source_label(), buildkit=kind == "buildkit", ca_context=kind == "buildkit" and buildx)


# --------------------------------------------------------------------------- build, publish


def requested(plan: Sequence[tuple[str, RenderedImage]]) -> RenderedImage:
    """The image a one-variant, one-platform request asked for: the last one built (a parent
    that comes along is built first)."""
    return plan[-1][1]


def needs_buildkit(platforms: Sequence[str], host: str | None = None) -> bool:
    """Another platform than the host's is built by BuildKit only."""
    return any(platform != (host or host_platform()) for platform in platforms)


def plan_build(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str],
               read_os_release: ReadOsRelease | None, exists: Exists, note: Note,
               read_os_state: ReadOsState | None = None) -> list[tuple[str, RenderedImage]]:
    """`build` (and `render`, which shows it): (platform, image) in build order, every
    platform's images resolved and checked (wheels for the platform; BuildKit for a foreign
    one; no --base-image PLATFORM=IMAGE for a platform not asked for) before anything builds."""
    per_platform = each_platform(matrix, selection, options, platforms, Reading(request=True, notices=True),
                                 read_os_release=read_os_release, note=note, exists=exists,
                                 read_os_state=read_os_state)
    return [(each.platform, image) for each in per_platform for image in each.images]


def check_build(matrix: Matrix, selection: Selection, asked: RenderOptions, platforms: Sequence[str],
                kind: BuilderKind = "buildkit", compression: Compression | None = None,
                cache_from_registry: bool = False) -> None:
    """What `plan_build` refuses without asking a daemon, checked before one is asked (issue 29):
    a wrong request (a --with against the pins, an unknown torch) is exit 2 with its own line,
    also where no daemon answers. `kind`: the builder as far as it is known before probing
    for one; BuildKit refuses nothing the classic builder takes, so what only the classic
    one refuses waits for the decided builder; the classic builder asked for refuses an export
    (--compression, --cache-from-registry) here."""
    check_build_compression(compression)
    check_asked(compression, buildkit=kind == "buildkit", cache_from_registry=cache_from_registry)
    options = render_options(matrix, asked, kind)
    _check_for_any_os(matrix, selection, lambda chosen: plan_build(
        matrix, chosen, options, platforms, None, never, lambda text: None))


def _check_for_any_os(matrix: Matrix, selection: Selection, check: Callable[[Selection], object]) -> None:
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


@dataclass(frozen=True)
class PublishPlan:
    steps: tuple[tuple[str, tuple[publish.Step, ...]], ...]
    """Per platform, its steps (none with --merge-only)."""
    index_platforms: dict[str, list[str]]
    """Each plain ref -> the platforms its image index joins."""
    multi: bool
    """--platform given: each platform's images go under their own tags, then an index."""

    @property
    def planned(self) -> list[publish.Step]:
        return [step for _, steps in self.steps for step in steps]

    def indexes(self, registry: IndexRegistry, *, merge: bool, write: bool = False,
                signer: Signer | None = None) -> tuple[publish.IndexStep, ...] | tuple[publish.IndexOutcome, ...]:
        """The indexes planned over the platform images, those this plan pushes included (what
        a dry run shows; none without --platform or with --no-merge / --no-push); `write`
        (--merge-only) writes (and with `signer` signs) each one it can."""
        from . import publish

        if not (self.multi and merge):
            return ()
        steps = publish.plan_indexes(registry, self.index_platforms,
                                     pending={ref for step in self.planned for ref in step.writes})
        return publish.write_indexes(registry, steps, signer) if write else steps


def plan_publish(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str], *,
                 multi: bool, read_os_release: ReadOsRelease | None, registry: Registry,
                 force: bool, day: date, merge_only: bool, note: Note, signing: bool = False,
                 dual: bool = False, read_os_state: ReadOsState | None = None) -> PublishPlan:
    """`publish`: the selected images (a jupyter image brings its runtime image along), per
    platform, each compared with what the registry holds (skip, retag or build; `signing`: an
    unsigned one is rebuilt; `dual`: --compression gzip+zstd, each build pushes TAG-gzip too;
    `read_os_state`: the base images' OS, for the security fixes each image holds, so an image
    whose OS published a fix it lacks has new inputs and is rebuilt)."""
    from . import publish

    # Without the run's engine (a dry run, --merge-only) the base image's OS is still read as
    # the run reads it, when a daemon answers: the plan is the run's.
    per_platform, index_platforms = publish_images(matrix, selection, options, platforms, multi=multi,
                                                   read_os_release=read_os_release or base_os_reader(selection),
                                                   merge_only=merge_only, note=note, read_os_state=read_os_state)
    plans: list[tuple[str, tuple[publish.Step, ...]]] = []
    for platform, images in [] if merge_only else per_platform:  # --merge-only builds nothing
        remotes = {} if force else publish.lookup(registry, images, day, signing=signing)
        plans.append((platform, publish.plan(images, remotes, force=force, day=day, dual=dual)))
    return PublishPlan(tuple(plans), index_platforms, multi)


def publish_images(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str], *,
                   multi: bool, read_os_release: ReadOsRelease | None, merge_only: bool,
                   note: Note, read_os_state: ReadOsState | None = None) -> tuple[list[tuple[str, list[RenderedImage]]], dict[str, list[str]]]:
    """The images `publish` selects per platform, each checked for its platform (none with
    --merge-only: it builds nothing), and each plain ref -> the platforms its index joins.
    Asks no registry, and no daemon but through `read_os_release`."""
    reading = Reading(request=False, multi=multi, builds=not merge_only)
    per_platform = each_platform(matrix, selection, options, platforms, reading, read_os_release=read_os_release,
                                 note=note, read_os_state=None if merge_only else read_os_state)
    index_platforms: dict[str, list[str]] = {}
    for each in per_platform:
        for ref in each.plain_refs:
            index_platforms.setdefault(ref, []).append(each.platform)
    return [(each.platform, list(each.images)) for each in per_platform], index_platforms


def check_publish(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str], *,
                  multi: bool, merge_only: bool, compression: Compression | None = None) -> None:
    """What `plan_publish` refuses without asking a daemon or a registry, checked before either
    is asked (issue 29), as `check_build` does for `build`: `options` rendered for the builder
    as far as it is known before probing for one (--merge-only builds nothing, so exports nothing)."""
    if not merge_only:
        check_asked(compression, buildkit=options.buildkit)
        if compression is not None and compression.kind == ZSTD_CHUNKED:
            check_libzstd()
    _check_for_any_os(matrix, selection, lambda chosen: publish_images(
        matrix, chosen, options, platforms, multi=multi, read_os_release=None, merge_only=merge_only,
        note=lambda text: None))


def base_os_reader(selection: Selection) -> ReadOsRelease | None:
    """How a command that builds nothing (matrix, a dry run, --merge-only) reads --base-image's
    OS: as the run does, through the daemon (pulling the image if it is not here), when one
    answers; None (the OS is then assumed) without a base image or a daemon."""
    engine = base_reader(selection)
    return engine.os_release if engine else None


def base_reader(selection: Selection) -> DockerEngine | None:
    """The daemon that reads --base-image's files for a command that builds nothing, when one
    answers; None without a base image (the matrix's, not pulled for a plan) or a daemon."""
    from .engine.docker import answering_engine

    if selection.base_image is None and not selection.platform_bases:
        return None
    return answering_engine()


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
