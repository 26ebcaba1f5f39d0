"""Pure: BuildSpec -> Dockerfile text and build-context files (Jinja2, StrictUndefined).

Python computes every value and list; the templates only loop and lay out. Same inputs,
same bytes: nothing here reads the clock, the environment or the host.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from smoke_tests.shm import NCCL_SHM_MIN_BYTES, SHM_ADVICE

from . import __version__
from .base_pin import BasePin
from .errors import BadRequest
from .index_url import netrc, parse_index_url
from .layers import wheel_groups
from .lockfile import PLATFORMS as LOCK_PLATFORMS
from .lockfile import Lock, LockSet, check_extras, index_args, parse_extras, requirements
from .matrix import Matrix
from .resolve import BuildSpec
from .output import write_tree
from .resources import smoke_tests_dir, templates_dir
from .tags import image_ref, labels_for, primary_tag, tags_for
from .variants import variant

USER_NAME, USER_ID = "torch", 1000
VENV = "/opt/venv"
WORKSPACE = "/workspace"  # every variant's working directory and Jupyter's root
HOME = f"/home/{USER_NAME}"
# torch.compile's caches (Inductor's FX graphs and kernels, Triton's), CUDA's PTX JIT cache and
# torch.hub's checkpoints, in one folder that one volume keeps across containers (`docker run -v
# torch-cache:COMPILE_CACHE`; Docker seeds a new named volume from it, mode 1777 included). The
# user's cache home, torch's own default TORCH_HOME for that user, rather than WORKSPACE: people
# bind-mount their project over /workspace, and compiled kernels do not belong among its files.
COMPILE_CACHE = f"{HOME}/.cache/torch"
ENTRYPOINT = ("/usr/bin/tini", "-g", "--", "/usr/local/bin/imagebuilder-entrypoint")
SESSION_ENV = "/etc/profile.d/00-container-env.sh"  # the container's environment, for SSH sessions
# Files the image carries at these paths (context folder rootfs/), rendered from templates/.
ROOTFS_TEMPLATES = {"usr/local/bin/imagebuilder-entrypoint": "entrypoint.sh.j2"}
SSH_ROOTFS_TEMPLATES = {"usr/local/bin/ssh-server": "ssh-server.sh.j2",
                        "etc/ssh/sshd_config.d/imagebuilder.conf": "sshd.conf.j2"}
# jupyter, devel-jupyter: Jupyter's settings, in its system-wide config folder (read before the
# user's ~/.jupyter, so a user's own file still wins).
JUPYTER_ROOTFS_TEMPLATES = {"etc/jupyter/jupyter_server_config.py": "jupyter_server_config.py.j2"}
# TensorBoard behind Jupyter's auth, at <base_url>/TENSORBOARD_PATH/ (jupyter-server-proxy's server
# name, and TensorBoard's --path_prefix). Its logdir is SummaryWriter's default `runs/` relative to
# the WORKDIR, where a project mounted at WORKSPACE keeps it.
TENSORBOARD_PATH = "tensorboard"
TENSORBOARD_LOGDIR = f"{WORKSPACE}/runs"
# How long the proxy waits for TensorBoard to answer at its start: its default, 5 s, is about what
# TensorBoard took here on a busy 2-core machine, too tight for a cold one.
TENSORBOARD_START_TIMEOUT_S = 60
CA_PATH = "/etc/imagebuilder/ca-bundle.pem"
DEFAULT_SOURCE = "imagebuilder"


class RenderError(BadRequest):
    """The render request cannot be carried out (an unreadable --ca-bundle, say)."""


class CredentialsNeedBuildKit(BadRequest):
    template = ("the index URL carries a user or password, which the classic builder would write into the "
                "image's history; use --builder buildkit (they reach the build as a secret) or an index without them")


@dataclass(frozen=True)
class RenderOptions:
    repository: str = "pytorch"
    index_url: str | None = None  # replaces the wheel variant's index (mirrors, air-gapped sites)
    extra_index_urls: tuple[str, ...] = ()
    ca_bundle: Path | None = None  # trusted inside the build only
    python_mirror: str | None = None  # where `uv python install` downloads CPython (UV_PYTHON_INSTALL_MIRROR)
    source: str = DEFAULT_SOURCE  # labels.SOURCE
    buildkit: bool = False  # for the BuildKit builder: the CA mounted per RUN, shared cache mounts
    # BuildKit through buildx: the CA bundle as a named build context (CA_CONTEXT), bind-mounted,
    # not a secret. A secret mount delays every RUN that has one by seconds, growing with the
    # layers below it (measured: 25 s over the eight torch layers); a bind mount does not.
    ca_context: bool = False
    extras: tuple[str, ...] = ()  # --with: added to the image's lock (besides matrix.yaml's extras)
    locks: LockSet = LockSet()  # locks/ beside the matrix; empty: resolve at build time
    # The image's platform when BuildKit builds it on a host of another (linux/arm64 on an amd64
    # host): its wheels install on the host, natively, instead of under emulation.
    foreign_platform: str | None = None


@dataclass(frozen=True)
class RenderedImage:
    spec: BuildSpec
    repository: str
    tags: tuple[str, ...]
    dockerfile: str
    files: Mapping[str, bytes] = field(repr=False)  # context files besides the Dockerfile
    labels: Mapping[str, str] = field(repr=False)
    inputs_hash: str = ""
    base_image: str = ""  # the FROM image; for jupyter, our runtime image
    trusts_ca_bundle: bool = False  # built with --ca-bundle
    secrets: Mapping[str, bytes] = field(default_factory=dict, repr=False)  # BuildKit secrets by id
    # Named build contexts (buildx's --build-context NAME=DIR): folders of `files` that no COPY
    # takes, each passed by its name; the CA bundle's (CA_CONTEXT) when ca_context.
    contexts: tuple[str, ...] = ()
    lock: Lock | None = field(default=None, repr=False)  # None: resolved at build time
    base_pin: BasePin | None = None  # how the FROM image is pinned (None for jupyter)
    notices: tuple[str, ...] = ()  # the spec's, and what is not pinned

    @property
    def refs(self) -> tuple[str, ...]:
        return tuple(image_ref(self.repository, t) for t in self.tags)

    @property
    def ref(self) -> str:
        return self.refs[0]

    @property
    def depends_on(self) -> str | None:
        """The image this one is built FROM when that image is one of ours (jupyter)."""
        return self.base_image if self.spec.parent is not None else None

    def write(self, directory: Path) -> None:
        """Write the build context into `directory` (empty, or written by imagebuilder)."""
        write_tree(directory, {**self.files, "Dockerfile": self.dockerfile.encode()})


@lru_cache(maxsize=4)
def _environment(template_root: str) -> Any:
    import jinja2  # here, not at the top: `imagebuilder --help` should not pay for it

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_root),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


@lru_cache(maxsize=1)
def _smoke_test_files() -> tuple[tuple[str, bytes], ...]:
    root = smoke_tests_dir()
    return tuple(
        (f"imagebuilder/smoke_tests/{p.relative_to(root).as_posix()}", p.read_bytes())
        for p in sorted(root.rglob("*.py"))
    )


def _python_path(spec: BuildSpec) -> str:
    return f"{VENV}/lib/python{spec.python}/site-packages"


def _apt_packages(spec: BuildSpec, stage: str) -> list[str]:
    # python3 and its venv module bootstrap uv.
    packages = ["ca-certificates", "python3", "python3-venv"]
    if stage == "wheels":
        return packages
    packages.append("g++")  # torch.compile (Inductor, Triton) needs a C/C++ compiler
    packages.append("tini")  # PID 1: forwards signals, reaps zombies, passes exit codes on
    if spec.python_from_os:
        packages.append("python3-dev")  # headers: Triton and Inductor build Python extensions
    packages += variant(spec.variant).packages
    if spec.torch.torchcodec_for(spec.python) is not None:
        packages += spec.os.ffmpeg  # the shared libraries torchcodec loads
    if _has_ssh(spec):
        packages.append("openssh-server")
    return sorted(packages)


def _has_ssh(spec: BuildSpec) -> bool:
    """The devel images (and devel-jupyter, built FROM them) are the ones people work in over
    SSH; `ssh-server` as the command starts it. The runtime images stay lean."""
    return variant(spec.variant).ssh


UV = "/tmp/uv"
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
# BuildKit: the CA bundle is mounted for one RUN only (in no layer, no history, no ENV), and
# the package caches (apt's downloads, uv itself, the additions' wheels) live in cache mounts
# every image built on the host shares; the ids are the same for every image. The wheel
# groups' RUNs keep uv's cache in their layer instead (GROUP_UV_CACHE).
CA_SECRET_ID = "ca"
CA_SECRET_PATH = f"/run/secrets/{CA_SECRET_ID}"  # where a RUN reads the CA bundle, secret or bind mount
CA_CONTEXT = "imagebuilder-ca"  # the named build context holding it as CA_CONTEXT_FILE (ca_context)
CA_CONTEXT_FILE = "ca.pem"
NETRC_SECRET_ID = "index-netrc"  # the index URLs' credentials: uv reads the file NETRC names
NETRC_SECRET_PATH = f"/run/secrets/{NETRC_SECRET_ID}"
# What `docker build --secret id=...,src=` takes for each, as `render -o` tells its reader.
SECRET_SOURCES = {CA_SECRET_ID: "$SSL_CERT_FILE", NETRC_SECRET_ID: "$HOME/.netrc"}
CACHE_DIR = "/var/cache/imagebuilder"
APT_CACHE = f"{CACHE_DIR}/apt"
UV_CACHE = f"{CACHE_DIR}/uv"


def _cert_file(options: RenderOptions, single_stage: bool) -> str | None:
    """The CA bundle pip and uv trust in the install RUN; None: the stage's ENV names it.
    Without --ca-bundle they trust the image's own CA store (which a site's base image may
    extend) rather than their bundled roots."""
    if options.buildkit and options.ca_bundle is not None:
        return CA_SECRET_PATH
    return SYSTEM_CA if single_stage else None


# A wheel group's RUN passes cache=GROUP_UV_CACHE, link="hardlink": uv unpacks its wheels into a
# cache on the layer's own filesystem, hard-links them into the venv, and the RUN removes that
# cache, so each file is written once (a cache mount is another mount, so from there uv can only
# copy: 6 GB written twice). The cost: a second image with the same wheels on another parent
# downloads them again (BuildKit's layer cache serves the same parent).
GROUP_UV_CACHE = f"{VENV}/.uv-cache"


def _uv_env(options: RenderOptions, single_stage: bool, cache: str = UV_CACHE, link: str = "copy") -> str:
    """Environment of the install RUN; BuildKit: uv's cache at `cache` (the shared cache mount by
    default), files put into place by `link` (uv's link mode)."""
    if options.buildkit:
        env = (f"export UV_CACHE_DIR={cache} UV_PYTHON_CACHE_DIR={UV_CACHE}/python "
               f"UV_LINK_MODE={link} UV_PYTHON_INSTALL_DIR=/opt/python PIP_NO_CACHE_DIR=1")
    else:
        env = "export UV_NO_CACHE=1 UV_LINK_MODE=copy UV_PYTHON_INSTALL_DIR=/opt/python PIP_NO_CACHE_DIR=1"
    cert = _cert_file(options, single_stage)
    netrc_file = f" NETRC={NETRC_SECRET_PATH}" if index_netrc(options) else ""
    return env + (f" SSL_CERT_FILE={cert} PIP_CERT={cert}" if cert else "") + netrc_file


def _apt_mount(machine: str | None = None) -> str:
    """BuildKit's `RUN --mount=...` prefix of an apt RUN: the host's apt cache, or `machine`'s
    (an emulated apt holds its own, so that it does not lock the host's for minutes)."""
    cache_id = "imagebuilder-apt" + (f"-{machine}" if machine else "")
    return f"--mount=type=cache,id={cache_id},target={APT_CACHE},sharing=locked \\\n    "


def _mounts(options: RenderOptions) -> tuple[str, str]:
    """BuildKit's `RUN --mount=...` prefixes of the image's apt RUN and of the install RUN."""
    if not options.buildkit:
        return "", ""
    apt = _apt_mount()
    install = [f"--mount=type=cache,id=imagebuilder-uv,target={UV_CACHE},uid={USER_ID},gid={USER_ID}"]
    if options.ca_bundle is not None and options.ca_context:
        # Read-only, from outside the context's COPYs: in no layer and no history entry.
        install.append(f"--mount=type=bind,from={CA_CONTEXT},source={CA_CONTEXT_FILE},target={CA_SECRET_PATH}")
    elif options.ca_bundle is not None:
        install.append(f"--mount=type=secret,id={CA_SECRET_ID},target={CA_SECRET_PATH},"
                       f"uid={USER_ID},required=true")
    if index_netrc(options):
        install.append(f"--mount=type=secret,id={NETRC_SECRET_ID},target={NETRC_SECRET_PATH},"
                       f"uid={USER_ID},required=true")
    return apt, "".join(f"{m} \\\n    " for m in install)


def _apt_options(options: RenderOptions) -> str:
    # Outside /var/cache/apt/archives, which the docker-clean hook of Debian/Ubuntu images
    # empties after every install: the .debs stay in the cache mount for the next image.
    if not options.buildkit:
        return ""
    return f" -o Dir::Cache::Archives={APT_CACHE} -o APT::Keep-Downloaded-Packages=true"


def _index_args(spec: BuildSpec, options: RenderOptions) -> list[str]:
    """The index options of a RUN line: each URL without its user and password (those reach
    the build as the netrc secret) and quoted for the shell."""
    return [f"{option} {shlex.quote(parse_index_url(value).public if option.endswith('-url') else value)}"
            for option, value in index_args(spec, options.index_url, options.extra_index_urls)]


def index_netrc(options: RenderOptions) -> bytes:
    """The netrc secret of the index URLs' credentials; empty when they carry none."""
    return netrc(parse_index_url(url) for url in (options.index_url, *options.extra_index_urls) if url)


def _pip_install(args: list[str]) -> str:
    return f"{UV}/bin/uv pip install --python {VENV}/bin/python" + "".join(f" \\\n        {a}" for a in args)


LOCK_PATH = "/opt/imagebuilder/requirements.lock"  # runtime/devel: the whole venv
JUPYTER_LOCK_PATH = "/opt/imagebuilder/jupyter.lock"  # jupyter: what it adds to its runtime's
CONSTRAINTS_PATH = "/opt/imagebuilder/constraints.txt"
SBOM_PATH = "/opt/imagebuilder/sbom.cdx.json"


def _install_from(lock: Lock | None, path: str, spec: BuildSpec, matrix: Matrix, options: RenderOptions,
                  extras: tuple[str, ...]) -> str:
    """Exactly the lock when there is one (no resolution in the build); else resolve now."""
    index = _index_args(spec, options)
    if lock is not None:
        return _pip_install(index + ["--require-hashes --no-deps", f"-r {path}"])
    return _pip_install(index + requirements(spec, matrix, extras))


def _install_commands(spec: BuildSpec, matrix: Matrix, options: RenderOptions, single_stage: bool,
                      lock: Lock | None, extras: tuple[str, ...], lock_path: str = LOCK_PATH) -> list[str]:
    """The one RUN that makes the venv: uv comes and goes within it."""
    commands = [_uv_env(options, single_stage), f"python3 -m venv {UV}", f"{UV}/bin/pip install --no-cache-dir uv=={matrix.tools.uv}"]
    python = f"/usr/bin/python{spec.python}" if spec.python_from_os else str(spec.python)
    if not spec.python_from_os:
        mirror = f"UV_PYTHON_INSTALL_MIRROR={shlex.quote(options.python_mirror)} " if options.python_mirror else ""
        commands.append(f"{mirror}{UV}/bin/uv python install {spec.python}")
    # --allow-existing: in a single stage the (empty) venv folder is made beforehand, owned by the user.
    # With a lock, no --seed: pip and setuptools come from the lock, so nothing in the venv floats.
    seed = "" if lock is not None else " --seed"
    commands.append(f"{UV}/bin/uv venv{seed} --allow-existing --python {python} {VENV}")
    commands.append(_install_from(lock, lock_path, spec, matrix, options, extras))
    if spec.toolchain == "pip":
        # torch.utils.cpp_extension links -lcudart; the wheel ships only the versioned soname.
        lib = f"{_python_path(spec)}/nvidia/cu{spec.cuda.major}/lib"
        commands.append(f"ln -s libcudart.so.{spec.cuda.major} {lib}/libcudart.so")
    commands.append(f"rm -rf {UV}")
    return commands


def _jupyter_commands(spec: BuildSpec, matrix: Matrix, options: RenderOptions, single_stage: bool,
                      lock: Lock | None) -> list[str]:
    """Add JupyterLab (and what notebook users expect beside it) to the venv without changing
    anything already in it: with a lock, its additions only (--no-deps); without one,
    everything installed is pinned to what is there."""
    bootstrap = [_uv_env(options, single_stage),
                 f"{VENV}/bin/python -m pip install --no-cache-dir --target {UV} uv=={matrix.tools.uv}"]
    if lock is not None:
        return bootstrap + [_install_from(lock, JUPYTER_LOCK_PATH, spec, matrix, options, ()), f"rm -rf {UV}"]
    return bootstrap + [
        f"{UV}/bin/uv pip freeze --python {VENV}/bin/python > /tmp/constraints.txt",
        _pip_install(["--constraint /tmp/constraints.txt"]
                     + _index_args(spec, options) + requirements(spec, matrix)),
        f"rm -rf {UV} /tmp/constraints.txt",
    ]


LAYERS_DIR = "imagebuilder/layers"  # the wheel groups' locks, in the context; bind-mounted, in no layer
LAYERS_MOUNT = "/run/imagebuilder/layers"
ADDED_LOCK_PATH = "/opt/imagebuilder/added.lock"  # what a devel image adds on top of it
# The time every file of the torch layer carries (1980-01-01, the earliest a zip entry can
# hold): with it the layer's bytes depend on the lock alone, not on when it was built.
LAYER_EPOCH = 315532800
NATIVE_DIR = "/opt/imagebuilder-native"  # in the native-uv stage: the host's uv, its loader and libraries
NATIVE_MOUNT = "/run/imagebuilder/native"  # where the image's torch RUNs mount NATIVE_DIR (in no layer)


@dataclass(frozen=True)
class SharedVenv:
    """One torch layer per lock: the image's own RUN installs the runtime lock into the venv
    and fixes every file's time, touching nothing outside the venv, so the layer's bytes are
    the same in every image of that lock on the same OS and Python (runtime, devel, the images
    of other CUDA versions with the same wheels), whatever is below it: the registry stores it
    once, a node that has it pulls only the rest, and the venv is written once per build."""

    lock: Lock
    """The runtime lock: the layer's whole content."""
    added: Lock | None
    """devel: the pins its lock has beyond the runtime lock, installed on top; None: runtime."""


def shared_venv(spec: BuildSpec, matrix: Matrix, options: RenderOptions, lock: Lock | None,
                extras: tuple[str, ...]) -> SharedVenv | None:
    """The image's torch layer, or None where it takes the plain single-stage install: the
    classic builder, a jupyter image (its torch is its parent's), an image without a lock, or
    a devel lock that does not contain its runtime lock pin for pin."""
    if not options.buildkit or spec.parent is not None or lock is None:
        return None
    if not variant(spec.variant).toolchain:
        return SharedVenv(lock, None)
    runtime_lock = options.locks.lock_for(replace(spec, variant="runtime", toolchain="none"), matrix, extras)
    if runtime_lock is None or not set(runtime_lock.pins) <= set(lock.pins):
        return None
    added = tuple(p for p in lock.pins if p not in set(runtime_lock.pins))
    return SharedVenv(runtime_lock, replace(lock, name=f"{lock.name}-added", pins=added))


@dataclass(frozen=True)
class TorchLayer:
    """One wheel group's RUN: its mounts (the install's, its lock, a tmpfs /tmp) and commands."""

    name: str
    mounts: str
    commands: tuple[str, ...]


@dataclass(frozen=True)
class NativeInstall:
    """A foreign platform's wheels installed by the build host's own uv: the Dockerfile's
    native-uv stage (the host's platform) holds uv with its loader and libraries, and the
    image's torch RUNs run it from a mount, natively, targeting the image's platform."""
    platform: str  # the image's, e.g. linux/arm64
    uv_platform: str  # uv's --python-platform for it: the tag its lock was resolved for
    dir: str = NATIVE_DIR
    mount: str = NATIVE_MOUNT


def native_install(spec: BuildSpec, options: RenderOptions, venv: SharedVenv | None) -> NativeInstall | None:
    """How a foreign platform's wheels install natively, or None where they install in the
    image's own RUNs: the host's platform, the classic builder, no shared venv, or a Python
    that uv installs (that would be the host's, not the image's)."""
    if options.foreign_platform is None or venv is None or not options.buildkit or not spec.python_from_os:
        return None
    return NativeInstall(options.foreign_platform, LOCK_PLATFORMS[options.foreign_platform])


def _uv_bootstrap(matrix: Matrix) -> str:
    """Sets $uv: the host's uv from the cache mount, fetched into it once per machine type (the
    cache mount is the host's, whatever platform the image is for)."""
    uv = "$uv"
    return (f"uv={UV_CACHE}/bin/uv-{matrix.tools.uv}-$(uname -m) && {{ [ -x {uv} ] || {{ python3 -m venv {UV} "
            f"&& {UV}/bin/pip install --no-cache-dir uv=={matrix.tools.uv} && install -D {UV}/bin/uv {uv}.$$ "
            f"&& mv -f {uv}.$$ {uv}; }}; }}")


def native_uv_run(matrix: Matrix, options: RenderOptions, install_mounts: str, native: NativeInstall) -> TorchLayer:
    """The native-uv stage's RUN: the host's uv, its dynamic loader and the libraries it links,
    copied to native.dir, so that a RUN of the foreign image runs it as `ld.so --library-path
    lib uv` (the image's root has no loader of the host's platform); checked to run."""
    d = native.dir
    commands = (_uv_env(options, True), _uv_bootstrap(matrix),
                f"install -d {d}/lib && install -m 755 $uv {d}/uv",
                f"cp -L \"$(ldd $uv | awk 'index($1, \"/\") == 1 {{print $1}}')\" {d}/ld.so",
                f"ldd $uv | awk '$2 == \"=>\" && index($3, \"/\") == 1 {{print $3}}' | xargs cp -L -t {d}/lib",
                f"{d}/ld.so --library-path {d}/lib {d}/uv --version")
    return TorchLayer("native-uv", install_mounts + "--mount=type=tmpfs,target=/tmp \\\n    ", commands)


def _torch_layers(spec: BuildSpec, matrix: Matrix, options: RenderOptions, venv: SharedVenv,
                  install_mounts: str, native: NativeInstall | None = None) -> list[TorchLayer]:
    """The runtime lock as its wheel groups' layers (layers.py), one RUN each. Each touches only
    the venv (the lock is bind-mounted, /tmp a tmpfs) and gives what it wrote a fixed time, so a
    layer's bytes depend on its pins, the OS's Python and nothing else. uv is fetched once per
    host into its cache mount (a RUN finds it there, or bootstraps it), not once per layer; for
    a foreign platform the RUNs run the host's uv from the native-uv stage, natively."""
    uv = "$uv"
    if native:
        m = native.mount
        find_uv = f'uv="{m}/ld.so --library-path {m}/lib {m}/uv"'
        native_mount = f"--mount=type=bind,from=native-uv,source={native.dir},target={m} \\\n    "
    else:
        find_uv, native_mount = _uv_bootstrap(matrix), ""
    python = f"/usr/bin/python{spec.python}" if spec.python_from_os else str(spec.python)
    trees = VENV + ("" if spec.python_from_os else " /opt/python")
    index = _index_args(spec, options)
    layers = []
    for n, group in enumerate(wheel_groups(venv.lock)):
        commands = [_uv_env(options, True, cache=GROUP_UV_CACHE, link="hardlink"), "touch /tmp/.layer-start", find_uv]
        if n == 0:
            if not spec.python_from_os:
                mirror = f"UV_PYTHON_INSTALL_MIRROR={shlex.quote(options.python_mirror)} " if options.python_mirror else ""
                commands.append(f"{mirror}{uv} python install {spec.python}")
            commands.append(f"{uv} venv --allow-existing --python {python} {VENV}")
        target = [f"--python-platform {native.uv_platform}"] if native else []
        commands.append(f"{uv} pip install --python {VENV}/bin/python" + "".join(
            f" \\\n        {a}" for a in [*target, *index, "--require-hashes --no-deps",
                                            f"-r {LAYERS_MOUNT}/{group.filename}"]))
        commands.append(f"rm -rf {GROUP_UV_CACHE}")
        commands.append(f"find {trees} -cnewer /tmp/.layer-start -exec touch -h -d @{LAYER_EPOCH} {{}} +")
        mounts = (install_mounts + native_mount + f"--mount=type=bind,source={LAYERS_DIR}/{group.filename},"
                  f"target={LAYERS_MOUNT}/{group.filename} \\\n    --mount=type=tmpfs,target=/tmp \\\n    ")
        layers.append(TorchLayer(group.name, mounts, tuple(commands)))
    return layers


def _added_commands(spec: BuildSpec, matrix: Matrix, options: RenderOptions) -> list[str]:
    """devel on the shared venv: its lock's additions (ninja, the nvcc wheels) on top."""
    commands = [_uv_env(options, True),
                f"{VENV}/bin/python -m pip install --no-cache-dir --target {UV} uv=={matrix.tools.uv}",
                _pip_install(_index_args(spec, options)
                             + ["--require-hashes --no-deps", f"-r {ADDED_LOCK_PATH}"])]
    if spec.toolchain == "pip":
        lib = f"{_python_path(spec)}/nvidia/cu{spec.cuda.major}/lib"
        commands.append(f"ln -s libcudart.so.{spec.cuda.major} {lib}/libcudart.so")
    commands.append(f"rm -rf {UV}")
    return commands


def _constraints(spec: BuildSpec, lock: Lock | None) -> str:
    """The in-image pins that keep a later `pip install` from replacing torch's CUDA build."""
    if lock is not None:
        return lock.constraints()
    pins = [("torch", spec.torch.version), ("torchvision", spec.torch.torchvision),
            ("torchaudio", spec.torch.torchaudio), ("triton", spec.torch.triton),
            ("torchcodec", spec.torch.torchcodec_for(spec.python))]
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins) if version is not None)


