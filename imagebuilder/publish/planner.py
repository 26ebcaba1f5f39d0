"""`publish`'s planner: the selected images per platform, each compared with what the registry
holds (plan.py's steps), the indexes over the platforms, and what it refuses before a daemon or
registry is asked (`check_publish`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from ..build.per_platform import (Reading, ReadOsState, base_os_reader, check_each_platform, check_for_any_os,
                                  each_platform)
from ..build.render import RenderedImage
from ..build.render_options import RenderOptions
from ..engine.export import ZSTD_CHUNKED, Compression
from ..engine.export_decision import decide_export
from ..estargz.zstdchunked import check_available as check_libzstd
from ..matrix.model import Matrix
from ..matrix.selection import Note, ReadOsRelease, Selection
from ..registry.api import Registry
from ..trust.signing import Signer
from .indexes import IndexOutcome, IndexRegistry, IndexStep, plan_indexes, write_indexes
from .lookup import lookup
from .plan import Step, plan


@dataclass(frozen=True)
class PublishPlan:
    steps: tuple[tuple[str, tuple[Step, ...]], ...]
    """Per platform, its steps (none with --merge-only)."""
    index_platforms: dict[str, list[str]]
    """Each plain ref -> the platforms its image index joins."""
    multi: bool
    """--platform given: each platform's images go under their own tags, then an index."""

    @property
    def planned(self) -> list[Step]:
        return [step for _, steps in self.steps for step in steps]

    def indexes(self, registry: IndexRegistry, *, merge: bool, write: bool = False,
                signer: Signer | None = None) -> tuple[IndexStep, ...] | tuple[IndexOutcome, ...]:
        """The indexes planned over the platform images, those this plan pushes included (what
        a dry run shows; none without --platform or with --no-merge / --no-push); `write`
        (--merge-only) writes (and with `signer` signs) each one it can."""
        if not (self.multi and merge):
            return ()
        steps = plan_indexes(registry, self.index_platforms, pending={ref for step in self.planned for ref in step.writes})
        return write_indexes(registry, steps, signer) if write else steps


def plan_publish(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str], *,
                 multi: bool, read_os_release: ReadOsRelease | None, registry: Registry,
                 force: bool, day: date, merge_only: bool, note: Note, signing: bool = False,
                 dual: bool = False, read_os_state: ReadOsState | None = None) -> PublishPlan:
    """`publish`: the selected images (a jupyter image brings its runtime image along), per
    platform, each compared with what the registry holds (skip, retag or build; `signing`: an
    unsigned one is rebuilt; `dual`: --compression gzip+zstd, each build pushes TAG-gzip too;
    `read_os_state`: the base images' OS, for the security fixes each image holds, so an image
    whose OS published a fix it lacks has new inputs and is rebuilt)."""
    # Without the run's engine (a dry run, --merge-only) the base image's OS is still read as
    # the run reads it, when a daemon answers: the plan is the run's.
    per_platform, index_platforms = publish_images(matrix, selection, options, platforms, multi=multi,
                                                   read_os_release=read_os_release or base_os_reader(selection),
                                                   merge_only=merge_only, note=note, read_os_state=read_os_state)
    plans: list[tuple[str, tuple[Step, ...]]] = []
    for platform, images in [] if merge_only else per_platform:  # --merge-only builds nothing
        remotes = {} if force else lookup(registry, images, day, signing=signing)
        plans.append((platform, plan(images, remotes, force=force, day=day, dual=dual)))
    return PublishPlan(tuple(plans), index_platforms, multi)


def publish_images(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str], *,
                   multi: bool, read_os_release: ReadOsRelease | None, merge_only: bool,
                   note: Note, read_os_state: ReadOsState | None = None
                   ) -> tuple[list[tuple[str, list[RenderedImage]]], dict[str, list[str]]]:
    """The images `publish` selects per platform, each checked for its platform (none with
    --merge-only: it builds nothing), and each plain ref -> the platforms its index joins.
    Asks no registry, and no daemon but through `read_os_release`."""
    per_platform = each_platform(matrix, selection, options, platforms, _reading(multi=multi, merge_only=merge_only),
                                 read_os_release=read_os_release,
                                 note=note, read_os_state=None if merge_only else read_os_state)
    index_platforms: dict[str, list[str]] = {}
    for each in per_platform:
        for ref in each.plain_refs:
            index_platforms.setdefault(ref, []).append(each.platform)
    return [(each.platform, list(each.images)) for each in per_platform], index_platforms


def check_publish(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str], *,
                  multi: bool, merge_only: bool, compression: Compression | None = None) -> None:
    """What `plan_publish` refuses without asking a daemon or a registry, checked before either
    is asked (issue 29), as pipeline's `check_build` does for `build`: `options` made for the
    builder as far as it is known before probing for one (--merge-only builds nothing, so exports
    nothing). The export is decided from the request alone, and no image is rendered: each is only
    checked (per_platform.check_each_platform)."""
    if not merge_only:
        decide_export(compression, command="publish", buildkit=options.buildkit, image_store=None)
        if compression is not None and compression.kind == ZSTD_CHUNKED:
            check_libzstd()
    check_for_any_os(matrix, selection, lambda chosen: check_each_platform(
        matrix, chosen, options, platforms, _reading(multi=multi, merge_only=merge_only)))


def _reading(*, multi: bool, merge_only: bool) -> Reading:
    return Reading(request=False, multi=multi, builds=not merge_only)
