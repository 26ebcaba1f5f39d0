"""`imagebuilder project`: parse the options into a ProjectRequest, call project/command.py."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import click

from ..trust import labels as L
from . import options
from .context import Context, note, pass_context, progress
from ..matrix.model import Matrix
from ..project import ProjectRequest


@click.command("project")
@click.argument("path", type=click.Path(path_type=Path), metavar="DIR")
@click.option("--base", "base", required=True, metavar="IMAGE",
              help="An image imagebuilder built (a local tag) or published (REGISTRY/REPOSITORY:TAG, pulled and "
                   "pinned to its digest).")
@click.option("--tag", "tag", required=True, metavar="NAME[:TAG]", help="The project image's name.")
@click.option("--push", is_flag=True, help="Push --tag to its registry once the image is proven.")
@click.option("--check", "checks", multiple=True, metavar="CMD",
              help="A command the image must pass (run with /bin/sh -c as the image's user); repeatable.")
@options.allow_no_gpu
@click.option("--key", metavar="KEY", help="cosign public key the published base must be signed with "
                                           "(its signature and SBOM attestation are checked before the build).")
@click.option("--sign-key", metavar="KEY", help="cosign key to sign the pushed image with (with --push): the "
                                                "signature, an SBOM attestation and a SLSA provenance naming the base "
                                                "and the lock.")
@click.option("--rebase", metavar="IMAGE",
              help="Re-make this published project image on --base (a republished base with the same venv) without "
                   "rebuilding its layers, where that is sound; else rebuild. Needs --push.")
@click.option("--no-cache", is_flag=True, help="Build every project layer anew (BuildKit's cache unused).")
@click.option("--locked", is_flag=True, help="Refuse to re-resolve: the project's lock must match its requirements "
                                             "and base (for CI).")
@options.report
@click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="PATH",
              help="CA bundle to trust inside the build (TLS-intercepting proxies); in no layer.")
@options.index_urls
@click.option("--uv", "uv_path", metavar="PATH", callback=options.uv_program,
              help="The uv that resolves the lock. Default: the one beside imagebuilder's Python, else PATH's.")
@pass_context
def project(ctx: Context, path: Path, base: str, tag: str, push: bool, checks: tuple[str, ...], allow_no_gpu: bool,
            key: str | None, sign_key: str | None, rebase: str | None, no_cache: bool, locked: bool, report: Path | None, ca_bundle: Path | None,
            index_url: str | None, extra_index_urls: tuple[str, ...], uv_path: str | None) -> None:
    """Build your project on a verified torch image: resolve, layer, prove, tag (and push, sign).

    DIR holds a pyproject.toml, uv.lock, pylock.toml or requirements.txt (docs/projects.md).

    \b
    Examples:
      imagebuilder project . --base pytorch:2.6.0-cuda12.4-cudnn9-runtime --tag acme/trainer:1 --allow-no-gpu
      imagebuilder project . --base registry.local/pytorch:2.6-cuda12.4-runtime --key cosign.pub --tag registry.local/acme/trainer:1 --push --sign-key cosign.key --check 'python -m trainer --help'
    """
    from ..trust.cosign import Cosign
    from ..engine.docker import DockerEngine
    from ..engine.select import decide, make_builder
    from ..errors import BadRequest
    from ..registry.client import HttpRegistry
    from ..project import project_command
    from ..project.source import read_project
    from ..trust.signing import key_signer
    from ..lock.uv_compile import default_uv

    if sign_key is not None and not push:
        raise BadRequest("--sign-key signs what --push pushes: add --push, or drop --sign-key")
    for url in (index_url, *extra_index_urls):
        if url and "@" in urlsplit(url).netloc:
            raise BadRequest(f"{'--index-url' if url == index_url else '--extra-index-url'}: a password in the URL "
                             "would show in the image's history; give the index without one (a netrc)")
    signer = key_signer(sign_key, try_key=True) if sign_key is not None else None
    uv = uv_path or default_uv()
    source = read_project(path.resolve(), uv)  # a project DIR that cannot be used is exit 2 before any daemon
    engine = DockerEngine()
    engine.ping()
    decision = decide("buildkit")
    builder = make_builder(decision, engine)
    labels = engine.image_labels(base) if engine.image_exists(base) else {}
    request = ProjectRequest(path=path.resolve(), base=base, tag=tag, push=push, checks=checks,
                             allow_no_gpu=allow_no_gpu, no_cache=no_cache, rebase=rebase, key=key, sign_key=sign_key, locked=locked, report=report,
                             ca_bundle=ca_bundle, uv=uv, project=source,
                             index_args=index_args(ctx.matrix, labels, index_url, extra_index_urls))
    done = project_command(request, engine=engine, builder=builder, registry=HttpRegistry(), say=progress,
                           signer=signer, cosign=Cosign(say=note) if key else None)
    click.echo(f"{done.tag}: {done.image_id} (base {done.base_digest}, lock {done.lock}"
               f"{', pushed ' + done.pushed_digest if done.pushed_digest else ''})")


def index_args(matrix: Matrix, labels: dict[str, str], index_url: str | None,
               extra_index_urls: tuple[str, ...]) -> tuple[str, ...]:
    """The user's indexes, and the base's torch wheel index where its torch is not PyPI's build
    (a project that needs a torch-family package at the base's +cuXXX version finds it there)."""
    args: list[str] = ["--index-url", index_url] if index_url else []
    extra = list(extra_index_urls)
    release = next((t for t in matrix.torches.values() if str(t.version) == labels.get(L.TORCH)), None)
    wheel = labels.get(L.WHEEL)
    if release is not None and wheel and wheel != release.pypi_variant:
        variant = next((v for v in release.variants if v.name == wheel), None)
        if variant is not None:
            extra.append(variant.index)
    for url in extra:
        args += ["--extra-index-url", url]
    if extra:
        args += ["--index-strategy", "unsafe-best-match"]
    return tuple(args)