def require_cuda(spec: BuildSpec) -> str:
    """The NVIDIA runtime's guard: admit every driver the image's wheels run on.

    Through minor-version compatibility the cu12x wheels run on any driver that supports
    CUDA 12.0 (>= 525.60.13, the matrix's min_driver_compat), cu13x on any 13.0 driver
    (>= 580.65.06); the toolkit's own minor (cuda>=12.8) would refuse the 535 and 550
    branches most clusters run. The runtime compares `cuda` with the driver's CUDA version
    (cuDriverGetVersion), so the guard is the major's first release: that is the
    compatibility floor, stated in the one unit every toolkit release parses (driver>=
    with a zero-padded "580.65.06" is invalid semver to the Go runtime). nvidia/cuda's
    brand=...,driver>=470 clauses are not kept: they admit older drivers through the
    forward-compatibility libraries, which the torch wheels do not load. Above the floor
    but below the toolkit's own driver, PTX JIT is unavailable; verify and the smoke tests'
    cuda check judge that per GPU, and hold the exact floor (11.x's 450.80.02 lies inside
    the CUDA 11.0 driver range, which cuda>=11.0 admits from 450.36.06).
    """
    return f"cuda>={spec.cuda.major}.0"


def _env(spec: BuildSpec) -> list[tuple[str, str]]:
    cuda_home = None
    if variant(spec.variant).toolchain:
        cuda_home = f"{_python_path(spec)}/nvidia/cu{spec.cuda.major}" if spec.toolchain == "pip" else "/usr/local/cuda"
    # One PATH entry: within one ENV instruction $PATH expands to the value before it.
    path = f"{VENV}/bin:" + (f"{cuda_home}/bin:" if cuda_home else "") + "$PATH"
    env = [
        ("VIRTUAL_ENV", VENV),
        ("PATH", path),
        # Read by the NVIDIA container runtime: inject the driver, refuse too-old drivers.
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        ("NVIDIA_REQUIRE_CUDA", require_cuda(spec)),
        ("PYTHONUNBUFFERED", "1"),
        # Not under /tmp/torchinductor_<user> and ~/.triton of a container that dies: COMPILE_CACHE.
        ("TORCH_HOME", COMPILE_CACHE),
        ("TORCHINDUCTOR_CACHE_DIR", f"{COMPILE_CACHE}/inductor"),
        ("TRITON_CACHE_DIR", f"{COMPILE_CACHE}/triton"),
        # CUDA's PTX JIT cache: a GPU newer than the wheels' cubins JIT-compiles at every start without it.
        ("CUDA_CACHE_PATH", f"{COMPILE_CACHE}/nv"),
        # pip and uv read these: a later install that wants another torch fails with the
        # resolver's conflict instead of replacing the image's CUDA build (README: opting out).
        ("PIP_CONSTRAINT", CONSTRAINTS_PATH),
        ("UV_CONSTRAINT", CONSTRAINTS_PATH),
    ]
    if cuda_home:
        env.append(("CUDA_HOME", cuda_home))
    return env


