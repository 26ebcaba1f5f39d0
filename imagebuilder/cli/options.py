"""Click options shared by several commands, defined once.

Groups of options reach a command as one typed value (a Selection, a RenderRequest), not as
loose keyword arguments."""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import click

from packaging.version import Version

from ..build import PSEUDO_FILE_SYSTEMS, RenderRequest, check_output, file_system_type, parse_base_images
from ..engine.export import DUAL, Compression
from ..errors import BadRequest
from ..lock import BadUv, parse_index_url
from ..matrix import ALL, VARIANTS, Selection, check_not_empty
from ..registry import REGISTRY_POLICY, RegistryTarget, RetryPolicy, check_repository
from ..trust import read_ca_bundle, read_certificates

F = TypeVar("F", bound=Callable[..., Any])


def stack(*decorators: Callable[[F], F]) -> Callable[[F], F]:
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


def refuse_unless(validate: Callable[..., None]) -> Callable[[F], F]:
    """Refuse a combination of options before the command does any work: validate(**options)
    raises BadRequest (exit 2, one line)."""
    def decorator(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            validate(**kwargs)
            return f(*args, **kwargs)

        return command  # type: ignore[return-value]

    return decorator


class _Seconds(click.types.FloatParamType):
    """A timeout: a finite number of seconds, at least 1 and at most a week (inf, nan and 1e300
    are no deadline a container can be given); a refusal names the value as typed, not converted."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds) or not 1 <= seconds <= WEEK:
            name = param.opts[0] if param is not None else "a timeout"
            raise BadRequest(f"{name} {value} is not a number of seconds from 1 to {WEEK}; give e.g. 1800")
        return float(seconds)


SECONDS = _Seconds()


WEEK = 7 * 24 * 3600


def _report_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """--report is checked before the work it reports on: found unwritable only after an
    hours-long build, it would lose the record."""
    if value is None:
        return None
    folder = value.absolute().parent  # made when it is missing: its nearest ancestor must take it
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if value.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or (
            value.exists() and not os.access(value, os.W_OK)) or file_system_type(folder) in PSEUDO_FILE_SYSTEMS:
        raise BadRequest(f"--report {value}: cannot write a file there; give a FILE in a folder you can write")
    return value


def _selection(torch_version: str | None, cuda_version: str | None, python_version: str | None,
               variant: str | None, os_name: str | None, base_image: tuple[str, ...] = (),
               strict: bool = False) -> Selection:

    check_not_empty(torch=torch_version, cuda=cuda_version, python=python_version, os=os_name)
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
    return stack(
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


with_extras = click.option(
    "--with", "extras", multiple=True, metavar="REQ",
    help="Add a package to the image, resolved into its lock under the torch pins "
         "(repeatable), e.g. --with 'pandas==2.2.3'. Build with the same --with you locked with.")


def mirror_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://", "file://")):
        raise click.BadParameter(f"{value!r} is not an http(s):// or file:// URL", ctx, param)
    return value.rstrip("/") if value else None


def security_mirror(name: str) -> Callable[[F], F]:
    """The mirror of the OS's security suite that `scan` (--mirror) reads, and the images' apt
    step and publish's scan (--security-mirror, a rendering option) read, handed over as `mirror`."""
    return click.option(name, "mirror", metavar="URL", envvar="IMAGEBUILDER_SECURITY_MIRROR", callback=mirror_url,
                        help="The mirror of the OS's security suite. Default: http://deb.debian.org/debian-security "
                             "(Debian), http://archive.ubuntu.com/ubuntu (Ubuntu). Env: IMAGEBUILDER_SECURITY_MIRROR.")


def _index_url(ctx: click.Context, param: click.Parameter, value: str | tuple[str, ...] | None) -> Any:
    """An http(s):// or file:// URL, checked before any work (issue 29): uv fails on anything else
    minutes into a build."""
    for url in (value,) if isinstance(value, str) else value or ():
        parse_index_url(url, param.opts[0])
    return value


index_url = click.option("--index-url", metavar="URL", callback=_index_url,
                         help="Package index for the wheels, replacing the default one (a mirror). "
                              "A user and password in it reach a BuildKit build as a secret, never a layer.")


def index_urls(f: F) -> F:
    """The package indexes wheels come from (rendering, locking)."""
    return stack(
        index_url,
        click.option("--extra-index-url", "extra_index_urls", multiple=True, metavar="URL", callback=_index_url,
                     help="Additional package index; repeatable."),
    )(f)


def rendering(f: F) -> F:
    """Handed to the command as `rendering: RenderRequest` (what it asks; build.for_command
    completes it with the matrix's locks and the builder)."""
    return stack(
        index_urls,
        click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     metavar="PATH",
                     help="CA bundle to trust inside the build (TLS-intercepting proxies), e.g. "
                          "$SSL_CERT_FILE. Not left in the final image."),
        click.option("--repository", metavar="NAME",
                     help="Image repository name. Default: matrix.yaml's defaults.repository (pytorch)."),
        with_extras,
        click.option("--python-mirror", metavar="URL", envvar="IMAGEBUILDER_PYTHON_MIRROR",
                     callback=mirror_url,
                     help="Where a Python the OS does not ship is downloaded from: a mirror of "
                          "python-build-standalone's GitHub releases (uv's UV_PYTHON_INSTALL_MIRROR). "
                          "Default: GitHub. Env: IMAGEBUILDER_PYTHON_MIRROR."),
        security_mirror("--security-mirror"),
        _collect("rendering", _rendering,
                 ("index_url", "extra_index_urls", "ca_bundle", "repository", "extras", "python_mirror", "mirror")),
    )(f)


