"""The imagebuilder command line: parse, call one pipeline function, map errors to exit codes.

Exit codes: 0 success, 1 a failure, 2 a bad request (unknown version, bad flag), 130 Ctrl-C.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from . import __version__, options, pipeline
from .errors import ImageBuilderError
from .matrix import Matrix, load_matrix
from .options import Rendering
from .pipeline import Selection
from .render import RenderedImage, RenderOptions
from .resolve import BuildSpec, enumerate_matrix
from .resources import default_matrix_path


class Context:
    def __init__(self, matrix_path: Path) -> None:
        self.matrix_path = matrix_path
        self._matrix: Matrix | None = None

    @property
    def matrix(self) -> Matrix:
        if self._matrix is None:
            self._matrix = load_matrix(self.matrix_path)
        return self._matrix


pass_context = click.make_pass_decorator(Context)


def note(message: str) -> None:
    click.echo(f"note: {message}", err=True)


def _source_label() -> str:
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    return f"{server}/{repo}" if server and repo else "imagebuilder"


def render_options(matrix: Matrix, rendering: Rendering, repository: str | None = None,
                   buildkit: bool = False) -> RenderOptions:
    from .lock import load_locks, locks_dir

    return RenderOptions(
        extras=rendering.extras,
        locks=load_locks(locks_dir(matrix)),
        repository=repository or rendering.repository or matrix.defaults.repository,
        index_url=rendering.index_url,
        extra_index_urls=rendering.extra_index_urls,
        ca_bundle=rendering.ca_bundle,
        source=_source_label(),
        buildkit=buildkit,
    )


class UserError(click.ClickException):
    """An ImageBuilderError shown as one `error:` line with its own exit code."""

    def __init__(self, error: ImageBuilderError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_code
        self.details = error.details()

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)
        for line in self.details:
            click.echo(line, err=True)


class Group(click.Group):
    """The one place that maps errors to exit codes, for every (sub)command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ImageBuilderError as e:
            raise UserError(e) from e
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            raise click.exceptions.Exit(130) from None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--matrix", "matrix_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="PATH", help="The matrix to use. Default: the packaged matrix.yaml.")
@click.version_option(__version__, prog_name="imagebuilder")
@click.pass_context
def cli(click_ctx: click.Context, matrix_path: Path | None) -> None:
    """Build, verify and publish PyTorch GPU images from a compatibility matrix.

    \b
    Examples:
      imagebuilder matrix --torch 2.6
      imagebuilder render --torch 2.6 --cuda 12.1 --dry-run
      imagebuilder build --torch 2.6 --cuda 12.1
      imagebuilder verify pytorch:2.6.0-cuda12.4-cudnn9-runtime
      imagebuilder publish --torch 2.6 --registry registry.example.com/ml
    """
    click_ctx.obj = Context(matrix_path or default_matrix_path())


# --- matrix ---------------------------------------------------------------------------------