def manifest_for(spec: BuildSpec, matrix: Matrix, inputs_hash: str, tags: Iterable[str], base_image: str,
                 matrix_name: str | None = None) -> dict[str, object]:
    """What /opt/imagebuilder/manifest.json holds: the resolved spec, read by smoke_tests."""
    return {
        "schema": 1,
        "torch": str(spec.torch.version),
        "torchvision": str(spec.torch.torchvision),
        "torchaudio": str(spec.torch.torchaudio) if spec.torch.torchaudio else None,
        "triton": str(spec.torch.triton) if spec.torch.triton else None,
        "torch_cuda": str(spec.wheel.cuda),
        "wheel": spec.wheel.name,
        "cudnn": str(spec.wheel.cudnn),
        "nccl": str(spec.wheel.nccl),
        "python": str(spec.python),
        "variant": spec.variant,
        "os": spec.os.name,
        "image_cuda": str(spec.cuda.key),
        "image_cuda_version": str(spec.cuda.version),
        "min_driver": str(spec.min_driver),
        "min_driver_compat": str(spec.cuda.min_driver_compat),
        "base_image": base_image,
        "toolchain": spec.toolchain,
        "tags": list(tags),
        "inputs_hash": inputs_hash,
        "matrix": matrix.path.name if matrix_name is None else matrix_name,
    }


