"""The imagebuilder command line: parse, call one pipeline function (the `matrix` commands are in
matrix_commands.py, `project` in project_command.py, `verify` in verify_command.py, `squashfs` and
`squashfs-release` in squashfs_commands.py, the shared options in options.py; context.py's Group
maps errors to exit codes).

Exit codes: 0 success, 1 a failure, 2 a bad request (unknown version, bad flag), 130 Ctrl-C.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import click

from .. import __version__, interrupts, pipeline

from . import options
from ..build import RenderRequest, contexts, for_command
from .context import Context, Group, note, pass_context, progress
from .matrix_commands import matrix
from .project_command import project
from .squashfs_commands import squashfs, squashfs_release
from .verify_command import verify
from ..engine.export import Compression
from ..errors import BadRequest
from ..matrix import Selection, matrix_file
from ..registry import RegistryTarget, RetryPolicy

# Each command imports its machinery (engine, registry, build, verify, publish) in its body:
# `--help`, `render` and `matrix` start without loading what only `build` or `publish` run.


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--matrix", "matrix_path", default=None, metavar="PATH",
              help="The matrix to use. Default: the packaged matrix.yaml.")
@click.version_option(__version__, prog_name="imagebuilder")
@click.pass_context
def cli(click_ctx: click.Context, matrix_path: str | None) -> None:
    """Build, verify and publish PyTorch GPU images from a compatibility matrix.

    \b
    Examples:
      imagebuilder matrix --torch 2.6
      imagebuilder render --torch 2.6 --cuda 12.1 --dry-run
      imagebuilder build --torch 2.6 --cuda 12.1
      imagebuilder verify pytorch:2.6.0-cuda12.4-cudnn9-runtime
      imagebuilder publish --torch 2.6 --registry registry.example.com/ml
    """
    click_ctx.obj = Context(matrix_file(matrix_path))


cli.add_command(matrix)
cli.add_command(project)
cli.add_command(squashfs)
cli.add_command(verify)
cli.add_command(squashfs_release)


# --- lock -----------------------------------------------------------------------------------


@cli.command("lock")
@options.selection(required=False)
@options.index_urls
@options.with_extras
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 naming each package (or base image) the index now offers newer.")
@click.option("--uv", "uv_path", metavar="PATH", callback=options.uv_program,
              help="The uv to resolve with. Default: the one beside this Python, else PATH.")
@options.registry_timeout
@pass_context
def lock_cmd(ctx: Context, check: bool, uv_path: str | None, index_url: str | None,
             extra_index_urls: tuple[str, ...], extras: tuple[str, ...], selection: Selection,
             registry_policy: RetryPolicy) -> None:
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
    from ..lock import check_or_write, load_locks, locks_dir
    from ..registry.client import HttpRegistry

    plan = pipeline.lock_selected(ctx.matrix, selection, uv=uv_path, extras=extras, index_url=index_url,
                                  extra_index_urls=extra_index_urls, progress=progress, note=note,
                                  registry=HttpRegistry(policy=registry_policy),
                                  recorded=load_locks(locks_dir(ctx.matrix)) if check else None)
    check_or_write(plan, locks_dir(ctx.matrix), check_only=check, echo=click.echo, note=note, err=progress)


# --- render ---------------------------------------------------------------------------------


@cli.command("render")
@options.selection(required=False, strict=True)
@options.rendering
@options.render_builder
@options.platforms
@click.option("--all", "render_all", is_flag=True,
              help="Render every image of the matrix (filters apply), one folder per image.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              callback=options.output_folder,
              help="Folder to write the build context(s) to: a new or empty folder, or one imagebuilder "
                   "wrote (only the files it wrote there are replaced).")
@click.option("--dry-run", is_flag=True, help="Print the Dockerfile instead of writing files.")
@pass_context
def render_cmd(ctx: Context, render_all: bool, output: Path | None, dry_run: bool, selection: Selection,
               rendering: RenderRequest, builder_choice: str | None, platforms: str | None) -> None:
    """Render Dockerfiles and their build contexts.

    -o writes what `build` builds: one image's context into DIR, or, when the request builds
    several (a jupyter image and the runtime or devel image it is built FROM; several
    platforms), a folder per image and index.json listing them in build order.

    \b
    Examples:
      imagebuilder render --torch 2.6 --cuda 12.1 --dry-run
      imagebuilder render --torch 2.6 --cuda 12.4 --variant devel -o build/devel
      imagebuilder render --torch 2.6 --cuda 12.4 --variant jupyter -o build/jupyter
      imagebuilder render --torch 2.13 --cuda 13.0 --platform linux/arm64 --dry-run
      imagebuilder render --all -o build/all
    """
    if dry_run == (output is not None):
        raise BadRequest("give -o DIR to write the build context, or --dry-run to print the Dockerfile (not both)")
    if render_all and dry_run:
        raise click.UsageError("--dry-run prints one Dockerfile; use it without --all")
    if not render_all and (not selection.torch or not selection.cuda):
        raise click.UsageError("give --torch and --cuda (or --all)")
    if render_all and (platforms or selection.platform_bases):
        raise click.UsageError("--platform and --base-image PLATFORM=IMAGE are for one request (--torch, --cuda), "
                               "not --all")
    from ..build import parse_platforms
    from ..engine.select import decide_for_render

    wanted = parse_platforms(platforms)
    if dry_run and len(wanted) > 1:
        raise click.UsageError("--dry-run prints one Dockerfile; give one --platform (or -o DIR for several)")
    kind = decide_for_render(builder_choice, pipeline.needs_buildkit(wanted)).kind
    opts = for_command(ctx.matrix, rendering, kind)
    if render_all:
        count, files = contexts.render_tree(ctx.matrix, selection, opts, note)
        assert output is not None
        for line in contexts.write_all(output, count, files):
            click.echo(line)
        return
    plan = pipeline.plan_build(ctx.matrix, selection, opts, wanted, None, lambda ref: False, note)
    image = pipeline.requested(plan)
    if dry_run:
        click.echo(image.dockerfile, nl=False)
        if len(plan) > 1:
            note(f"{image.ref} is built FROM {image.depends_on}; -o DIR writes both build contexts")
        return
    assert output is not None
    for line in contexts.write_contexts(plan, output):
        click.echo(line)


# --- build ----------------------------------------------------------------------------------


@cli.command("build")
@options.selection(required=True, all_variants=True, strict=True)
@options.rendering
@options.building
@options.builders
@options.platforms
@options.report
@options.build_only
@options.compression
@pass_context
def build_cmd(ctx: Context, quiet: bool, no_cache: bool, pull: bool, report: Path | None, selection: Selection,
              rendering: RenderRequest, builder_choice: str, buildx_builder: str | None, platforms: str | None,
              dry_run: bool, compression: Compression | None, cache_from_registry: RegistryTarget | None,
              registry_policy: RetryPolicy) -> None:
    """Render, build and tag images with the Docker Engine.

    \b
    Examples:
      imagebuilder build --torch 2.6 --cuda 12.1
      imagebuilder build --torch 2.6 --cuda 12.4 --variant all --ca-bundle "$SSL_CERT_FILE"
      imagebuilder build --torch 2.6 --cuda 12.4 --base-image mirror.local/ubuntu:22.04 --report build.json
    """
    from ..build import build_all, parse_platforms, report_plan
    from ..engine.docker import DockerEngine
    from ..engine.export_decision import decide_export
    from ..engine.select import decide, kind_before_probing, make_builder
    from ..registry.client import HttpRegistry
    from ..scan import HttpMirror, OsStates, cached

    wanted = parse_platforms(platforms)
    # A wrong request is refused before any daemon is asked (deciding the builder may probe one).
    pipeline.check_build(ctx.matrix, selection, rendering, wanted, kind_before_probing(builder_choice), compression,
                         cache_from_registry)
    decision = decide(builder_choice, buildx_builder)
    engine = DockerEngine()
    engine.ping()
    builder = make_builder(decision, engine)
    registry = HttpRegistry(policy=registry_policy)
    buildkit = decision.kind == "buildkit"
    exported = decide_export(compression, command="build", buildkit=buildkit, cache=cache_from_registry,
                             image_store=buildkit and engine.keeps_compressed_layers())
    if not quiet:
        click.echo(f"builder: {builder.describe()}", err=True)
    opts = for_command(ctx.matrix, rendering, decision.kind, buildx=decision.buildx)
    # The security fixes each image holds: its base's packages against the OS's security suite;
    # a dry run reads them only from a --base-image, as publish's does (the matrix's may need a pull).
    os_states: OsStates | None = OsStates(engine, cached(HttpMirror(progress).get), opts.security_mirror, progress)
    if dry_run and selection.base_image is None and not selection.platform_bases:
        os_states = None
        note("the dry run's inputs hashes leave out the security fixes the images would hold: the run reads "
             "them from the base images (a dry run only from a --base-image)")
    plan = pipeline.plan_build(ctx.matrix, selection, opts, wanted, engine.os_release,
                               engine.image_exists, note, os_states)
    if dry_run:
        return report_plan(plan, report=report, echo=click.echo)
    build_all(plan, engine=engine, builder=builder, matrix_path=ctx.matrix_path, nocache=no_cache, pull=pull,
              quiet=quiet, exports=lambda key: exported.for_image(key, lambda ref: registry.digest(ref) is not None),
              gzip_too=exported.gzip_too, report=report, echo=click.echo, err=progress)


# --- scan -----------------------------------------------------------------------------------


@cli.command("scan")
@click.argument("image")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--allowlist", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="YAML list of accepted vulnerabilities: id (CVE or OSV id), reason, expires (YYYY-MM-DD).")
@options.security_mirror("--mirror")
@click.option("--osv", type=click.Path(path_type=Path), metavar="FILE",
              help="OSV records (a zip such as PyPI's all.zip, or a folder of JSON) to check the image's "
                   "Python packages (its SBOM) against.")
def scan_cmd(image: str, as_json: bool, allowlist: Path | None, mirror: str | None, osv: Path | None) -> None:
    """Which packages of IMAGE (a local Debian or Ubuntu image) have a fix it lacks?

    Each package with a newer version in the OS's security suite, with the CVE ids the fixed
    package's changelog names since the installed version. Exit 1 when a finding is not
    allowlisted, 0 when none, 2 when the image cannot be scanned (docs/scan.md).

    \b
    Examples:
      imagebuilder scan pytorch:2.6.0-cuda12.4-cudnn9-runtime
      imagebuilder scan pytorch:2.6.0-cuda12.4-cudnn9-runtime --allowlist allowlist.yaml --json
      imagebuilder scan pytorch:2.6.0-cuda12.4-cudnn9-runtime --osv all.zip
    """
    from ..engine.docker import DockerEngine
    from ..scan import HttpMirror, ScanRequest, load_allowlist, scan_image

    request = ScanRequest(image, load_allowlist(allowlist), mirror=mirror, osv=osv)
    report = scan_image(request, DockerEngine(), HttpMirror(progress).get, progress)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.format())
    report.raise_if_vulnerable()


# --- publish --------------------------------------------------------------------------------


@cli.command("publish")
@options.selection(required=False)
@options.rendering
@options.building
@options.allow_no_gpu
@options.builders
@options.platforms
@options.report
@options.publishing
@options.compression
@click.option("--squashfs", is_flag=True,
              help="Beside each published image, its root as a squashfs (zstd, 1 MiB blocks, enroot's config "
                   "files) pushed as an OCI artifact referring to it, for Slurm's pyxis (docs/clusters-squashfs.md); not with --no-push.")
@click.option("--start-command", default=None, metavar="CMD",
              help="With --compression estargz or zstd:chunked: the start whose opened files go first in each layer, run once "
                   "in the image as its user (default: import torch and a first torch.compile); '' for none.")
@click.option("--start-timeout", type=options.SECONDS, default=600, show_default=True, metavar="S",
              help="Seconds the --start-command may take under strace before the publish of that image fails.")
@click.option("--scan/--no-scan", "scan", default=True, show_default=True,
              help="After an image's smoke tests, scan it (`imagebuilder scan`: its OS's security suite) and push it "
                   "only without a finding the --allowlist does not cover (docs/scan.md). --no-scan: push unscanned, "
                   "each image's line in the report says so.")
@click.option("--allowlist", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="The vulnerabilities accepted until their expiry (docs/scan.md).")
@click.option("--allow-vulnerable", is_flag=True,
              help="Push an image with findings anyway; its line in the report names them.")
@pass_context
def publish_cmd(ctx: Context, target: RegistryTarget, push: bool, dry_run: bool, keep_going: bool, force: bool,
                allow_no_gpu: bool, verify_timeout: float, day: datetime | None, quiet: bool, no_cache: bool, pull: bool,
                report: Path | None, registry_ca: Path | None, selection: Selection, rendering: RenderRequest,
                builder_choice: str, buildx_builder: str | None, platforms: str | None, merge: bool,
                merge_only: bool, compression: Compression | None, sign_key: str | None,
                registry_policy: RetryPolicy, squashfs: bool, start_command: str | None, start_timeout: float,
                scan: bool, allowlist: Path | None, allow_vulnerable: bool) -> None:
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
    from ..publish import PublishRequest, publish_command
    from ..scan import Scanning, load_allowlist

    if (allowlist is not None or allow_vulnerable) and not scan:
        raise click.UsageError("--allowlist and --allow-vulnerable are for the scan; drop --no-scan")
    scanning = Scanning(scan, load_allowlist(allowlist), allow_vulnerable)
    request = PublishRequest(
        selection, rendering, target, registry_policy, push=push, dry_run=dry_run, keep_going=keep_going, force=force,
        allow_no_gpu=allow_no_gpu, verify_timeout=verify_timeout, day=day.date() if day is not None else None,
        quiet=quiet, no_cache=no_cache, pull=pull, report=report, registry_ca=registry_ca,
        builder_choice=builder_choice, buildx_builder=buildx_builder, platforms=platforms, merge=merge,
        merge_only=merge_only, compression=compression, sign_key=sign_key, squashfs=squashfs,
        start_command=start_command, start_timeout=start_timeout)
    publish_command(ctx.matrix, ctx.matrix_path, request, echo=click.echo, note=note, progress=progress,
                    scanning=scanning)


def main() -> None:
    # Ctrl-C, and SIGTERM as CI timeouts send it: the clean-up runs, and a second one ends it.
    interrupts.install()
    cli(prog_name="imagebuilder")