def _row(spec: BuildSpec, ctx: Context) -> dict[str, Any]:
    from .tags import primary_tag

    return {
        "torch": str(spec.torch.version),
        "cuda": str(spec.cuda.key),
        "wheel": spec.wheel.name,
        "cudnn": str(spec.wheel.cudnn),
        "nccl": str(spec.wheel.nccl),
        "python": str(spec.python),
        "os": spec.os.name,
        "variant": spec.variant,
        "min_driver": str(spec.min_driver),
        "tag": primary_tag(spec, ctx.matrix),
        "platforms": list(spec.torch.platforms),
    }


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no images match)"
    headers = list(rows[0])
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in headers]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(str(r[h]).ljust(w) for h, w in zip(headers, widths)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


@cli.group(cls=Group, invoke_without_command=True)
@options.selection(required=False)
@click.option("--format", "fmt", type=click.Choice(["table", "json", "github"]), default="table",
              show_default=True, help="github: a strategy.matrix for GitHub Actions ({\"include\": [...]}).")
@pass_context
@click.pass_context
def matrix(click_ctx: click.Context, ctx: Context, fmt: str, selection: Selection) -> None:
    """List the images the matrix describes, optionally filtered.

    A --torch and --cuda pair lists the image(s) `build` makes for it, also where the
    release has no wheels of exactly that CUDA.

    \b
    Examples:
      imagebuilder matrix --torch 2.6 --variant runtime
      imagebuilder matrix --torch 2.6 --cuda 12.1
      imagebuilder matrix --format github > matrix.json
      imagebuilder matrix check --online
    """
    if click_ctx.invoked_subcommand is not None:
        return
    selection = pipeline.settle_os(ctx.matrix, selection, _base_os_reader(selection), note)
    rows = [_row(spec, ctx) for spec in pipeline.select_specs(ctx.matrix, selection)]
    if fmt == "table":
        click.echo(_table(rows))
    elif fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        include = [{k: r[k] for k in ("torch", "cuda", "python", "os", "variant", "tag")} for r in rows]
        click.echo(json.dumps({"include": include}, separators=(",", ":")))


@matrix.command("check")
@click.option("--online", is_flag=True,
              help="Also compare pins, Pythons and platforms with the index's wheels, and list releases it lacks.")
@pass_context
def matrix_check(ctx: Context, online: bool) -> None:
    """Validate matrix.yaml (offline); with --online, report drift from the index."""
    m = ctx.matrix
    images = sum(1 for _ in enumerate_matrix(m))
    click.echo(f"{m.path}: ok: {len(m.torches)} torch releases, {len(m.cudas)} CUDA versions, "
               f"{len(m.oses)} OSes, {images} images")
    if online:
        from .drift import check_drift

        drifts = check_drift(m, progress=lambda msg: click.echo(msg, err=True))
        for line in drifts:
            click.echo(f"drift: {line}")
        if drifts:
            raise ImageBuilderError(f"{len(drifts)} differences from the index; update {m.path}")
        click.echo("online: pins, Pythons, platforms and releases match the index")


@matrix.command("add")
@click.option("--torch", "torch_version", metavar="X.Y.Z", help="The release to add, e.g. 2.15.0.")
@click.option("--new", is_flag=True, help="Add every release of a minor the index has and the matrix lacks.")
@click.option("--cuda-variant", "cuda_variants", multiple=True, metavar="cuXY",
              help="Also read this variant from PyTorch's own index (needs that index). Repeatable.")
@click.option("--dry-run", is_flag=True, help="Print the block instead of writing it.")
@pass_context
def matrix_add(ctx: Context, torch_version: str | None, new: bool, cuda_variants: tuple[str, ...], dry_run: bool) -> None:
    """Write a torch release's block into the matrix from the index's wheel metadata.

    Comments and order of the file stay; what the metadata does not say is left for you, and
    `imagebuilder matrix check` names it.
    """
    from packaging.version import InvalidVersion, Version

    from .matrix_add import add_release, new_releases

    if bool(torch_version) == new:
        raise click.UsageError("give either --torch X.Y.Z or --new")
    if torch_version:
        try:
            versions = [Version(torch_version)]
        except InvalidVersion as e:
            raise click.BadParameter(f"not a version: {torch_version!r}", param_hint="--torch") from e
        if len(versions[0].release) != 3:
            raise click.BadParameter("give the full release, e.g. 2.15.0", param_hint="--torch")
    else:
        versions = new_releases(ctx.matrix)
        if not versions:
            click.echo(f"{ctx.matrix_path}: the index has no release the matrix lacks")
    for version in versions:
        block, todo = add_release(load_matrix(ctx.matrix_path), version, cuda_variants, dry_run)
        click.echo(block if dry_run else f"{ctx.matrix_path}: added torch {version}")
        for line in todo:
            note(f"left for you: {line}")


# --- lock -----------------------------------------------------------------------------------


@cli.command("lock")
@options.selection(required=False)
@click.option("--index-url", metavar="URL", help="Package index to resolve from, replacing the default one.")
@click.option("--extra-index-url", "extra_index_urls", multiple=True, metavar="URL", help="Additional package index.")
@options.with_extras
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 naming each package (or base image) the index now offers newer.")
@click.option("--uv", "uv_path", metavar="PATH",
              help="The uv to resolve with. Default: the one beside this Python, else PATH.")
@pass_context
def lock_cmd(ctx: Context, check: bool, uv_path: str | None, index_url: str | None,
             extra_index_urls: tuple[str, ...], extras: tuple[str, ...], selection: Selection) -> None:
    """Resolve each selected image's complete dependency set, with hashes, into locks/.

    Filters select images as `imagebuilder matrix` lists them. Images sharing a set of
    requirements share a lock; a set the index cannot satisfy is reported and the others
    are locked. Base images are pinned by digest through the local engine or their registry.

    \b
    Examples:
      imagebuilder lock --torch 2.6 --cuda 12.4
      imagebuilder lock --torch 2.6 --cuda 12.4 --with 'pandas==2.2.3' --with tqdm
      imagebuilder lock --check
    """
    from . import lock as locking
    from .registry import HttpRegistry

    m = ctx.matrix
    engine = _engine_or_none()
    selection = pipeline.settle_os(m, selection, engine.os_release if engine else None, note)
    specs = pipeline.select_specs(m, selection)
    if not specs:
        raise click.UsageError("no image of the matrix matches these filters; see `imagebuilder matrix`")
    registry = HttpRegistry(timeout=15)
    plan = locking.lock_images(specs, m, resolver=locking.uv_compile(uv_path or _find_uv()),
                               pin=lambda image: locking.pin_base(image, engine, registry),
                               extras=locking.parse_extras((*m.extras, *extras)), index_url=index_url,
                               extra_index_urls=extra_index_urls, progress=lambda msg: click.echo(msg, err=True))
    for image in plan.unpinned:
        note(f"base image {image}: neither the engine nor its registry gave a digest; it stays FROM by tag")
    for failure in plan.failed:
        click.echo(f"error: {failure}", err=True)
    directory = locking.locks_dir(m)
    if check:
        lines = locking.check(plan, locking.load_locks(directory))
        for line in lines:
            click.echo(f"drift: {line}")
        if lines:
            raise ImageBuilderError(f"{len(lines)} locked pins differ from what the index offers; "
                                    "refresh with `imagebuilder lock` (same filters)")
        click.echo(f"{len(plan.locks)} locks match the index")
    else:
        for path in locking.write_locks(directory, plan.locks, plan.bases):
            click.echo(f"wrote {path}")
    if plan.failed:
        raise ImageBuilderError(f"{len(plan.failed)} of {len(plan.failed) + len(plan.locks)} locks could not be "
                                "resolved (above); the others are " + ("checked" if check else "written"))


def _find_uv() -> str:
    import shutil

    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else (shutil.which("uv") or "uv")


def _base_os_reader(selection: Selection) -> pipeline.ReadOsRelease | None:
    """How a command that builds nothing reads a --base-image's OS: as the run does, through
    the daemon, when one answers."""
    if selection.base_image is None and not selection.platform_bases:
        return None
    engine = _engine_or_none()
    return engine.os_release if engine else None


def _engine_or_none() -> Any:
    """The local engine, to pin local base images; none when no daemon answers."""
    from .engine import DockerEngine
    from .engine_errors import DaemonUnavailable

    try:
        engine = DockerEngine()
        engine.ping()
        return engine
    except DaemonUnavailable:
        return None


# --- render ---------------------------------------------------------------------------------


def index_document(images: Iterable[RenderedImage]) -> dict[str, Any]:
    return {
        "images": [
            {"dir": image.spec.key, "ref": image.ref, "tags": list(image.tags),
             "depends_on": image.depends_on, "inputs_hash": image.inputs_hash}
            for image in images
        ]
    }


@cli.command("render")
@options.selection(required=False, strict=True)
@options.rendering
@click.option("--all", "render_all", is_flag=True,
              help="Render every image of the matrix (filters apply), one folder per image.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Folder to write the build context(s) to: a new or empty folder, or one imagebuilder "
                   "wrote (only the files it wrote there are replaced).")
@click.option("--dry-run", is_flag=True, help="Print the Dockerfile instead of writing files.")
@pass_context
def render_cmd(ctx: Context, render_all: bool, output: Path | None, dry_run: bool, selection: Selection,
               rendering: Rendering) -> None:
    """Render Dockerfiles and their build contexts.

    \b
    Examples:
      imagebuilder render --torch 2.6 --cuda 12.1 --dry-run
      imagebuilder render --torch 2.6 --cuda 12.4 --variant devel -o build/devel
      imagebuilder render --all -o build/all
    """
    if not dry_run and output is None:
        raise click.UsageError("give -o DIR to write the build context, or --dry-run to print the Dockerfile")
    if render_all and dry_run:
        raise click.UsageError("--dry-run prints one Dockerfile; use it without --all")
    if not render_all and (not selection.torch or not selection.cuda):
        raise click.UsageError("give --torch and --cuda (or --all)")
    from .output import write_tree

    selection = pipeline.settle_os(ctx.matrix, selection, None, note)
    opts = render_options(ctx.matrix, rendering)
    if render_all:
        images = pipeline.render_selected(ctx.matrix, selection, opts)
        if not images:
            raise click.UsageError("no image of the matrix matches these filters; see `imagebuilder matrix`")
        files: dict[str, bytes] = {}
        for image in images:
            files.update({f"{image.spec.key}/{name}": data for name, data in image.files.items()})
            files[f"{image.spec.key}/Dockerfile"] = image.dockerfile.encode()
        files["index.json"] = (json.dumps(index_document(images), indent=2) + "\n").encode()
        assert output is not None
        write_tree(output, files)
        click.echo(f"wrote {len(images)} images to {output}")
        return
    (image,) = pipeline.render_request(ctx.matrix, selection, opts, note)
    if dry_run:
        click.echo(image.dockerfile, nl=False)
        return
    assert output is not None
    image.write(output)
    click.echo(f"wrote {output}/Dockerfile for {image.ref}")


# --- build ----------------------------------------------------------------------------------


@cli.command("build")
@options.selection(required=True, all_variants=True, strict=True)
@options.rendering
@options.building
@options.builders
@options.platforms
@options.report
@pass_context
def build_cmd(ctx: Context, quiet: bool, no_cache: bool, pull: bool, report: Path | None, selection: Selection,
              rendering: Rendering, builder_choice: str, buildx_builder: str | None, platforms: str | None) -> None:
    """Render, build and tag images with the Docker Engine.

    \b
    Examples:
      imagebuilder build --torch 2.6 --cuda 12.1
      imagebuilder build --torch 2.6 --cuda 12.4 --variant all --ca-bundle "$SSL_CERT_FILE"
      imagebuilder build --torch 2.6 --cuda 12.4 --base-image mirror.local/ubuntu:22.04 --report build.json
    """
    from .build import ProgressPrinter, build_image, human_size
    from .builder import select_builder
    from .engine import DockerEngine
    from .platforms import for_platforms, parse_platforms

    wanted = parse_platforms(platforms)
    engine = DockerEngine()
    engine.ping()
    builder = select_builder(builder_choice, engine, buildx_builder)
    if not quiet:
        click.echo(f"builder: {builder.describe()}", err=True)
    opts = render_options(ctx.matrix, rendering, buildkit=builder.name == "buildkit")
    platform_plan = []
    for platform in wanted:
        chosen = pipeline.settle_os(ctx.matrix, selection.for_platform(platform), engine.os_release, note)
        images = pipeline.render_request(ctx.matrix, chosen, opts, note, exists=engine.image_exists)
        platform_plan += [(platform, image) for image in
                          for_platforms(ctx.matrix, images, platform, buildkit=builder.name == "buildkit")]
    plan = [image for _, image in platform_plan]
    done = []
    try:
        for n, (platform, image) in enumerate(platform_plan, 1):
            if not quiet:
                click.echo(f"building {image.ref} ({n}/{len(plan)})", err=True)
            printer = ProgressPrinter(image.spec.variant, stream=click.get_text_stream("stderr"))
            try:
                built = build_image(engine, image, matrix_path=ctx.matrix_path, nocache=no_cache, pull=pull,
                                    on_progress=None if quiet else printer, builder=builder, platform=platform)
            finally:
                printer.close()
            done.append(built)
            r = built.result
            if quiet:
                click.echo(built.refs[0])
                continue
            click.echo(f"built {built.refs[0]}")
            click.echo(f"  image  {r.image_id} ({human_size(r.size)})")
            click.echo(f"  time   {r.seconds:.1f}s, {r.cached_steps}/{r.steps} steps cached")
            click.echo(f"  tags   {', '.join(built.refs[1:])}")
            click.echo(f"  log    {r.log_path}")
    finally:
        if report is not None:
            write_json(report, {"ok": len(done) == len(plan),
                                "images": [{**b.to_json(), "platform": platform}
                                           for b, (platform, _) in zip(done, platform_plan)],
                                "planned": [i.ref for i in plan]})


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write a JSON report atomically: a reader never sees half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, path)