def _hash(dockerfile: str, files: Mapping[str, bytes], *extra: str) -> str:
    digest = hashlib.sha256(dockerfile.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    for value in extra:
        digest.update(value.encode() + b"\0")
    return digest.hexdigest()


def _hashed(name: str) -> bool:
    """The smoke tests are lent to the image at verify time (publish mounts the current ones),
    so editing them rebuilds nothing; the image's own copy is as of its build."""
    return not name.startswith("imagebuilder/smoke_tests/")


@dataclass(frozen=True)
class _Naming:
    """What names an image without changing its content: left out of the inputs hash."""

    tags: tuple[str, ...]
    generator: str
    matrix_name: str
    source: str


def _sbom_file() -> bytes:
    return (Path(__file__).parent / "sbom.py").read_bytes()


NO_NVCC = "imagebuilder: no nvcc in --base-image"  # engine.errors recognises a build that stopped here


def nvcc_check(spec: BuildSpec) -> str | None:
    """A devel image on a --base-image that must bring nvcc: the shell test its first step runs,
    so a base without the compiler fails in seconds, not after the install (or at verify)."""
    if spec.variant != "devel" or spec.toolchain != "base" or spec.base_is_default:
        return None
    nvcc = "/usr/local/cuda/bin/nvcc"
    return (f"{nvcc} --version 2>/dev/null | grep -q 'release {spec.cuda.key},' || {{ echo "
            f"\"{NO_NVCC} {spec.base_image}: a CUDA {spec.cuda.key} devel image needs nvcc {spec.cuda.key} at {nvcc} "
            f"(NVIDIA's nvidia/cuda:{spec.cuda.version}-devel-* images have it)\" >&2; exit 1; }}")


PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


def read_certificates(path: Path, option: str, advice: str) -> bytes:
    """The bytes of a CA file (--ca-bundle, --registry-ca), refused (exit 2) unless OpenSSL reads
    PEM certificates in it: an empty or wrong file, or BEGIN/END lines around anything else, would
    otherwise surface later as a TLS failure (minutes into a build, or as a registry "not answering")."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RenderError(f"cannot read {option} {path}: {e.strerror}; {advice}") from e
    if PEM_CERTIFICATE not in data:
        raise RenderError(f"{option} {path} holds no PEM certificate ({PEM_CERTIFICATE.decode()} ...); {advice}")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii", "replace"))
    except ssl.SSLError as e:
        raise RenderError(f"{option} {path} holds a PEM block that is not a certificate OpenSSL can read "
                          f"({e.reason or e.strerror or e}); {advice}") from e
    return data


def read_ca_bundle(path: Path) -> bytes:
    return read_certificates(path, "--ca-bundle", "pass the proxy's CA bundle, e.g. $SSL_CERT_FILE")


def render(spec: BuildSpec, matrix: Matrix, options: RenderOptions = RenderOptions()) -> RenderedImage:
    env = _environment(str(templates_dir()))
    tags = tags_for(spec, matrix)
    extras = parse_extras((*matrix.extras, *options.extras))
    lock = options.locks.lock_for(spec, matrix, extras)
    check_extras(spec, extras, lock)
    base_pin: BasePin | None = None
    parent_hash = ""
    if spec.parent is not None:
        # FROM our runtime image by tag: what defines that image is its own inputs hash.
        base_image = from_ref = image_ref(options.repository, primary_tag(spec.parent, matrix))
        parent_hash = render(spec.parent, matrix, options).inputs_hash
    else:
        base_pin = options.locks.base_for(spec.base_image)
        base_image, from_ref = spec.base_image, base_pin.from_ref
    notices = list(spec.notices)
    if lock is None:
        notices.append("no lock for this image in locks/: the build resolves its dependencies "
                       "(run `imagebuilder lock` to pin them)")
    if base_pin is not None and not base_pin.identity:
        notices.append(f"base image {base_image} has no digest in locks/base-images.json: FROM by tag")
    files: dict[str, bytes] = dict(_smoke_test_files())
    files["imagebuilder.pth"] = b"/opt/imagebuilder\n"  # makes `python -m smoke_tests` work
    files["imagebuilder/sbom.py"] = _sbom_file()
    lock_path = JUPYTER_LOCK_PATH if spec.parent is not None else LOCK_PATH
    if lock is not None:
        files[lock_path.replace("/opt/", "", 1)] = lock.text().encode()
    if spec.parent is None:
        files["imagebuilder/constraints.txt"] = _constraints(spec, lock).encode()
    ca = None
    two_stage = options.ca_bundle is not None and not options.buildkit
    venv = shared_venv(spec, matrix, options, lock, extras)
    if venv is not None:
        files.update({f"{LAYERS_DIR}/{group.filename}": group.lock.text().encode()
                      for group in wheel_groups(venv.lock)})
        if venv.added is not None:
            files[ADDED_LOCK_PATH.replace("/opt/", "", 1)] = venv.added.text().encode()
    credentials = index_netrc(options)
    if credentials and not options.buildkit:
        raise CredentialsNeedBuildKit()
    apt_mounts, install_mounts = _mounts(options)
    native = native_install(spec, options, venv)
    native_apt_mounts = apt_mounts
    if native is not None:
        # apt's cache mount is locked while one apt runs: the image's apt, emulated, takes one of
        # its own machine type's, so that the native stage's apt does not wait minutes for it.
        apt_mounts = _apt_mount(native.platform.rpartition("/")[2])
        notices.append(f"{native.platform} on a host of another platform: its wheels install natively "
                       f"(uv --python-platform {native.uv_platform}); apt, the SBOM and what runs the image's "
                       "own programs run under emulation")
    elif options.foreign_platform is not None:
        notices.append(f"{options.foreign_platform} on a host of another platform: every step runs under "
                       "emulation (the wheels install natively only with BuildKit, the shared venv and "
                       "the OS's Python)")
    if options.ca_bundle is not None:
        ca = read_ca_bundle(options.ca_bundle)

    def render_with(inputs_hash: str, naming: _Naming) -> tuple[str, dict[str, bytes]]:
        labels = labels_for(spec, base_image, inputs_hash, naming.source, base_pin.digest if base_pin else None)
        manifest = manifest_for(spec, matrix, inputs_hash, naming.tags, base_image, naming.matrix_name)
        context = {
            "generator": naming.generator,
            "matrix_name": naming.matrix_name,
            "spec": spec,
            "notices": notices,
            "tags": naming.tags,
            "base_image": from_ref,
            "base_pin": base_pin,
            "two_stage": two_stage,
            "nvcc_check": nvcc_check(spec),
            "shared_venv": venv is not None,
            "added_lock_path": ADDED_LOCK_PATH,
            "added": venv is not None and venv.added is not None,
            "torch_layers": [] if venv is None else _torch_layers(spec, matrix, options, venv, install_mounts, native),
            "native": native,
            "native_uv": native_uv_run(matrix, options, install_mounts, native) if native else None,
            "native_apt_mounts": native_apt_mounts,
            "layer_epoch": LAYER_EPOCH,
            "added_commands": _added_commands(spec, matrix, options) if venv and venv.added else [],
            "ca_path": CA_PATH,
            "buildkit": options.buildkit,
            "ca_secret": options.buildkit and ca is not None,
            "ca_context": options.buildkit and ca is not None and options.ca_context,
            "apt_mounts": apt_mounts,
            "apt_options": _apt_options(options),
            "install_mounts": install_mounts,
            "lock_path": lock_path if lock is not None else None,
            "sbom_command": f"{VENV}/bin/python /opt/imagebuilder/sbom.py {VENV} {SBOM_PATH}",
            "install_commands": _install_commands(spec, matrix, options, not two_stage, lock, extras),
            "jupyter_commands": _jupyter_commands(spec, matrix, options, not two_stage, lock),
            "build_packages": _apt_packages(spec, "wheels"),
            "final_packages": _apt_packages(spec, "final"),
            "python": str(spec.python),
            "python_path": _python_path(spec),
            "venv": VENV,
            "env": _env(spec),
            "labels": [(k, json.dumps(v)) for k, v in labels.items()],
            "user": USER_NAME,
            "uid": USER_ID,
            "workspace": WORKSPACE,
            "home": HOME,
            "compile_cache": COMPILE_CACHE,
            "entrypoint": json.dumps(list(ENTRYPOINT)),
            "ssh": _has_ssh(spec),
            "run_as_root": variant(spec.variant).root,
            "cmd": json.dumps(list(variant(spec.variant).cmd)),
            "session_env_file": SESSION_ENV,
            "shm_floor": NCCL_SHM_MIN_BYTES,
            "shm_advice": SHM_ADVICE,
            # bash reads bash.bashrc for `ssh HOST CMD` too; its first line runs before the
            # file returns for non-interactive shells.
            "session_env": f'[ -n "${{SSH_CONNECTION:-}}" ] && [ -r {SESSION_ENV} ] && . {SESSION_ENV}',
            "tensorboard_path": TENSORBOARD_PATH,
            "tensorboard_logdir": TENSORBOARD_LOGDIR,
            "tensorboard_start_timeout": TENSORBOARD_START_TIMEOUT_S,
        }
        template = env.get_template("jupyter.Dockerfile.j2" if spec.parent is not None else "Dockerfile.j2")
        out = dict(files)
        if spec.parent is None:
            rootfs = {**ROOTFS_TEMPLATES, **(SSH_ROOTFS_TEMPLATES if _has_ssh(spec) else {})}
        else:  # a jupyter image has its parent's files, and adds Jupyter's settings
            rootfs = JUPYTER_ROOTFS_TEMPLATES
        out.update({f"rootfs/{path}": env.get_template(name).render(context).encode()
                    for path, name in rootfs.items()})
        out["imagebuilder/manifest.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        return template.render(context), out

    # The hash covers what defines the image's content: the Dockerfile and the files copied
    # in, rendered without the names it goes by (tags move to other images when a release
    # is added; the tool's version and the matrix's file name change no byte installed),
    # the lock (a file copied in) and the base image's digest (in FROM, or its image id).
    # publish compares it with the registry's copy.
    draft, draft_files = render_with("", _Naming((), "imagebuilder", "matrix.yaml", DEFAULT_SOURCE))
    inputs_hash = _hash(draft, {k: v for k, v in draft_files.items() if _hashed(k)},
                        base_pin.identity if base_pin else "", parent_hash)
    naming = _Naming(tags, f"imagebuilder {__version__}", matrix.path.name, options.source)
    dockerfile, final_files = render_with(inputs_hash, naming)
    secrets: dict[str, bytes] = {}
    contexts: tuple[str, ...] = ()
    if ca is not None and two_stage:
        final_files["ca-bundle.pem"] = ca
    elif ca is not None and options.ca_context:
        final_files[f"{CA_CONTEXT}/{CA_CONTEXT_FILE}"] = ca
        contexts = (CA_CONTEXT,)
    elif ca is not None:
        secrets[CA_SECRET_ID] = ca
    if credentials:
        secrets[NETRC_SECRET_ID] = credentials
    return RenderedImage(
        spec=spec,
        repository=options.repository,
        tags=tags,
        dockerfile=dockerfile,
        files=final_files,
        labels=labels_for(spec, base_image, inputs_hash, options.source, base_pin.digest if base_pin else None),
        inputs_hash=inputs_hash,
        base_image=base_image,
        trusts_ca_bundle=ca is not None,
        secrets=secrets,
        contexts=contexts,
        lock=lock,
        base_pin=base_pin,
        notices=tuple(notices),
    )