def _rendering(index_url: str | None, extra_index_urls: tuple[str, ...], ca_bundle: Path | None,
               repository: str | None, extras: tuple[str, ...], python_mirror: str | None,
               mirror: str | None) -> RenderRequest:
    """Checked before anything runs: a bad name or CA bundle would fail the build minutes later.
    The CA bundle is read here, once, for every image the command renders."""
    if repository is not None:
        check_repository(repository)
    return RenderRequest(repository=repository, index_url=index_url, extra_index_urls=tuple(extra_index_urls),
                         ca_bundle=read_ca_bundle(ca_bundle) if ca_bundle is not None else None,
                         python_mirror=python_mirror, extras=tuple(extras), security_mirror=mirror)


def building(f: F) -> F:
    return stack(
        click.option("--no-cache", is_flag=True, help="Build without the layer cache."),
        click.option("--pull/--no-pull", default=False, show_default=True,
                     help="Pull a newer base image before building."),
        click.option("--quiet", "-q", is_flag=True, help="Print only the result."),
    )(f)


report = click.option("--report", type=click.Path(path_type=Path), metavar="FILE", callback=_report_file,
                      help="Write a JSON report of what was done to FILE.")
allow_no_gpu = click.option("--allow-no-gpu", is_flag=True,
                            help="On a host without GPUs, run the CPU mode of the smoke tests instead of failing.")


BUILDER_CHOICES = ["auto", "buildkit", "classic"]

render_builder = click.option(
    "--builder", "builder_choice", type=click.Choice(BUILDER_CHOICES), default=None,
    help="The builder to render for: classic (any `docker build`), buildkit (the CA bundle as a build "
         "secret, shared caches: what `build` renders when it builds with BuildKit), or auto (what "
         "`build` would choose here). Default: classic, or buildkit for another platform than the host's.")