# --- verify ---------------------------------------------------------------------------------


@cli.command("verify")
@click.argument("tag", required=False)
@click.option("--local", is_flag=True,
              help="Check this Python environment instead of an image (bare-metal hosts, pods).")
@options.allow_no_gpu
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@click.option("--timeout", type=click.FloatRange(min=1), default=1800, show_default=True, metavar="S",
              help="Seconds the smoke tests may take in all; the container is killed and removed after.")
@click.option("--manifest", type=click.Path(exists=True, dir_okay=False), metavar="PATH",
              help="With --local: the manifest.json whose versions to expect. Default: none.")
@click.option("--mount-smoke-tests", is_flag=True,
              help="Run this imagebuilder's smoke tests in the image even when it has its own copy "
                   "(an image an older imagebuilder built). Images without imagebuilder's labels "
                   "get them anyway.")
def verify_cmd(tag: str | None, local: bool, allow_no_gpu: bool, as_json: bool, timeout: float,
               manifest: str | None, mount_smoke_tests: bool) -> None:
    """Will PyTorch jobs in this image work on this machine? Preflight the host, run the smoke tests.

    Exit 0 only when every check passed.

    \b
    Examples:
      imagebuilder verify pytorch:2.6.0-cuda12.4-cudnn9-runtime
      imagebuilder verify pytorch:2.6.0-cuda12.4-cudnn9-runtime --allow-no-gpu --json
      imagebuilder verify --local --timeout 600
    """
    from .verify import verify_image, verify_local

    if local:
        if mount_smoke_tests:
            raise click.UsageError("--mount-smoke-tests is for images; --local runs the shipped smoke tests")
        report = verify_local(allow_no_gpu=allow_no_gpu, timeout=timeout, manifest=manifest,
                              target=f"local {tag}" if tag else None)
    else:
        if tag is None:
            raise click.UsageError("give the image TAG to verify, or --local for this environment")
        if manifest is not None:
            raise click.UsageError("--manifest is for --local; an image carries its own manifest")
        from .engine import DockerEngine

        report = verify_image(DockerEngine(), tag, allow_no_gpu=allow_no_gpu, timeout=timeout,
                              mount_smoke_tests=mount_smoke_tests)
    for notice in report.notices:
        click.echo(notice, err=True)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.format())
    report.raise_if_failed()


