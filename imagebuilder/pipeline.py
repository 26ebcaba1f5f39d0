"""Filters or a request -> resolved, rendered images: the one planner that render, build,
matrix, lock and publish share, so the commands read the same request the same way, and
the CLI only parses options and prints what comes back.

Two readings of the coordinates (torch, CUDA, Python, variant, OS):
- a *request* (`build`, `render`): one image per variant, defaults filled in;
- *filters* (`matrix`, `render --all`, `publish`): every matching image of the matrix, where
  a torch + CUDA pair the release has no exact wheels for selects the image a request for
  that pair builds (minor-version fallback), not nothing.
The base image override and the OS it implies apply to both.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .build import build_order
from .engine.api import BuilderKind
from .errors import BadRequest
from .matrix import VARIANTS, Matrix
from . import lock as locking
from .base_pin import pin_base
from .install_steps import SECRET_SOURCES
from .lockfile import LockSet, load_locks, locks_dir, parse_extras
from .output import write_tree
from .platforms import arch, for_platforms, host_platform, platform_image
from .http_registry import HttpRegistry
from .registry import Registry
from .render import RenderedImage, render
from .render_options import RenderOptions
from .resolve import BuildSpec, Request, check_filters, enumerate_matrix, find_cuda, find_torch, resolve
from .table import format_table
from .tags import primary_tag
from .uv_compile import UvCompile, default_uv

# publish (verify, signing) and engine.docker are imported inside the functions that use them:
# cli imports this module for every command, and `render` or `--help` need neither.
if TYPE_CHECKING:
    from . import publish
    from .publish import IndexRegistry
    from .signing import Signer

ALL = "all"  # --variant all: runtime, devel, then jupyter and devel-jupyter FROM those two

Note = Callable[[str], None]
ReadOsRelease = Callable[[str], str]  # image reference -> its /etc/os-release text
Exists = Callable[[str], bool]  # image reference -> whether the engine has it


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


def with_parents(images: list[RenderedImage], matrix: Matrix, options: RenderOptions,
                 exists: Callable[[str], bool] = lambda ref: False) -> list[RenderedImage]:
    """`images` plus, before each jupyter image, the runtime or devel image it is built FROM
    when that one is neither selected nor (per `exists`) already there."""
    refs = {image.ref for image in images}
    out: list[RenderedImage] = []
    for image in images:
        parent = image.spec.parent
        if parent is not None and image.depends_on not in refs and not exists(image.depends_on or ""):
            out.append(render(parent, matrix, options))
            refs.add(out[-1].ref)
        out.append(image)
    return out


def render_selected(matrix: Matrix, selection: Selection, options: RenderOptions) -> list[RenderedImage]:
    """Filters -> rendered images (matrix listing, render --all, publish)."""
    return [render(spec, matrix, options) for spec in select_specs(matrix, selection)]


def render_request(matrix: Matrix, selection: Selection, options: RenderOptions, note: Note,
                   exists: Callable[[str], bool] = lambda ref: False) -> list[RenderedImage]:
    """A request -> the images it builds, in build order: each variant asked for (`all`:
    every variant), and a jupyter image's parent image first when it is missing.
    Everything resolves before anything builds, so a bad request fails at once."""
    specs = [resolve(matrix, selection.request(variant)) for variant in selection.variants]
    images = [render(spec, matrix, options) for spec in specs]
    # The image's notices: the spec's, and what its lock and base pin leave unpinned.
    for notice in dict.fromkeys(n for image in images for n in image.notices):
        note(notice)
    return build_order(with_parents(images, matrix, options, exists))



# --------------------------------------------------------------------------- rendering options


@dataclass(frozen=True)
class Rendering:
    """How to render, whatever the image: where wheels come from, what CA to trust, the name."""

    index_url: str | None
    extra_index_urls: tuple[str, ...]
    ca_bundle: Path | None
    repository: str | None
    extras: tuple[str, ...] = ()  # --with: packages added to the image's lock
    python_mirror: str | None = None  # --python-mirror: where uv downloads a CPython the OS lacks


def source_label() -> str:
    """The image's source label (labels.SOURCE): the repository CI builds from."""
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    return f"{server}/{repo}" if server and repo else "imagebuilder"