def builders(f: F) -> F:
    return stack(
        click.option("--builder", "builder_choice", type=click.Choice(BUILDER_CHOICES),
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


def _registry_target(ctx: click.Context, param: click.Parameter, value: str | None) -> RegistryTarget | None:
    """HOST[:PORT]/NAMESPACE, checked before any daemon or registry is asked."""
    return RegistryTarget.parse(value, param.opts[0]) if value is not None else None


def build_only(f: F) -> F:
    """build's own options: a dry run, and the registry caches to import."""
    return stack(
        click.option("--dry-run", is_flag=True,
                     help="Print what would be built, in build order, and stop: nothing is built (the daemon "
                          "is still asked for the base image's OS and the images already there)."),
        click.option("--cache-from-registry", metavar="HOST[:PORT]/NAMESPACE", callback=_registry_target,
                     help="Import the build caches `publish --registry HOST[:PORT]/NAMESPACE` exported there "
                          "(BuildKit with the containerd image store): a rebuild reuses the torch layer."),
        registry_timeout,
    )(f)


def _registry_policy(ctx: click.Context, param: click.Parameter, value: float) -> RetryPolicy:
    """--registry-timeout, parsed once into the policy every registry request of the command follows."""
    return replace(REGISTRY_POLICY, timeout_s=value)


registry_timeout = click.option(
    "--registry-timeout", "registry_policy", type=SECONDS, callback=_registry_policy,
    default=REGISTRY_POLICY.timeout_s, show_default=True, metavar="S",
    help="Seconds imagebuilder's own registry requests may go without an answer before they are given up as a "
         "timeout (a stalled request is tried once more; 429, 5xx and resets a few times, each retry said on "
         "stderr).")


def _registry_ca(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A file without a certificate would read as "the registry did not answer" (its TLS fails)."""
    if value is not None:
        read_certificates(value, "--registry-ca", "pass the CA certificate of the registry's TLS")
    return value


def _publishing(merge: bool, merge_only: bool, platforms: str | None, **_: Any) -> None:
    if merge_only and not merge:
        raise BadRequest("--merge-only writes the indexes that --no-merge leaves out; give one of them")
    if merge_only and platforms is None:
        raise BadRequest("--merge-only needs --platform: the platforms each index joins")


def publishing(f: F) -> F:
    """publish's own options: where to, what to push, how to merge, which day."""
    return stack(
        refuse_unless(_publishing),
        click.option("--registry", "target", required=True, metavar="HOST[:PORT]/NAMESPACE", callback=_registry_target,
                     help="Where the images go: HOST[:PORT]/NAMESPACE/REPOSITORY:TAG. https as dockerd uses it "
                          "(http for a loopback registry without TLS); credentials as docker finds them."),
        registry_timeout,
        click.option("--registry-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="PATH",
                     callback=_registry_ca,
                     help="CA certificate of the registry's TLS, for imagebuilder's own registry reads. Default: "
                          "/etc/docker/certs.d/HOST/ca.crt where dockerd has one, else the system's CAs."),
        click.option("--push/--no-push", default=True, show_default=True,
                     help="--no-push builds and verifies what the plan says, and pushes nothing."),
        click.option("--dry-run", is_flag=True, help="Print the plan (after asking the registry) and stop."),
        click.option("--keep-going", is_flag=True, help="Continue past a failed image (its jupyter image fails too)."),
        click.option("--force", is_flag=True, help="Rebuild, verify and push even images the registry has unchanged."),
        click.option("--merge/--no-merge", default=True, show_default=True,
                     help="With --platform: once every platform's images are pushed (TAG-amd64, TAG-arm64), "
                          "make each TAG an image index over them. --no-merge for runners that publish one "
                          "platform each; a --merge-only job writes the indexes after them."),
        click.option("--merge-only", is_flag=True,
                     help="Build nothing: make each TAG an index over the --platform images already pushed."),
        click.option("--verify-timeout", type=SECONDS, default=1800, show_default=True, metavar="S",
                     help="Seconds the smoke tests of one image may take."),
        click.option("--date", "day", type=click.DateTime(["%Y-%m-%d"]), default=None, metavar="YYYY-MM-DD",
                     help="The day of the immutable dated tags ({qualified}-{YYYYMMDD}). Default: today (UTC)."),
        click.option("--sign-key", metavar="KEY",
                     help="Sign every pushed digest with cosign, its SBOM attached as a signed attestation: a "
                          "cosign key file, env://VAR or a KMS URI (password in COSIGN_PASSWORD). An unsigned "
                          "image in the registry is rebuilt and signed."),
    )(f)


def output_folder(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """-o: checked before anything is rendered."""
    return check_output(value) if value is not None else None


def cuda_variants(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """PyTorch's wheel variants, cuXYZ (checked before the index is asked for them)."""
    for name in value:
        if not re.fullmatch(r"cu\d{3,4}", name):
            raise BadRequest(f"--cuda-variant {name!r} is not a CUDA wheel variant; give cu followed by the "
                             "CUDA version's digits, e.g. cu126 for CUDA 12.6")
    return value


def uv_program(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--uv names a program: checked before any lock is resolved (a text file is found out by
    running it, in UvCompile)."""
    if value is not None and not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise BadUv(uv=value, why="no such file" if not os.path.exists(value) else "not an executable file")
    return value


def release(ctx: click.Context, param: click.Parameter, value: str | None) -> Version | None:
    """A full torch release, X.Y.Z (a click callback)."""
    if value is None:
        return None
    try:
        version = Version(value)
    except ValueError:  # InvalidVersion, or a number too long for int()
        raise click.BadParameter(f"not a version: {value!r}") from None
    if len(version.release) != 3:
        raise click.BadParameter("give the full release, e.g. 2.15.0")
    return version


def _compression(compression: str | None, compression_level: int | None) -> Compression | None:
    return Compression.asked(compression, compression_level)


def compression(f: F) -> F:
    """Handed to the command as `compression: Compression | None` (None: neither option given)."""
    return stack(
        click.option("--compression", metavar="|".join(Compression.NAMES), default=None,
                     help="Export the layers with this compression into Docker's containerd image store "
                          "(BuildKit) and push them as verified; publish then also attaches SLSA provenance "
                          "and uses registry build caches. zstd is pulled by Docker >= 23, containerd >= 1.5, "
                          "current Kubernetes nodes. estargz: gzip that nodes running containerd's stargz "
                          "snapshotter pull lazily (a container starts before its image has arrived; slower "
                          "to export: gzip speed). zstd:chunked (publish only): the same lazy pulls from zstd "
                          "frames, as fast to write as zstd, and plain zstd to every other puller; publish "
                          "orders both by the image's start (--start-command). gzip+zstd: each image twice, in one index, a gzip manifest first for "
                          "engines without zstd (Docker < 23, enroot < 4.0) and a zstd one marked for Podman "
                          "and CRI-O (docs/publish.md). Default: publish, zstd where BuildKit exports into the "
                          "containerd store (gzip by docker push elsewhere); build, the same (--load's gzip elsewhere)."),
        click.option("--compression-level", type=int, default=None, metavar="N",
                     help=f"{Compression.levels_help()} (none for {DUAL}). Default: BuildKit's (zstd 3, gzip 6); eStargz 6, zstd:chunked 3."),
        _collect("compression", _compression, ("compression", "compression_level")),
    )(f)