# --- publish --------------------------------------------------------------------------------


@cli.command("publish")
@options.selection(required=False)
@options.rendering
@options.building
@options.allow_no_gpu
@options.builders
@options.platforms
@options.report
@click.option("--registry", "registry_name", required=True, metavar="HOST[:PORT]/NAMESPACE",
              help="Where the images go: HOST[:PORT]/NAMESPACE/REPOSITORY:TAG. https as dockerd uses it "
                   "(http for a loopback registry without TLS); credentials as docker finds them.")
@click.option("--registry-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="PATH",
              help="CA certificate of the registry's TLS, for imagebuilder's own registry reads. Default: "
                   "/etc/docker/certs.d/HOST/ca.crt where dockerd has one, else the system's CAs.")
@click.option("--push/--no-push", default=True, show_default=True,
              help="--no-push builds and verifies what the plan says, and pushes nothing.")
@click.option("--dry-run", is_flag=True, help="Print the plan (after asking the registry) and stop.")
@click.option("--keep-going", is_flag=True, help="Continue past a failed image (its jupyter image fails too).")
@click.option("--force", is_flag=True, help="Rebuild, verify and push even images the registry has unchanged.")
@click.option("--merge/--no-merge", default=True, show_default=True,
              help="With --platform: once every platform's images are pushed (TAG-amd64, TAG-arm64), "
                   "make each TAG an image index over them. --no-merge for runners that publish one "
                   "platform each; a --merge-only job writes the indexes after them.")