def render_options(matrix: Matrix, rendering: Rendering, kind: BuilderKind,
                   repository: str | None = None, *, buildx: bool = True) -> RenderOptions:
    """The options every image of a command renders with, for the builder `kind` that
    engine.select decided (the same for a dry run as for the run); `buildx`: BuildKit through
    buildx, which takes named build contexts (the CA bundle's), not an old CLI's built-in one."""

    return RenderOptions(
        extras=rendering.extras,
        locks=load_locks(locks_dir(matrix)),
        repository=repository or rendering.repository or matrix.defaults.repository,
        index_url=rendering.index_url,
        extra_index_urls=rendering.extra_index_urls,
        ca_bundle=rendering.ca_bundle,
        python_mirror=rendering.python_mirror,
        source=source_label(),
        buildkit=kind == "buildkit",
        ca_context=kind == "buildkit" and buildx,
    )


# --------------------------------------------------------------------------- matrix, render --all


def matrix_rows(matrix: Matrix, selection: Selection) -> list[dict[str, Any]]:
    """`imagebuilder matrix`: one row per selected image."""

    return [{
        "torch": str(spec.torch.version),
        "cuda": str(spec.cuda.key),
        "wheel": spec.wheel.name,
        "cudnn": str(spec.wheel.cudnn),
        "nccl": str(spec.wheel.nccl),
        "python": str(spec.python),
        "os": spec.os.name,
        "variant": spec.variant,
        "min_driver": str(spec.min_driver),
        "tag": primary_tag(spec, matrix),
        "platforms": list(spec.torch.platforms),
    } for spec in select_specs(matrix, selection)]


def format_listing(rows: Sequence[dict[str, Any]], fmt: str) -> str:
    """`imagebuilder matrix --format table|json|github` of `matrix_rows`."""

    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "github":
        include = [{k: r[k] for k in ("torch", "cuda", "python", "os", "variant", "tag")} for r in rows]
        return json.dumps({"include": include}, separators=(",", ":"))
    if not rows:
        return "(no images match)"
    return format_table([h.upper() for h in rows[0]],
                        [[",".join(v) if isinstance(v, list) else v for v in r.values()] for r in rows])


Folder = tuple[str, str | None, RenderedImage]  # (folder, platform when several, image)


def index_document(entries: Sequence[Folder]) -> dict[str, Any]:
    """index.json beside several build contexts: each folder's image, in build order."""
    return {
        "images": [
            {"dir": folder, "ref": image.ref, "tags": list(image.tags), "depends_on": image.depends_on,
             "inputs_hash": image.inputs_hash, **({"platform": platform} if platform else {})}
            for folder, platform, image in entries
        ]
    }


def context_files(entries: Sequence[Folder]) -> dict[str, bytes]:
    """Several build contexts as one tree: a folder per image (Dockerfile and files) and index.json."""
    files: dict[str, bytes] = {}
    for folder, _, image in entries:
        files.update({f"{folder}/{name}": data for name, data in image.files.items()})
        files[f"{folder}/Dockerfile"] = image.dockerfile.encode()
    files["index.json"] = (json.dumps(index_document(entries), indent=2) + "\n").encode()
    return files


def render_tree(matrix: Matrix, selection: Selection, options: RenderOptions) -> tuple[int, dict[str, bytes]]:
    """`render --all`: every selected image's build context in a folder named for it, and an
    index.json of them all; (the number of images, the files by relative name)."""
    images = render_selected(matrix, selection, options)
    if not images:
        raise NothingSelected()
    return len(images), context_files([(image.spec.key, None, image) for image in images])


def plan_folders(plan: Sequence[tuple[str, RenderedImage]]) -> list[Folder]:
    """`render -o` of several images: a folder per planned image, named for it (and for its
    platform's arch when there are several platforms)."""
    several = len({platform for platform, _ in plan}) > 1
    return [(f"{image.spec.key}-{arch(platform)}" if several else image.spec.key, platform if several else None, image)
            for platform, image in plan]


