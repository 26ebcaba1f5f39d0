"""Pure: the RUN steps that install an image's packages, as the shell text the templates lay out.

uv's environment and BuildKit's mounts (the apt and uv caches every image on the host shares,
the CA bundle and the index credentials as secrets or a named build context); the one RUN that
makes the venv, or with BuildKit and a lock the shared venv's wheel-group layers (natively, for
a foreign platform); what a jupyter or devel image adds on top.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..lock.index_url import netrc, parse_index_url
from ..lock.lockfile import Lock, LockSet, index_args, requirements
from ..matrix.model import Matrix
from ..matrix.resolve import BuildSpec
from ..matrix.variants import variant
from ..platforms import PLATFORMS
from .image_contents import JUPYTER_LOCK_PATH, LOCK_PATH, USER_ID, VENV, python_path
from .layers import wheel_groups

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


@dataclass(frozen=True)
class Installer:
    """What the install RUNs take of a render's options (RenderOptions.installer): the builder, the
    package indexes, the CA bundle, the CPython mirror."""

    buildkit: bool = False
    ca_bundle: bytes | None = None
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    python_mirror: str | None = None

    @property
    def index_urls(self) -> tuple[str | None, ...]:
        return (self.index_url, *self.extra_index_urls)


def _cert_file(buildkit: bool, ca_bundle: bytes | None, single_stage: bool) -> str | None:
    """The CA bundle pip and uv trust in the install RUN; None: the stage's ENV names it.
    Without --ca-bundle they trust the image's own CA store (which a site's base image may
    extend) rather than their bundled roots."""
    if buildkit and ca_bundle is not None:
        return CA_SECRET_PATH
    return SYSTEM_CA if single_stage else None


# A wheel group's RUN passes cache=GROUP_UV_CACHE, link="hardlink": uv unpacks its wheels into a
# cache on the layer's own filesystem, hard-links them into the venv, and the RUN removes that
# cache, so each file is written once (a cache mount is another mount, so from there uv can only
# copy: 6 GB written twice). The cost: a second image with the same wheels on another parent
# downloads them again (BuildKit's layer cache serves the same parent).
GROUP_UV_CACHE = f"{VENV}/.uv-cache"


def _uv_env(install: Installer, single_stage: bool, cache: str = UV_CACHE, link: str = "copy") -> str:
    """Environment of the install RUN; BuildKit: uv's cache at `cache` (the shared cache mount by
    default), files put into place by `link` (uv's link mode)."""
    if install.buildkit:
        env = (f"export UV_CACHE_DIR={cache} UV_PYTHON_CACHE_DIR={UV_CACHE}/python "
               f"UV_LINK_MODE={link} UV_PYTHON_INSTALL_DIR=/opt/python PIP_NO_CACHE_DIR=1")
    else:
        env = "export UV_NO_CACHE=1 UV_LINK_MODE=copy UV_PYTHON_INSTALL_DIR=/opt/python PIP_NO_CACHE_DIR=1"
    cert = _cert_file(install.buildkit, install.ca_bundle, single_stage)
    netrc_file = f" NETRC={NETRC_SECRET_PATH}" if index_netrc(install.index_urls) else ""
    return env + (f" SSL_CERT_FILE={cert} PIP_CERT={cert}" if cert else "") + netrc_file


def apt_mount(machine: str | None = None) -> str:
    """BuildKit's `RUN --mount=...` prefix of an apt RUN: the host's apt cache, or `machine`'s
    (an emulated apt holds its own, so that it does not lock the host's for minutes)."""
    cache_id = "imagebuilder-apt" + (f"-{machine}" if machine else "")
    return f"--mount=type=cache,id={cache_id},target={APT_CACHE},sharing=locked \\\n    "


def run_mounts(buildkit: bool, ca_bundle: bytes | None, ca_context: bool, credentials: bool) -> tuple[str, str]:
    """BuildKit's `RUN --mount=...` prefixes of the image's apt RUN and of the install RUN: the CA
    bundle's (a bind mount of its named context, else a secret), the index `credentials`' netrc."""
    if not buildkit:
        return "", ""
    apt = apt_mount()
    install = [f"--mount=type=cache,id=imagebuilder-uv,target={UV_CACHE},uid={USER_ID},gid={USER_ID}"]
    if ca_bundle is not None and ca_context:
        # Read-only, from outside the context's COPYs: in no layer and no history entry.
        install.append(f"--mount=type=bind,from={CA_CONTEXT},source={CA_CONTEXT_FILE},target={CA_SECRET_PATH}")
    elif ca_bundle is not None:
        install.append(f"--mount=type=secret,id={CA_SECRET_ID},target={CA_SECRET_PATH},"
                       f"uid={USER_ID},required=true")
    if credentials:
        install.append(f"--mount=type=secret,id={NETRC_SECRET_ID},target={NETRC_SECRET_PATH},"
                       f"uid={USER_ID},required=true")
    return apt, "".join(f"{m} \\\n    " for m in install)


def apt_options(buildkit: bool) -> str:
    # Outside /var/cache/apt/archives, which the docker-clean hook of Debian/Ubuntu images
    # empties after every install: the .debs stay in the cache mount for the next image.
    if not buildkit:
        return ""
    return f" -o Dir::Cache::Archives={APT_CACHE} -o APT::Keep-Downloaded-Packages=true"


def _index_args(spec: BuildSpec, install: Installer) -> list[str]:
    """The index options of a RUN line: each URL without its user and password (those reach
    the build as the netrc secret) and quoted for the shell."""
    return [f"{option} {shlex.quote(parse_index_url(value).public if option.endswith('-url') else value)}"
            for option, value in index_args(spec, install.index_url, install.extra_index_urls)]


def index_netrc(urls: Iterable[str | None]) -> bytes:
    """The netrc secret of the index URLs' credentials; empty when they carry none."""
    return netrc(parse_index_url(url) for url in urls if url)


def _pip_install(args: list[str]) -> str:
    return f"{UV}/bin/uv pip install --python {VENV}/bin/python" + "".join(f" \\\n        {a}" for a in args)


def _install_from(lock: Lock | None, path: str, spec: BuildSpec, matrix: Matrix, install: Installer,
                  extras: tuple[str, ...]) -> str:
    """Exactly the lock when there is one (no resolution in the build); else resolve now."""
    index = _index_args(spec, install)
    if lock is not None:
        return _pip_install(index + ["--require-hashes --no-deps", f"-r {path}"])
    return _pip_install(index + requirements(spec, matrix, extras))


def install_commands(spec: BuildSpec, matrix: Matrix, install: Installer, single_stage: bool,
                     lock: Lock | None, extras: tuple[str, ...], lock_path: str = LOCK_PATH) -> list[str]:
    """The one RUN that makes the venv: uv comes and goes within it."""
    commands = [_uv_env(install, single_stage), f"python3 -m venv {UV}", f"{UV}/bin/pip install --no-cache-dir uv=={matrix.tools.uv}"]
    python = f"/usr/bin/python{spec.python}" if spec.python_from_os else str(spec.python)
    if not spec.python_from_os:
        mirror = f"UV_PYTHON_INSTALL_MIRROR={shlex.quote(install.python_mirror)} " if install.python_mirror else ""
        commands.append(f"{mirror}{UV}/bin/uv python install {spec.python}")
    # --allow-existing: in a single stage the (empty) venv folder is made beforehand, owned by the user.
    # With a lock, no --seed: pip and setuptools come from the lock, so nothing in the venv floats.
    seed = "" if lock is not None else " --seed"
    commands.append(f"{UV}/bin/uv venv{seed} --allow-existing --python {python} {VENV}")
    commands.append(_install_from(lock, lock_path, spec, matrix, install, extras))
    if spec.toolchain == "pip":
        # torch.utils.cpp_extension links -lcudart; the wheel ships only the versioned soname.
        lib = f"{python_path(spec)}/nvidia/cu{spec.cuda.major}/lib"
        commands.append(f"ln -s libcudart.so.{spec.cuda.major} {lib}/libcudart.so")
    commands.append(f"rm -rf {UV}")
    return commands


def jupyter_commands(spec: BuildSpec, matrix: Matrix, install: Installer, single_stage: bool,
                     lock: Lock | None) -> list[str]:
    """Add JupyterLab (and what notebook users expect beside it) to the venv without changing
    anything already in it: with a lock, its additions only (--no-deps); without one,
    everything installed is pinned to what is there."""
    bootstrap = [_uv_env(install, single_stage),
                 f"{VENV}/bin/python -m pip install --no-cache-dir --target {UV} uv=={matrix.tools.uv}"]
    if lock is not None:
        return bootstrap + [_install_from(lock, JUPYTER_LOCK_PATH, spec, matrix, install, ()), f"rm -rf {UV}"]
    return bootstrap + [
        f"{UV}/bin/uv pip freeze --python {VENV}/bin/python > /tmp/constraints.txt",
        _pip_install(["--constraint /tmp/constraints.txt"]
                     + _index_args(spec, install) + requirements(spec, matrix)),
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


def shared_venv(spec: BuildSpec, matrix: Matrix, buildkit: bool, locks: LockSet, lock: Lock | None,
                extras: tuple[str, ...]) -> SharedVenv | None:
    """The image's torch layer, or None where it takes the plain single-stage install: the
    classic builder, a jupyter image (its torch is its parent's), an image without a lock, or
    a devel lock that does not contain its runtime lock pin for pin."""
    if not buildkit or spec.parent is not None or lock is None:
        return None
    if not variant(spec.variant).toolchain:
        return SharedVenv(lock, None)
    runtime_lock = locks.lock_for(replace(spec, variant="runtime", toolchain="none"), matrix, extras)
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


def native_install(spec: BuildSpec, foreign_platform: str | None, venv: SharedVenv | None) -> NativeInstall | None:
    """How `foreign_platform`'s wheels install natively, or None where they install in the
    image's own RUNs: the host's platform (None), no shared venv (the classic builder makes
    none), or a Python that uv installs (that would be the host's, not the image's)."""
    if foreign_platform is None or venv is None or not spec.python_from_os:
        return None
    return NativeInstall(foreign_platform, PLATFORMS[foreign_platform].uv_platform)


def _uv_bootstrap(matrix: Matrix) -> str:
    """Sets $uv: the host's uv from the cache mount, fetched into it once per machine type (the
    cache mount is the host's, whatever platform the image is for)."""
    uv = "$uv"
    return (f"uv={UV_CACHE}/bin/uv-{matrix.tools.uv}-$(uname -m) && {{ [ -x {uv} ] || {{ python3 -m venv {UV} "
            f"&& {UV}/bin/pip install --no-cache-dir uv=={matrix.tools.uv} && install -D {UV}/bin/uv {uv}.$$ "
            f"&& mv -f {uv}.$$ {uv}; }}; }}")


def native_uv_run(matrix: Matrix, install: Installer, install_mounts: str, native: NativeInstall) -> TorchLayer:
    """The native-uv stage's RUN: the host's uv, its dynamic loader and the libraries it links,
    copied to native.dir, so that a RUN of the foreign image runs it as `ld.so --library-path
    lib uv` (the image's root has no loader of the host's platform); checked to run."""
    d = native.dir
    commands = (_uv_env(install, True), _uv_bootstrap(matrix),
                f"install -d {d}/lib && install -m 755 $uv {d}/uv",
                f"cp -L \"$(ldd $uv | awk 'index($1, \"/\") == 1 {{print $1}}')\" {d}/ld.so",
                f"ldd $uv | awk '$2 == \"=>\" && index($3, \"/\") == 1 {{print $3}}' | xargs cp -L -t {d}/lib",
                f"{d}/ld.so --library-path {d}/lib {d}/uv --version")
    return TorchLayer("native-uv", install_mounts + "--mount=type=tmpfs,target=/tmp \\\n    ", commands)


def torch_layers(spec: BuildSpec, matrix: Matrix, install: Installer, venv: SharedVenv,
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
    index = _index_args(spec, install)
    layers = []
    for n, group in enumerate(wheel_groups(venv.lock)):
        commands = [_uv_env(install, True, cache=GROUP_UV_CACHE, link="hardlink"), "touch /tmp/.layer-start", find_uv]
        if n == 0:
            if not spec.python_from_os:
                mirror = f"UV_PYTHON_INSTALL_MIRROR={shlex.quote(install.python_mirror)} " if install.python_mirror else ""
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


def added_commands(spec: BuildSpec, matrix: Matrix, install: Installer) -> list[str]:
    """devel on the shared venv: its lock's additions (ninja, the nvcc wheels) on top."""
    commands = [_uv_env(install, True),
                f"{VENV}/bin/python -m pip install --no-cache-dir --target {UV} uv=={matrix.tools.uv}",
                _pip_install(_index_args(spec, install)
                             + ["--require-hashes --no-deps", f"-r {ADDED_LOCK_PATH}"])]
    if spec.toolchain == "pip":
        lib = f"{python_path(spec)}/nvidia/cu{spec.cuda.major}/lib"
        commands.append(f"ln -s libcudart.so.{spec.cuda.major} {lib}/libcudart.so")
    commands.append(f"rm -rf {UV}")
    return commands
