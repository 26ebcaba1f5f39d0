"""The imagebuilder command line: parse, call one pipeline function, map errors to exit codes.

Exit codes: 0 success, 1 a failure, 2 a bad request (unknown version, bad flag), 130 Ctrl-C.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from . import __version__, options
from .errors import ImageBuilderError
from .matrix import JUPYTER_PARENTS, VARIANTS, Matrix, load_matrix
from .render import RenderedImage, RenderOptions, render, write_tree
from .resolve import BuildSpec, Request, enumerate_matrix, resolve
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


def render_options(matrix: Matrix, kw: dict[str, Any]) -> RenderOptions:
    return RenderOptions(
        repository=kw.get("repository") or matrix.defaults.repository,
        index_url=kw.get("index_url"),
        extra_index_urls=tuple(kw.get("extra_index_urls") or ()),
        ca_bundle=kw.get("ca_bundle"),
        source=_source_label(),
    )


def request_from(kw: dict[str, Any], variant: str | None = None) -> Request:
    return Request(
        torch=kw["torch_version"],
        cuda=kw["cuda_version"],
        python=kw.get("python_version"),
        variant=variant or kw.get("variant"),
        os=kw.get("os_name"),
        base_image=kw.get("base_image"),
        strict=bool(kw.get("strict")),
    )


def resolve_and_render(ctx: Context, kw: dict[str, Any], variant: str | None = None) -> RenderedImage:
    spec = resolve(ctx.matrix, request_from(kw, variant))
    for notice in spec.notices:
        note(notice)
    return render(spec, ctx.matrix, render_options(ctx.matrix, kw))


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
def matrix(click_ctx: click.Context, ctx: Context, fmt: str, **kw: Any) -> None:
    """List the images the matrix describes, optionally filtered.

    \b
    Examples:
      imagebuilder matrix --torch 2.6 --variant runtime
      imagebuilder matrix --format github > matrix.json
      imagebuilder matrix check --online
    """
    if click_ctx.invoked_subcommand is not None:
        return
    specs = enumerate_matrix(ctx.matrix, kw["torch_version"], kw["cuda_version"], kw["python_version"],
                             kw["variant"], kw["os_name"])
    rows = [_row(spec, ctx) for spec in specs]
    if fmt == "table":
        click.echo(_table(rows))
    elif fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        include = [{k: r[k] for k in ("torch", "cuda", "python", "os", "variant", "tag")} for r in rows]
        click.echo(json.dumps({"include": include}, separators=(",", ":")))


@matrix.command("check")
@click.option("--online", is_flag=True,
              help="Also compare the pins with the package index's metadata of each release's PyPI build.")
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
            raise ImageBuilderError(f"{len(drifts)} pins differ from the index; update {m.path}")
        click.echo("online: every pin matches the index")


# --- render ---------------------------------------------------------------------------------


def _render_all(ctx: Context, kw: dict[str, Any]) -> list[RenderedImage]:
    opts = render_options(ctx.matrix, kw)
    specs = enumerate_matrix(ctx.matrix, kw["torch_version"], kw["cuda_version"], kw["python_version"],
                             kw["variant"], kw["os_name"])
    return [render(spec, ctx.matrix, opts) for spec in specs]


def index_document(images: Iterable[RenderedImage]) -> dict[str, Any]:
    return {
        "images": [
            {"dir": image.spec.key, "ref": image.ref, "tags": list(image.tags),
             "depends_on": image.depends_on, "inputs_hash": image.inputs_hash}
            for image in images
        ]
    }


@cli.command("render")
@options.selection(required=False)
@options.strict
@options.rendering
@click.option("--all", "render_all", is_flag=True,
              help="Render every image of the matrix (filters apply), one folder per image.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Folder to write the build context(s) to.")
@click.option("--dry-run", is_flag=True, help="Print the Dockerfile instead of writing files.")
@pass_context
def render_cmd(ctx: Context, render_all: bool, output: Path | None, dry_run: bool, **kw: Any) -> None:
    """Render Dockerfiles and their build contexts.

    \b
    Examples:
      imagebuilder render --torch 2.6 --cuda 12.1 --dry-run
      imagebuilder render --torch 2.6 --cuda 12.4 --variant devel -o build/devel
      imagebuilder render --all -o build/all
    """
    if not dry_run and output is None:
        raise click.UsageError("give -o DIR to write the build context, or --dry-run to print the Dockerfile")
    if render_all:
        if dry_run:
            raise click.UsageError("--dry-run prints one Dockerfile; use it without --all")
        images = _render_all(ctx, kw)
        files: dict[str, bytes] = {}
        for image in images:
            files.update({f"{image.spec.key}/{name}": data for name, data in image.files.items()})
            files[f"{image.spec.key}/Dockerfile"] = image.dockerfile.encode()
        files["index.json"] = (json.dumps(index_document(images), indent=2) + "\n").encode()
        assert output is not None
        write_tree(output, files)
        click.echo(f"wrote {len(images)} images to {output}")
        return
    if not kw["torch_version"] or not kw["cuda_version"]:
        raise click.UsageError("give --torch and --cuda (or --all)")
    image = resolve_and_render(ctx, kw)
    if dry_run:
        click.echo(image.dockerfile, nl=False)
        return
    assert output is not None
    image.write(output)
    click.echo(f"wrote {output}/Dockerfile for {image.ref}")


# --- build ----------------------------------------------------------------------------------


def _variants(variant: str | None) -> list[str | None]:
    return list(VARIANTS) if variant == "all" else [variant]


def build_plan(ctx: Context, kw: dict[str, Any], engine: Any) -> list[RenderedImage]:
    """Everything to build, in order. All of it is resolved before anything is built, so a
    bad request fails before an hour of building. A jupyter image needs its runtime (or
    devel) image: it is built first when it is not there yet."""
    from .build import build_order

    images = [resolve_and_render(ctx, kw, variant) for variant in _variants(kw.get("variant"))]
    refs = {image.ref for image in images}
    for image in list(images):
        if image.depends_on and image.depends_on not in refs and not engine.image_exists(image.depends_on):
            images.insert(images.index(image), resolve_and_render(ctx, kw, JUPYTER_PARENTS[image.spec.variant]))
            refs.add(image.depends_on)
    return build_order(images)


@cli.command("build")
@options.selection(required=True, all_variants=True)
@options.strict
@options.rendering
@options.building
@options.report
@pass_context
def build_cmd(ctx: Context, quiet: bool, no_cache: bool, pull: bool, report: Path | None, **kw: Any) -> None:
    """Render, build and tag images with the Docker Engine.

    \b
    Examples:
      imagebuilder build --torch 2.6 --cuda 12.1
      imagebuilder build --torch 2.6 --cuda 12.4 --variant all --ca-bundle "$SSL_CERT_FILE"
      imagebuilder build --torch 2.6 --cuda 12.4 --base-image mirror.local/ubuntu:22.04 --report build.json
    """
    from .build import ProgressPrinter, build_image, human_size
    from .engine import DockerEngine

    engine = DockerEngine()
    engine.ping()
    plan = build_plan(ctx, kw, engine)
    done = []
    try:
        for n, image in enumerate(plan, 1):
            if not quiet:
                click.echo(f"building {image.ref} ({n}/{len(plan)})", err=True)
            printer = ProgressPrinter(image.spec.variant, stream=click.get_text_stream("stderr"))
            try:
                built = build_image(engine, image, matrix_path=ctx.matrix_path, nocache=no_cache, pull=pull,
                                    on_progress=None if quiet else printer)
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
            write_json(report, {"ok": len(done) == len(plan), "images": [b.to_json() for b in done],
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
              help="Run this imagebuilder's smoke tests in the image, not the image's own copy "
                   "(images imagebuilder did not build).")
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
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.format())
    report.raise_if_failed()


# --- publish --------------------------------------------------------------------------------


def _publish_images(ctx: Context, kw: dict[str, Any], repository: str) -> list[RenderedImage]:
    """Every image the filters select, rendered for the registry; a selected jupyter image
    brings its runtime image along (publish decides whether that one needs building)."""
    from dataclasses import replace

    opts = replace(render_options(ctx.matrix, kw), repository=repository)
    specs = enumerate_matrix(ctx.matrix, kw["torch_version"], kw["cuda_version"], kw["python_version"],
                             kw["variant"], kw["os_name"])
    images: list[RenderedImage] = []
    for spec in specs:
        # enumerate_matrix resolves without --base-image; resolve each again with it.
        spec = resolve(ctx.matrix, Request(str(spec.torch.version), str(spec.cuda.key), kw["python_version"],
                                           spec.variant, spec.os.name, base_image=kw.get("base_image")))
        images.append(render(spec, ctx.matrix, opts))
    refs = {image.ref for image in images}
    for image in list(images):
        if image.depends_on and image.depends_on not in refs and image.spec.parent is not None:
            images.append(render(image.spec.parent, ctx.matrix, opts))
            refs.add(image.depends_on)
    return images


@cli.command("publish")
@options.selection(required=False)
@options.rendering
@options.building
@options.allow_no_gpu
@options.report
@click.option("--registry", "registry_name", required=True, metavar="HOST[:PORT]/NAMESPACE",
              help="Where the images go: HOST[:PORT]/NAMESPACE/REPOSITORY:TAG. http for loopback "
                   "registries, https elsewhere; credentials from `docker login`.")
@click.option("--push/--no-push", default=True, show_default=True,
              help="--no-push builds and verifies what the plan says, and pushes nothing.")
@click.option("--dry-run", is_flag=True, help="Print the plan (after asking the registry) and stop.")
@click.option("--keep-going", is_flag=True, help="Continue past a failed image (its jupyter image fails too).")
@click.option("--force", is_flag=True, help="Rebuild, verify and push even images the registry has unchanged.")
@click.option("--verify-timeout", type=click.FloatRange(min=1), default=1800, show_default=True, metavar="S",
              help="Seconds the smoke tests of one image may take.")
@pass_context
def publish_cmd(ctx: Context, registry_name: str, push: bool, dry_run: bool, keep_going: bool, force: bool,
                allow_no_gpu: bool, verify_timeout: float, quiet: bool, no_cache: bool, pull: bool,
                report: Path | None, **kw: Any) -> None:
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
    from .registry import HttpRegistry, parse_registry

    host, namespace = parse_registry(registry_name)
    base = "/".join(part for part in (host, namespace) if part)
    images = _publish_images(ctx, kw, f"{base}/{kw.get('repository') or ctx.matrix.defaults.repository}")
    if not images:
        raise click.UsageError("no image of the matrix matches these filters; see `imagebuilder matrix`")
    registry = HttpRegistry()
    remotes = {} if force else publish.lookup(registry, images)
    steps = publish.plan(images, remotes, force=force)
    click.echo(publish.format_plan(steps))
    if dry_run:
        return
    from .engine import DockerEngine, Progress

    engine = DockerEngine()
    engine.ping()
    run_options = publish.RunOptions(matrix_path=ctx.matrix_path, push=push, keep_going=keep_going,
                                     allow_no_gpu=allow_no_gpu, verify_timeout=verify_timeout,
                                     nocache=no_cache, pull=pull)
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
    try:
        for outcome in publish.publish(steps, engine=engine, registry=registry, options=run_options,
                                       on_event=on_event, on_progress=on_progress):
            if printer is not None:
                printer.close()
                printer = None
            outcomes.append(outcome)
            click.echo(f"{outcome.status} {outcome.step.image.ref}: {outcome.reason}", err=True)
    finally:
        if outcomes:
            click.echo(publish.format_summary(outcomes))
        if report is not None:
            write_json(report, {"ok": len(outcomes) == len(steps) and not any(o.failed for o in outcomes),
                                "registry": base, "push": push,
                                "images": [o.to_json() for o in outcomes],
                                "planned": [{"ref": s.image.ref, "action": s.action, "reason": s.reason}
                                            for s in steps]})
    publish.raise_if_failed(outcomes)


def main() -> None:
    cli(prog_name="imagebuilder")