def write_all(output: Path, count: int, files: Mapping[str, bytes]) -> list[str]:
    """`render --all -o`: every context into `output`; what was written and what went, a line
    each. A folder of an earlier render keeps only what this one asked for, and says so."""

    removed = {name.split("/", 1)[0] for name in write_tree(output, files) if "/" in name}
    return [f"wrote {count} images to {output}"] + (
        [f"removed the build contexts of {len(removed)} images an earlier render wrote there and this one did not "
         "ask for (filters choose the images: render --all without them writes every image)"] if removed else [])


def write_contexts(plan: Sequence[tuple[str, RenderedImage]], output: Path) -> list[str]:
    """`render -o`: one image's context into `output`, or several (a parent that comes along,
    several platforms) a folder each with index.json; what was written, a line each."""

    if len(plan) == 1:
        platform, image = plan[0]
        image.write(output)
        secrets = "".join(f" --secret id={name},src={SECRET_SOURCES.get(name, name.upper())}" for name in sorted(image.secrets))
        secrets += "".join(f" --build-context {name}={shlex.quote(str(output / name))}" for name in image.contexts)
        target = f" --platform {platform}" if platform != host_platform() else ""
        return [f"wrote {output}/Dockerfile for {image.ref}",
                f"build it: docker build{target} -t {image.ref}{secrets} {shlex.quote(str(output))}"]
    folders = plan_folders(plan)
    write_tree(output, context_files(folders))
    return [f"wrote {len(plan)} build contexts to {output}, in build order (index.json):",
            *(f"  {folder}/  {planned.ref}" for folder, _, planned in folders)]


def requested(plan: Sequence[tuple[str, RenderedImage]]) -> RenderedImage:
    """The image a one-variant, one-platform request asked for: the last one built (a parent
    that comes along is built first)."""
    return plan[-1][1]


def needs_buildkit(platforms: Sequence[str], host: str | None = None) -> bool:
    """Another platform than the host's is built by BuildKit only."""
    return any(platform != (host or host_platform()) for platform in platforms)


# --------------------------------------------------------------------------- build, publish


def plan_build(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str],
               kind: BuilderKind, read_os_release: ReadOsRelease | None, exists: Exists,
               note: Note) -> list[tuple[str, RenderedImage]]:
    """`build` (and `render`, which shows it): (platform, image) in build order, every
    platform's images resolved and checked (wheels for the platform; BuildKit for a foreign
    one; no --base-image PLATFORM=IMAGE for a platform not asked for) before anything builds."""

    selection.check_platform_bases(platforms)
    planned: list[tuple[str, RenderedImage]] = []
    for platform in platforms:
        chosen = settle_os(matrix, selection.for_platform(platform), read_os_release, note)
        own = _for_platform(options, platform)
        images = render_request(matrix, chosen, own, note, exists=exists)
        planned += [(platform, image) for image in
                    for_platforms(matrix, images, platform, buildkit=kind == "buildkit")]
    return planned


def check_build(matrix: Matrix, selection: Selection, rendering: Rendering, platforms: Sequence[str],
                kind: BuilderKind = "buildkit") -> None:
    """What `plan_build` refuses without asking a daemon, checked before one is asked (issue 29):
    a wrong request (a --with against the pins, an unknown torch) is exit 2 with its own line,
    also where no daemon answers. `kind`: the builder as far as it is known before probing
    for one; BuildKit refuses nothing the classic builder takes, so what only the classic
    one refuses waits for the decided builder."""
    options = render_options(matrix, rendering, kind)
    _check_for_any_os(matrix, selection, lambda chosen: plan_build(
        matrix, chosen, options, platforms, kind, None, lambda ref: False, lambda text: None))


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
                 multi: bool, kind: BuilderKind, read_os_release: ReadOsRelease | None, registry: Registry,
                 force: bool, day: date, merge_only: bool, note: Note, signing: bool = False) -> PublishPlan:
    """`publish`: the selected images (a jupyter image brings its runtime image along), per
    platform, each compared with what the registry holds (skip, retag or build; `signing`: an
    unsigned one is rebuilt)."""
    from . import publish

    # Without the run's engine (a dry run, --merge-only) the base image's OS is still read as
    # the run reads it, when a daemon answers: the plan is the run's.
    per_platform, index_platforms = publish_images(matrix, selection, options, platforms, multi=multi, kind=kind,
                                                   read_os_release=read_os_release or base_os_reader(selection),
                                                   merge_only=merge_only, note=note)
    plans: list[tuple[str, tuple[publish.Step, ...]]] = []
    for platform, images in [] if merge_only else per_platform:  # --merge-only builds nothing
        remotes = {} if force else publish.lookup(registry, images, day, signing=signing)
        plans.append((platform, publish.plan(images, remotes, force=force, day=day)))
    return PublishPlan(tuple(plans), index_platforms, multi)


