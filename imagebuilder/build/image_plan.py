"""Pure: every decision about one image on one platform, made once (ImagePlan), and every
refusal of a request raised here, before anything is rendered or built.

The tags (the platform's, `-{arch}` after each, when asked), the base image and its pin (for
a jupyter image, its parent's ref as rendered for the same platform, and that parent's inputs
hash), the lock and the shared venv, a foreign platform's native install, BuildKit's mounts,
how the CA bundle reaches the build, the notices and the build context's files. Nothing is
read here: the locks and the CA bundle come in RenderOptions, the files imagebuilder lends
every image in `carried`, the parent as rendered. render.py only lays the plan out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import BadRequest
from ..lock.base_pin import BasePin
from ..lock.lockfile import Lock, added_extras, check_extras, parse_extras
from ..matrix.model import Matrix
from ..matrix.resolve import BuildSpec
from .image_contents import (CA_PATH, JUPYTER_LOCK_PATH, LOCK_PATH, SBOM_PATH, VENV, apt_packages, constraints_for,
                             nvcc_check)
from .install_steps import (ADDED_LOCK_PATH, CA_CONTEXT, CA_CONTEXT_FILE, CA_SECRET_ID, LAYERS_DIR, NETRC_SECRET_ID,
                            NativeInstall, TorchLayer, added_commands, apt_mount, apt_options, index_netrc,
                            install_commands, jupyter_commands, native_install, native_uv_run, run_mounts, shared_venv,
                            torch_layers)
from .layers import wheel_groups
from .platforms import check_platform, platform_tags
from .render_options import RenderOptions
from .security_step import SecurityStep, security_step
from .tags import tags_for

if TYPE_CHECKING:
    from .render import RenderedImage

# The module every Python start of the image imports (from /opt/imagebuilder, by imagebuilder.pth).
PYTHON_START = "imagebuilder_start"


class CredentialsNeedBuildKit(BadRequest):
    template = ("the index URL carries a user or password, which the classic builder would write into the "
                "image's history; use --builder buildkit (they reach the build as a secret) or an index without them")


class ForeignNeedsBuildKit(BadRequest):
    platform: str
    template = "building for {platform} on a host of another platform needs --builder buildkit"


@dataclass(frozen=True)
class Base:
    """What the image starts FROM."""

    image: str  # by name: the labels and manifest.json name it; for jupyter, our parent's ref
    ref: str  # what FROM takes: the image by digest where locks/ pins one
    pin: BasePin | None  # None for jupyter (its parent is ours, defined by its inputs hash)


@dataclass(frozen=True)
class CaMode:
    """How --ca-bundle reaches the build (all False without one)."""

    two_stage: bool  # classic builder: a stage that trusts it; the final stage never sees it
    secret: bool  # BuildKit: a secret mounted per RUN
    context: bool  # BuildKit through buildx: a named build context, bind-mounted per RUN
    path: str = CA_PATH  # where the two-stage build's first stage keeps it


@dataclass(frozen=True)
class Mounts:
    """BuildKit's `RUN --mount=...` prefixes (empty for the classic builder)."""

    buildkit: bool
    apt: str  # the image's apt RUN
    apt_options: str
    install: str  # the install RUNs
    native_apt: str  # the native-uv stage's apt RUN


@dataclass(frozen=True)
class Steps:
    """What installs the image's packages, as the shell text the templates lay out."""

    nvcc_check: str | None
    shared_venv: bool
    added: bool  # devel on the shared venv: its additions on top
    added_lock_path: str
    torch_layers: tuple[TorchLayer, ...]
    native: NativeInstall | None
    native_uv: TorchLayer | None
    added_commands: tuple[str, ...]
    install_commands: tuple[str, ...]
    jupyter_commands: tuple[str, ...]
    lock_path: str | None
    sbom_command: str


@dataclass(frozen=True)
class Packages:
    build: tuple[str, ...]  # the two-stage build's first stage
    final: tuple[str, ...]


