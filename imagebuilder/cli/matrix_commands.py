"""`imagebuilder matrix` and its subcommands (`check`, `add`): parse, call one function, print."""

from __future__ import annotations

import click
from packaging.version import Version

from . import options
from ..build import base_os_reader, listing
from .context import Context, Group, note, pass_context, progress
from ..matrix import Selection, enumerate_matrix, settle_os


@click.group("matrix", cls=Group, invoke_without_command=True)
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
    selection = settle_os(ctx.matrix, selection, base_os_reader(selection), note)
    click.echo(listing.format_listing(listing.matrix_rows(ctx.matrix, selection), fmt))


@matrix.command("check")
@click.option("--online", is_flag=True,
              help="Also compare pins, Pythons and platforms with the index's wheels, and list releases it lacks.")
@options.index_url
@pass_context
def matrix_check(ctx: Context, online: bool, index_url: str | None) -> None:
    """Validate matrix.yaml (offline); with --online, report drift from the index."""
    m = ctx.matrix
    images = sum(1 for _ in enumerate_matrix(m))
    click.echo(f"{m.path}: ok: {len(m.torches)} torch releases, {len(m.cudas)} CUDA versions, "
               f"{len(m.oses)} OSes, {images} images")
    if online:
        from ..lock import report_drift

        report_drift(m, index_url, echo=click.echo, progress=progress)


@matrix.command("add")
@click.option("--torch", "torch_version", metavar="X.Y.Z", callback=options.release,
              help="The release to add, e.g. 2.15.0.")
@click.option("--new", is_flag=True, help="Add every release of a minor the index has and the matrix lacks.")
@click.option("--cuda-variant", "cuda_variants", multiple=True, metavar="cuXY", callback=options.cuda_variants,
              help="Also read this variant from PyTorch's own index (needs that index). Repeatable.")
@click.option("--dry-run", is_flag=True, help="Print the block instead of writing it.")
@options.index_url
@pass_context
def matrix_add(ctx: Context, torch_version: Version | None, new: bool, cuda_variants: tuple[str, ...],
               dry_run: bool, index_url: str | None) -> None:
    """Write a torch release's block into the matrix from the index's wheel metadata.

    Comments and order of the file stay; what the metadata does not say is left for you, and
    `imagebuilder matrix check` names it.
    """
    from ..lock import add_releases

    if (torch_version is None) != new:
        raise click.UsageError("give either --torch X.Y.Z or --new")
    add_releases(ctx.matrix_path, torch_version, index_url, cuda_variants, dry_run, echo=click.echo, note=note)