def publish_images(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str], *,
                   multi: bool, kind: BuilderKind, read_os_release: ReadOsRelease | None, merge_only: bool,
                   note: Note) -> tuple[list[tuple[str, list[RenderedImage]]], dict[str, list[str]]]:
    """The images `publish` selects per platform, each checked for its platform (not with
    --merge-only: it builds nothing), and each plain ref -> the platforms its index joins.
    Asks no registry, and no daemon but through `read_os_release`."""
    selection.check_platform_bases(platforms)
    per_platform: list[tuple[str, list[RenderedImage]]] = []
    index_platforms: dict[str, list[str]] = {}
    for platform in platforms:
        chosen = settle_os(matrix, selection.for_platform(platform), read_os_release, note)
        own = _for_platform(options, platform)
        images = with_parents(render_selected(matrix, chosen, own), matrix, own)
        if not images:
            raise NothingSelected()
        if multi:
            # Filters, not a request: a release without CUDA wheels for this platform is left out.
            images = [image for image in images if platform in image.spec.torch.platforms]
            if not images:
                note(f"no selected release has CUDA wheels for {platform}; nothing to publish for it")
                continue
        for image in images:
            for ref in image.refs:
                index_platforms.setdefault(ref, []).append(platform)
        if not merge_only:
            checked = for_platforms(matrix, images, platform, buildkit=kind == "buildkit")
            images = [platform_image(image, platform) for image in images] if multi else checked
        per_platform.append((platform, images))
    return per_platform, index_platforms


def check_publish(matrix: Matrix, selection: Selection, options: RenderOptions, platforms: Sequence[str], *,
                  multi: bool, kind: BuilderKind, merge_only: bool) -> None:
    """What `plan_publish` refuses without asking a daemon or a registry, checked before either
    is asked (issue 29), as `check_build` does for `build`: `options` rendered for the builder
    as far as it is known before probing for one."""
    _check_for_any_os(matrix, selection, lambda chosen: publish_images(
        matrix, chosen, options, platforms, multi=multi, kind=kind, read_os_release=None, merge_only=merge_only,
        note=lambda text: None))


def _for_platform(options: RenderOptions, platform: str) -> RenderOptions:
    """Each platform builds from its own lock; a foreign one says so (its wheels install natively)."""
    return replace(options, locks=options.locks.for_platform(platform),
                   foreign_platform=None if platform == host_platform() else platform)


def base_os_reader(selection: Selection) -> ReadOsRelease | None:
    """How a command that builds nothing (matrix, a dry run, --merge-only) reads --base-image's
    OS: as the run does, through the daemon (pulling the image if it is not here), when one
    answers; None (the OS is then assumed) without a base image or a daemon."""
    from .engine.docker import answering_engine

    if selection.base_image is None and not selection.platform_bases:
        return None
    engine = answering_engine()
    return engine.os_release if engine else None


# --------------------------------------------------------------------------- lock


def lock_selected(matrix: Matrix, selection: Selection, *, uv: str | None, extras: Sequence[str],
                  index_url: str | None, extra_index_urls: Sequence[str], progress: Note,
                  note: Note, recorded: LockSet | None = None) -> locking.LockPlan:
    """`lock`: resolve every selected image's requirements (the PyPI builds unless --cuda asks
    for another), a line on `progress` per set as it is done (against `recorded`, for --check);
    base images pinned through the local engine (when one answers) or their registry."""
    from .engine.docker import answering_engine

    engine = answering_engine()
    selection = settle_os(matrix, selection, engine.os_release if engine else None, note)
    specs = select_specs(matrix, selection)
    if selection.cuda is None:
        specs = locking.pypi_builds(specs)
    if not specs:
        raise NothingSelected()
    registry = HttpRegistry(timeout=15)
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