@dataclass(frozen=True)
class ImagePlan:
    spec: BuildSpec
    matrix: Matrix
    repository: str
    tags: tuple[str, ...]
    base: Base
    lock: Lock | None
    notices: tuple[str, ...]
    ca: CaMode
    mounts: Mounts
    steps: Steps
    packages: Packages
    security: SecurityStep  # the OS step's security suite and the fixes the image holds
    files: Mapping[str, bytes] = field(repr=False)  # the context's files that render does not make
    parent_hash: str  # a jupyter image's parent's inputs hash; "" otherwise
    source: str
    # What reaches the build outside the inputs hash: the CA bundle (a file, or a named
    # context's), BuildKit's secrets by id, the named contexts.
    ca_files: Mapping[str, bytes] = field(repr=False)
    secrets: Mapping[str, bytes] = field(repr=False)
    contexts: tuple[str, ...]
    trusts_ca_bundle: bool


def plain_tags(spec: BuildSpec, matrix: Matrix, options: RenderOptions) -> tuple[str, ...]:
    """The image's tags without a platform's suffix: the matrix's, of their own with --with."""
    return tags_for(spec, matrix, added_extras(matrix, options.extras))


def image_tags(spec: BuildSpec, matrix: Matrix, options: RenderOptions) -> tuple[str, ...]:
    """The image's tags: plain_tags, each with `-{arch}` where the platform's own are asked for."""
    tags = plain_tags(spec, matrix, options)
    target = options.target
    return platform_tags(tags, target.platform) if target.platform_tags and target.platform else tags


def repository_of(matrix: Matrix, options: RenderOptions) -> str:
    return options.repository or matrix.defaults.repository


def plan_image(spec: BuildSpec, matrix: Matrix, options: RenderOptions, carried: Mapping[str, bytes],
               parent: RenderedImage | None = None) -> ImagePlan:
    """One image on one platform (options.target.platform; None: the host's, unchecked); `parent`: a
    jupyter image's parent as rendered with the same options."""
    extras, lock = _checked(spec, matrix, options)
    if spec.parent is not None:
        if parent is None or parent.spec.key != spec.parent.key:
            raise ValueError(f"{spec.key} is planned with its parent {spec.parent.key} as rendered")
        # FROM our runtime image by tag: what defines that image is its own inputs hash.
        base = Base(parent.ref, parent.ref, None)
    else:
        pin = options.locks.base_for(spec.base_image)
        base = Base(spec.base_image, pin.from_ref, pin)
    ca = options.ca_bundle
    two_stage = ca is not None and not options.buildkit
    install = options.installer
    venv = shared_venv(spec, matrix, options.buildkit, options.locks, lock, extras)
    native = native_install(spec, options.target.foreign_platform, venv)
    apt_mounts, install_mounts = run_mounts(options.buildkit, ca, options.ca_context,
                                            bool(index_netrc(options.index_urls)))
    # apt's cache mount is locked while one apt runs: the image's apt, emulated, takes one of
    # its own machine type's, so that the native stage's apt does not wait minutes for it.
    mounts = Mounts(options.buildkit, apt_mount(native.platform.rpartition("/")[2]) if native else apt_mounts,
                    apt_options(options.buildkit), install_mounts, apt_mounts)
    lock_path = JUPYTER_LOCK_PATH if spec.parent is not None else LOCK_PATH
    steps = Steps(
        nvcc_check=nvcc_check(spec), shared_venv=venv is not None, added=venv is not None and venv.added is not None,
        added_lock_path=ADDED_LOCK_PATH,
        torch_layers=tuple(torch_layers(spec, matrix, install, venv, install_mounts, native)) if venv else (),
        native=native, native_uv=native_uv_run(matrix, install, install_mounts, native) if native else None,
        added_commands=tuple(added_commands(spec, matrix, install)) if venv and venv.added else (),
        install_commands=tuple(install_commands(spec, matrix, install, not two_stage, lock, extras)),
        jupyter_commands=tuple(jupyter_commands(spec, matrix, install, not two_stage, lock)),
        lock_path=lock_path if lock is not None else None,
        sbom_command=f"{VENV}/bin/python /opt/imagebuilder/sbom.py {VENV} {SBOM_PATH}")
    files = dict(carried)
    # /opt/imagebuilder on the venv's path makes `python -m smoke_tests` work; its second line
    # keeps the image's run contract where no entrypoint runs (pyxis, apptainer exec).
    files["imagebuilder.pth"] = f"/opt/imagebuilder\nimport {PYTHON_START}\n".encode()
    if lock is not None:
        files[lock_path.replace("/opt/", "", 1)] = lock.text().encode()
    if spec.parent is None:
        files["imagebuilder/constraints.txt"] = constraints_for(spec, lock).encode()
    if venv is not None:
        files.update({f"{LAYERS_DIR}/{group.filename}": group.lock.text().encode() for group in wheel_groups(venv.lock)})
        if venv.added is not None:
            files[ADDED_LOCK_PATH.replace("/opt/", "", 1)] = venv.added.text().encode()
    ca_files, secrets, contexts = _ca_delivery(options, two_stage)
    packages = Packages(tuple(apt_packages(spec, "wheels")), tuple(apt_packages(spec, "final")))
    return ImagePlan(
        spec=spec, matrix=matrix, repository=repository_of(matrix, options), tags=image_tags(spec, matrix, options),
        base=base, lock=lock, notices=_notices(spec, options, lock, base, native),
        ca=CaMode(two_stage, options.buildkit and ca is not None, options.buildkit and ca is not None and options.ca_context),
        mounts=mounts, steps=steps, packages=packages,
        security=security_step(spec, options.target, options.security_mirror, packages.final),
        files=files, parent_hash=parent.inputs_hash if parent is not None else "", source=options.source,
        ca_files=ca_files, secrets=secrets, contexts=contexts, trusts_ca_bundle=ca is not None)