@click.option("--merge-only", is_flag=True,
              help="Build nothing: make each TAG an index over the --platform images already pushed.")
@click.option("--verify-timeout", type=click.FloatRange(min=1), default=1800, show_default=True, metavar="S",
              help="Seconds the smoke tests of one image may take.")
@click.option("--date", "day", type=click.DateTime(["%Y-%m-%d"]), default=None, metavar="YYYY-MM-DD",
              help="The day of the immutable dated tags ({qualified}-{YYYYMMDD}). Default: today (UTC).")
@pass_context
def publish_cmd(ctx: Context, registry_name: str, push: bool, dry_run: bool, keep_going: bool, force: bool,
                allow_no_gpu: bool, verify_timeout: float, day: datetime | None, quiet: bool, no_cache: bool, pull: bool,
                report: Path | None, registry_ca: Path | None, selection: Selection, rendering: Rendering,
                builder_choice: str, buildx_builder: str | None, platforms: str | None, merge: bool,
                merge_only: bool) -> None:
    """Plan, build, verify and push many images; skip those the registry has from the same inputs.

    Filters select images as `imagebuilder matrix` lists them. Images go to
    REGISTRY/REPOSITORY:TAG with every tag; an image is pushed only after its smoke tests
    passed, and counted as pushed only once the registry answers with its digest.
    Exit 1 when any image failed.

    \b
    Examples:
      imagebuilder publish --torch 2.6 --registry ghcr.io/acme --dry-run
      imagebuilder publish --torch 2.6 --cuda 12.4 --registry 127.0.0.1:5000/ml --allow-no-gpu
      imagebuilder publish --registry ghcr.io/acme --keep-going --report publish.json
    """
    from . import publish
    from .build import ProgressPrinter
    from .platforms import for_platforms, host_platform, parse_platforms, platform_image
    from .registry import HttpRegistry, parse_registry

    host, namespace = parse_registry(registry_name)
    base = "/".join(part for part in (host, namespace) if part)
    # With --platform, each platform's images go under their own tags (TAG-arm64), planned,
    # skipped and pushed per platform; then every TAG becomes an index over them.
    multi = platforms is not None
    wanted = parse_platforms(platforms)
    engine = builder = None
    if not dry_run and not merge_only:
        from .builder import select_builder
        from .engine import DockerEngine

        engine = DockerEngine()
        engine.ping()
        builder = select_builder(builder_choice, engine, buildx_builder)
        if not quiet:
            click.echo(f"builder: {builder.describe()}", err=True)
    opts = render_options(ctx.matrix, rendering, f"{base}/{rendering.repository or ctx.matrix.defaults.repository}",
                          buildkit=builder is not None and builder.name == "buildkit")
    registry = HttpRegistry(ca_file=registry_ca)
    today = day.date() if day is not None else datetime.now(timezone.utc).date()
    plans: list[tuple[str, tuple[publish.Step, ...]]] = []
    index_platforms: dict[str, list[str]] = {}  # plain ref -> the platforms its index joins
    for platform in wanted:
        chosen = pipeline.settle_os(ctx.matrix, selection.for_platform(platform),
                                    engine.os_release if engine else _base_os_reader(selection), note)
        # A selected jupyter image brings its runtime image along (publish decides whether that
        # one needs building).
        images = pipeline.with_parents(pipeline.render_selected(ctx.matrix, chosen, opts), ctx.matrix, opts)
        if not images:
            raise click.UsageError("no image of the matrix matches these filters; see `imagebuilder matrix`")
        if multi:
            # Filters, not a request: a release without CUDA wheels for this platform is left out.
            images = [image for image in images if platform in image.spec.torch.platforms]
            if not images:
                note(f"no selected release has CUDA wheels for {platform}; nothing to publish for it")
                continue
        for image in images:
            for ref in image.refs:
                index_platforms.setdefault(ref, []).append(platform)
        checked = for_platforms(ctx.matrix, images, platform, buildkit=builder is None or builder.name == "buildkit")
        images = [platform_image(image, platform) for image in images] if multi else checked
        if merge_only:
            continue
        steps = publish.plan(images, {} if force else publish.lookup(registry, images, today), force=force, day=today)
        click.echo((f"{platform}:\n" if multi else "") + publish.format_plan(steps))
        plans.append((platform, steps))
    planned = [step for _, steps in plans for step in steps]
    if merge_only:
        if not multi:
            raise click.UsageError("--merge-only needs --platform: the platforms each index joins")
        index_plan = publish.plan_indexes(registry, index_platforms)
        if dry_run:
            click.echo(publish.format_index_plan(index_plan))
            if report is not None:
                write_json(report, publish.report(registry=base, push=push, dry_run=True, planned=[],
                                                  indexes=index_plan))
            return
        merged = publish.write_indexes(registry, index_plan)
        click.echo(publish.format_index_outcomes(merged))
        if report is not None:
            write_json(report, publish.report(registry=base, push=push, dry_run=False, planned=[], indexes=merged))
        publish.raise_if_unmerged(merged)
        return
    if engine is None:
        # The dry run: the indexes the run writes once its pushes are done.
        index_plan = ()
        if multi and merge and push:
            index_plan = publish.plan_indexes(registry, index_platforms,
                                              pending={ref for step in planned for ref in step.writes})
            click.echo(publish.format_index_plan(index_plan))
        if report is not None:
            write_json(report, publish.report(registry=base, push=push, dry_run=True, planned=planned,
                                              indexes=index_plan))
        return
    from .engine import Progress

    printer: ProgressPrinter | None = None

    def on_event(phase: str, step: publish.Step) -> None:
        nonlocal printer
        if printer is not None:
            printer.close()
            printer = None
        click.echo(f"{phase} {step.image.ref}", err=True)
        if phase == publish.BUILD and not quiet:
            printer = ProgressPrinter(step.image.spec.variant, stream=click.get_text_stream("stderr"))

    def on_progress(progress: Progress) -> None:
        if printer is not None:
            printer(progress)

    outcomes: list[publish.Outcome] = []
    merged: tuple[publish.IndexOutcome, ...] = ()
    try:
        for platform, steps in plans:
            run_options = publish.RunOptions(matrix_path=ctx.matrix_path, push=push, keep_going=keep_going,
                                             allow_no_gpu=allow_no_gpu, verify_timeout=verify_timeout,
                                             nocache=no_cache, pull=pull, builder=builder,
                                             platform=platform if multi else None,
                                             verify=platform == host_platform())
            for outcome in publish.publish(steps, engine=engine, registry=registry, options=run_options,
                                           on_event=on_event, on_progress=on_progress):
                if printer is not None:
                    printer.close()
                    printer = None
                outcomes.append(outcome)
                click.echo(f"{outcome.status} {outcome.step.image.ref}: {outcome.reason}", err=True)
        if multi and merge and push and outcomes and not any(o.failed for o in outcomes):
            merged = publish.write_indexes(registry, publish.plan_indexes(registry, index_platforms))
            click.echo(publish.format_index_outcomes(merged), err=True)
    finally:
        if outcomes:
            click.echo(publish.format_summary(outcomes))
        if report is not None:
            write_json(report, publish.report(registry=base, push=push, dry_run=False, planned=planned,
                                              outcomes=outcomes, indexes=merged))
    publish.raise_if_failed(outcomes)
    publish.raise_if_unmerged(merged)


def main() -> None:
    cli(prog_name="imagebuilder")
