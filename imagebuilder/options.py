"""Click options shared by several commands, defined once.

Groups of options reach a command as one typed value (a Selection, a Rendering), not as
loose keyword arguments."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from .matrix import VARIANTS
from .pipeline import ALL, Selection

F = TypeVar("F", bound=Callable[..., Any])


def _stack(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    def apply(f: F) -> F:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return apply


def _collect(name: str, make: Callable[..., Any], keys: tuple[str, ...]) -> Callable[[F], F]:
    """Hand the options `keys` to the command as one value `name` = make(**options)."""

    def decorator(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = make(**{key: kwargs.pop(key) for key in keys})
            return f(*args, **kwargs)

        return command  # type: ignore[return-value]

    return decorator


def _selection(torch_version: str | None, cuda_version: str | None, python_version: str | None,
               variant: str | None, os_name: str | None, base_image: tuple[str, ...] = (),
               strict: bool = False) -> Selection:
    from .platforms import parse_base_images

    bases = parse_base_images(base_image)
    return Selection(torch_version, cuda_version, python_version, variant, os_name, bases.pop(None, None),
                     strict, platform_bases=tuple(sorted((p, image) for p, image in bases.items() if p)))


def selection(required: bool, all_variants: bool = False, strict: bool = False) -> Callable[[F], F]:
    """Which image(s): the coordinates of the matrix, the base image and --strict, handed to
    the command as `selection: Selection`. `required` for a request (torch and CUDA);
    `all_variants` lets --variant take `all` (every variant, parents first)."""
    variants = list(VARIANTS) + ([ALL] if all_variants else [])
    keys = ("torch_version", "cuda_version", "python_version", "variant", "os_name", "base_image") + (
        ("strict",) if strict else ())
    return _stack(
        click.option("--torch", "torch_version", required=required, metavar="V",
                     help="PyTorch release: 2.6 or 2.6.0."),
        click.option("--cuda", "cuda_version", required=required, metavar="V",
                     help="The image's CUDA toolkit: 12.1 or 12.1.1. The torch wheels come from the same "
                          "CUDA major (exact minor if published, else the closest; see README)."),
        click.option("--python", "python_version", metavar="X.Y",
                     help="Python version. Default: the OS's own python3 when torch ships wheels for it, "
                          "else the one torch ships nearest above it (see README)."),
        click.option("--variant", type=click.Choice(variants),
                     help="Image variant. Default: matrix.yaml's defaults.variant (runtime)."
                          + (" `all`: runtime, devel, then jupyter and devel-jupyter FROM those two." if all_variants else "")),
        click.option("--os", "os_name", metavar="OS",
                     help="ubuntu22.04, ubuntu24.04, debian12, ... Default: the --base-image's OS when "
                          "a Docker daemon can read it, else matrix.yaml's defaults.os."),
        click.option("--base-image", metavar="[PLATFORM=]IMAGE", multiple=True,
                     help="Replace the default FROM image (mirrors, air-gapped sites, tests); "
                          "linux/arm64=IMAGE for one platform only. Repeatable."),
        *([click.option("--strict", is_flag=True,
                        help="Refuse anything but a torch build for exactly this CUDA version.")] if strict else []),
        _collect("selection", _selection, keys),
    )


@dataclass(frozen=True)
class Rendering:
    """How to render, whatever the image: where wheels come from, what CA to trust, the name."""

    index_url: str | None
    extra_index_urls: tuple[str, ...]
    ca_bundle: Path | None
    repository: str | None
    extras: tuple[str, ...] = ()  # --with: packages added to the image's lock
    python_mirror: str | None = None  # --python-mirror: where uv downloads a CPython the OS lacks


with_extras = click.option(
    "--with", "extras", multiple=True, metavar="REQ",
    help="Add a package to the image, resolved into its lock under the torch pins "
         "(repeatable), e.g. --with 'pandas==2.2.3'. Build with the same --with you locked with.")


def _mirror_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://", "file://")):
        raise click.BadParameter(f"{value!r} is not an http(s):// or file:// URL", ctx, param)
    return value.rstrip("/") if value else None


def rendering(f: F) -> F:
    """Handed to the command as `rendering: Rendering`."""
    return _stack(
        click.option("--index-url", metavar="URL",
                     help="Package index for the wheels, replacing the default one (a mirror)."),
        click.option("--extra-index-url", "extra_index_urls", multiple=True, metavar="URL",
                     help="Additional package index; repeatable."),
        click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     metavar="PATH",
                     help="CA bundle to trust inside the build (TLS-intercepting proxies), e.g. "
                          "$SSL_CERT_FILE. Not left in the final image."),
        click.option("--repository", metavar="NAME",
                     help="Image repository name. Default: matrix.yaml's defaults.repository (pytorch)."),
        with_extras,
        click.option("--python-mirror", metavar="URL", envvar="IMAGEBUILDER_PYTHON_MIRROR",
                     callback=_mirror_url,
                     help="Where a Python the OS does not ship is downloaded from: a mirror of "
                          "python-build-standalone's GitHub releases (uv's UV_PYTHON_INSTALL_MIRROR). "
                          "Default: GitHub. Env: IMAGEBUILDER_PYTHON_MIRROR."),
        _collect("rendering", lambda **kw: Rendering(**{**kw, "extra_index_urls": tuple(kw["extra_index_urls"]),
                                                        "extras": tuple(kw["extras"])}),
                 ("index_url", "extra_index_urls", "ca_bundle", "repository", "extras", "python_mirror")),
    )(f)


def building(f: F) -> F:
    return _stack(
        click.option("--no-cache", is_flag=True, help="Build without the layer cache."),
        click.option("--pull/--no-pull", default=False, show_default=True,
                     help="Pull a newer base image before building."),
        click.option("--quiet", "-q", is_flag=True, help="Print only the result."),
    )(f)


report = click.option("--report", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
                      help="Write a JSON report of what was done to FILE.")
allow_no_gpu = click.option("--allow-no-gpu", is_flag=True,
                            help="On a host without GPUs, run the CPU mode of the smoke tests instead of failing.")


def builders(f: F) -> F:
    return _stack(
        click.option("--builder", "builder_choice", type=click.Choice(["auto", "buildkit", "classic"]),
                     default="auto", show_default=True, envvar="IMAGEBUILDER_BUILDER",
                     help="auto: BuildKit when a docker CLI here builds with it (buildx, or a CLI with "
                          "BuildKit built in), else the classic builder of the Engine API. BuildKit "
                          "mounts --ca-bundle as a secret and shares uv's and apt's caches across images. "
                          "Env: IMAGEBUILDER_BUILDER."),
        click.option("--buildx-builder", metavar="NAME", envvar="BUILDX_BUILDER",
                     help="The buildx builder instance to build with (a remote BuildKit, say). "
                          "Default: $BUILDX_BUILDER, else buildx's current one."),
    )(f)


platforms = click.option("--platform", "platforms", metavar="PLATFORM[,PLATFORM]",
                         help="linux/amd64, linux/arm64 or both (comma list). Default: the host's. "
                              "Another platform than the host's needs BuildKit (and QEMU to build); "
                              "its local tags end in -arm64 / -amd64.")