def check_image(spec: BuildSpec, matrix: Matrix, options: RenderOptions) -> None:
    """What `plan_image` refuses of the image, without planning (or rendering) it: the checks
    a command makes before any daemon is asked."""
    _checked(spec, matrix, options)


def _checked(spec: BuildSpec, matrix: Matrix, options: RenderOptions) -> tuple[tuple[str, ...], Lock | None]:
    """Every refusal of the image's request (the platform, the builder, --with against the
    pins); its extras (matrix.yaml's and --with's) and its lock."""
    _check(spec, matrix, options)
    extras = parse_extras((*matrix.extras, *options.extras))
    lock = options.locks.lock_for(spec, matrix, extras)
    check_extras(spec, extras, lock)
    return extras, lock


def _check(spec: BuildSpec, matrix: Matrix, options: RenderOptions) -> None:
    """The refusals of a request that are not the lock's (--with against the pins)."""
    target = options.target
    if target.platform is not None:
        check_platform(matrix, spec.torch, target.platform)
    if target.foreign_platform is not None and not options.buildkit:
        raise ForeignNeedsBuildKit(platform=target.foreign_platform)
    if index_netrc(options.index_urls) and not options.buildkit:
        raise CredentialsNeedBuildKit()


def _ca_delivery(options: RenderOptions,
                 two_stage: bool) -> tuple[dict[str, bytes], dict[str, bytes], tuple[str, ...]]:
    """(context files, secrets, named contexts) that carry the CA bundle and the index's credentials."""
    ca, files, secrets, contexts = options.ca_bundle, {}, {}, tuple[str, ...]()
    if ca is not None and two_stage:
        files["ca-bundle.pem"] = ca
    elif ca is not None and options.ca_context:
        files[f"{CA_CONTEXT}/{CA_CONTEXT_FILE}"] = ca
        contexts = (CA_CONTEXT,)
    elif ca is not None:
        secrets[CA_SECRET_ID] = ca
    credentials = index_netrc(options.index_urls)
    if credentials:
        secrets[NETRC_SECRET_ID] = credentials
    return files, secrets, contexts


def _notices(spec: BuildSpec, options: RenderOptions, lock: Lock | None, base: Base,
             native: NativeInstall | None) -> tuple[str, ...]:
    """The spec's notices, and what the lock, the base pin and the platform leave open."""
    notices = list(spec.notices)
    if lock is None:
        notices.append("no lock for this image in locks/: the build resolves its dependencies "
                       "(run `imagebuilder lock` to pin them)")
    if base.pin is not None and not base.pin.identity:
        notices.append(f"base image {base.image} has no digest in locks/base-images.json: FROM by tag")
    if native is not None:
        notices.append(f"{native.platform} on a host of another platform: its wheels install natively "
                       f"(uv --python-platform {native.uv_platform}); apt, the SBOM and what runs the image's "
                       "own programs run under emulation")
    elif options.target.foreign_platform is not None:
        notices.append(f"{options.target.foreign_platform} on a host of another platform: every step runs under "
                       "emulation (the wheels install natively only with BuildKit, the shared venv and "
                       "the OS's Python)")
    return tuple(notices)
