"""Pure: BuildSpec -> Dockerfile text and build-context files (Jinja2, StrictUndefined).

Python computes every value and list; the templates only loop and lay out. Same inputs,
same bytes: nothing here reads the clock, the environment or the host.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from smoke_tests.shm import NCCL_SHM_MIN_BYTES, SHM_ADVICE

from . import __version__
from .errors import BadRequest
from .matrix import Matrix
from .resolve import BuildSpec
from .output import write_tree
from .resources import smoke_tests_dir, templates_dir
from .tags import image_ref, labels_for, primary_tag, tags_for

USER_NAME, USER_ID = "torch", 1000
VENV = "/opt/venv"
WORKSPACE = "/workspace"  # every variant's working directory and Jupyter's root
ENTRYPOINT = ("/usr/bin/tini", "-g", "--", "/usr/local/bin/imagebuilder-entrypoint")
SESSION_ENV = "/etc/profile.d/00-container-env.sh"  # the container's environment, for SSH sessions
# Files the image carries at these paths (context folder rootfs/), rendered from templates/.
ROOTFS_TEMPLATES = {"usr/local/bin/imagebuilder-entrypoint": "entrypoint.sh.j2"}
SSH_ROOTFS_TEMPLATES = {"usr/local/bin/ssh-server": "ssh-server.sh.j2",
                        "etc/ssh/sshd_config.d/imagebuilder.conf": "sshd.conf.j2"}
CA_PATH = "/etc/imagebuilder/ca-bundle.pem"
DEFAULT_SOURCE = "imagebuilder"


class RenderError(BadRequest):
    """The render request cannot be carried out (an unreadable --ca-bundle, say)."""


@dataclass(frozen=True)
class RenderOptions:
    repository: str = "pytorch"
    index_url: str | None = None  # replaces the wheel variant's index (mirrors, air-gapped sites)
    extra_index_urls: tuple[str, ...] = ()
    ca_bundle: Path | None = None  # trusted inside the build only
    source: str = DEFAULT_SOURCE  # org.opencontainers.image.source
    buildkit: bool = False  # for the BuildKit builder: the CA as a secret, shared cache mounts


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


def _requirements(spec: BuildSpec, matrix: Matrix) -> list[str]:
    reqs = [f"torch=={spec.torch.version}", f"torchvision=={spec.torch.torchvision}"]
    if spec.torch.torchaudio is not None:
        reqs.append(f"torchaudio=={spec.torch.torchaudio}")
    if spec.variant == "devel":
        reqs.append(f"ninja=={matrix.tools.ninja}")  # torch.utils.cpp_extension builds with ninja
        if spec.toolchain == "pip":
            reqs += list(spec.cuda.pip_toolchain)
    return reqs


def _index_args(spec: BuildSpec, options: RenderOptions) -> list[str]:
    """The PyPI build of a release comes from the default index (the user's own, or a
    mirror set by --index-url); other CUDA builds come from PyTorch's wheel index."""
    index = options.index_url
    if index is None and spec.wheel.name != spec.torch.pypi_variant:
        index = spec.wheel.index
    args = [f"--index-url {index}"] if index else []
    args += [f"--extra-index-url {url}" for url in options.extra_index_urls]
    if len(args) > 1:
        args.append("--index-strategy unsafe-best-match")
    return args


def _apt_packages(spec: BuildSpec, stage: str) -> list[str]:
    # python3 and its venv module bootstrap uv.
    packages = ["ca-certificates", "python3", "python3-venv"]
    if stage == "wheels":
        return packages
    packages.append("g++")  # torch.compile (Inductor, Triton) needs a C/C++ compiler
    packages.append("tini")  # PID 1: forwards signals, reaps zombies, passes exit codes on
    if spec.python_from_os:
        packages.append("python3-dev")  # headers: Triton and Inductor build Python extensions
    if spec.variant == "devel":
        packages += ["git", "make"]
    if _has_ssh(spec):
        packages.append("openssh-server")
    return sorted(packages)


def _has_ssh(spec: BuildSpec) -> bool:
    """The devel images (and devel-jupyter, built FROM them) are the ones people work in over
    SSH; `ssh-server` as the command starts it. The runtime images stay lean."""
    return spec.variant == "devel"


UV = "/tmp/uv"
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
# BuildKit: the CA bundle is mounted for one RUN only (in no layer, no history, no ENV), and
# the package caches live in cache mounts every image built on the host shares, so the second
# image that needs torch's wheels downloads none. The ids are the same for every image.
CA_SECRET_ID = "ca"
CA_SECRET_PATH = f"/run/secrets/{CA_SECRET_ID}"
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


def _uv_env(options: RenderOptions, single_stage: bool) -> str:
    """Environment of the install RUN."""
    if options.buildkit:
        env = (f"export UV_CACHE_DIR={UV_CACHE} UV_PYTHON_CACHE_DIR={UV_CACHE}/python "
               "UV_LINK_MODE=copy UV_PYTHON_INSTALL_DIR=/opt/python PIP_NO_CACHE_DIR=1")
    else:
        env = "export UV_NO_CACHE=1 UV_LINK_MODE=copy UV_PYTHON_INSTALL_DIR=/opt/python PIP_NO_CACHE_DIR=1"
    cert = _cert_file(options, single_stage)
    return env + (f" SSL_CERT_FILE={cert} PIP_CERT={cert}" if cert else "")


def _mounts(options: RenderOptions) -> tuple[str, str]:
    """BuildKit's `RUN --mount=...` prefixes of the apt RUN and of the install RUN."""
    if not options.buildkit:
        return "", ""
    apt = f"--mount=type=cache,id=imagebuilder-apt,target={APT_CACHE},sharing=locked"
    install = [f"--mount=type=cache,id=imagebuilder-uv,target={UV_CACHE},uid={USER_ID},gid={USER_ID}"]
    if options.ca_bundle is not None:
        install.append(f"--mount=type=secret,id={CA_SECRET_ID},target={CA_SECRET_PATH},"
                       f"uid={USER_ID},required=true")
    return apt + " \\\n    ", "".join(f"{m} \\\n    " for m in install)


def _apt_options(options: RenderOptions) -> str:
    # Outside /var/cache/apt/archives, which the docker-clean hook of Debian/Ubuntu images
    # empties after every install: the .debs stay in the cache mount for the next image.
    if not options.buildkit:
        return ""
    return f" -o Dir::Cache::Archives={APT_CACHE} -o APT::Keep-Downloaded-Packages=true"


def _pip_install(args: list[str]) -> str:
    return f"{UV}/bin/uv pip install --python {VENV}/bin/python" + "".join(f" \\\n        {a}" for a in args)


def _install_commands(spec: BuildSpec, matrix: Matrix, options: RenderOptions, single_stage: bool) -> list[str]:
    """The one RUN that makes the venv: uv comes and goes within it."""
    commands = [_uv_env(options, single_stage), f"python3 -m venv {UV}", f"{UV}/bin/pip install --no-cache-dir uv=={matrix.tools.uv}"]
    python = f"/usr/bin/python{spec.python}" if spec.python_from_os else str(spec.python)
    if not spec.python_from_os:
        commands.append(f"{UV}/bin/uv python install {spec.python}")
    # --allow-existing: in a single stage the (empty) venv folder is made beforehand, owned by the user.
    commands.append(f"{UV}/bin/uv venv --seed --allow-existing --python {python} {VENV}")
    commands.append(_pip_install(_index_args(spec, options) + _requirements(spec, matrix)))
    if spec.toolchain == "pip":
        # torch.utils.cpp_extension links -lcudart; the wheel ships only the versioned soname.
        lib = f"{_python_path(spec)}/nvidia/cu{spec.cuda.major}/lib"
        commands.append(f"ln -s libcudart.so.{spec.cuda.major} {lib}/libcudart.so")
    commands.append(f"rm -rf {UV}")
    return commands


def _jupyter_commands(spec: BuildSpec, matrix: Matrix, options: RenderOptions, single_stage: bool) -> list[str]:
    """Add JupyterLab to the venv without changing anything already in it: everything
    installed is pinned to what is there."""
    reqs = list(matrix.tools.notebook)
    return [
        _uv_env(options, single_stage),
        f"{VENV}/bin/python -m pip install --no-cache-dir --target {UV} uv=={matrix.tools.uv}",
        f"{UV}/bin/uv pip freeze --python {VENV}/bin/python > /tmp/constraints.txt",
        _pip_install(["--constraint /tmp/constraints.txt"] + _index_args(spec, options) + reqs),
        f"rm -rf {UV} /tmp/constraints.txt",
    ]


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
    if spec.variant == "devel":
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
    ]
    if cuda_home:
        env.append(("CUDA_HOME", cuda_home))
    return env


def manifest_for(spec: BuildSpec, matrix: Matrix, inputs_hash: str, tags: Iterable[str], base_image: str) -> dict[str, object]:
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
        "matrix": matrix.path.name,
    }


def _hash(dockerfile: str, files: Mapping[str, bytes]) -> str:
    digest = hashlib.sha256(dockerfile.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    return digest.hexdigest()


def render(spec: BuildSpec, matrix: Matrix, options: RenderOptions = RenderOptions()) -> RenderedImage:
    env = _environment(str(templates_dir()))
    tags = tags_for(spec, matrix)
    base_image = spec.base_image
    if spec.parent is not None:
        base_image = image_ref(options.repository, primary_tag(spec.parent, matrix))
    files: dict[str, bytes] = dict(_smoke_test_files())
    files["imagebuilder.pth"] = b"/opt/imagebuilder\n"  # makes `python -m smoke_tests` work
    ca = None
    two_stage = options.ca_bundle is not None and not options.buildkit
    apt_mounts, install_mounts = _mounts(options)
    if options.ca_bundle is not None:
        try:
            ca = options.ca_bundle.read_bytes()
        except OSError as e:
            raise RenderError(f"cannot read --ca-bundle {options.ca_bundle}: {e.strerror}; pass a PEM file") from e

    def render_with(inputs_hash: str) -> tuple[str, dict[str, bytes]]:
        labels = labels_for(spec, base_image, inputs_hash, options.source)
        manifest = manifest_for(spec, matrix, inputs_hash, tags, base_image)
        context = {
            "generator": f"imagebuilder {__version__}",
            "matrix_name": matrix.path.name,
            "spec": spec,
            "tags": tags,
            "base_image": base_image,
            "two_stage": two_stage,
            "ca_path": CA_PATH,
            "buildkit": options.buildkit,
            "ca_secret": options.buildkit and ca is not None,
            "apt_mounts": apt_mounts,
            "apt_options": _apt_options(options),
            "install_mounts": install_mounts,
            "install_commands": _install_commands(spec, matrix, options, single_stage=not two_stage),
            "jupyter_commands": _jupyter_commands(spec, matrix, options, single_stage=not two_stage),
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
            "entrypoint": json.dumps(list(ENTRYPOINT)),
            "ssh": _has_ssh(spec),
            "session_env_file": SESSION_ENV,
            "shm_floor": NCCL_SHM_MIN_BYTES,
            "shm_advice": SHM_ADVICE,
            # bash reads bash.bashrc for `ssh HOST CMD` too; its first line runs before the
            # file returns for non-interactive shells.
            "session_env": f'[ -n "${{SSH_CONNECTION:-}}" ] && [ -r {SESSION_ENV} ] && . {SESSION_ENV}',
        }
        template = env.get_template("jupyter.Dockerfile.j2" if spec.parent is not None else "Dockerfile.j2")
        out = dict(files)
        if spec.parent is None:  # a jupyter image has its parent's
            rootfs = {**ROOTFS_TEMPLATES, **(SSH_ROOTFS_TEMPLATES if _has_ssh(spec) else {})}
            out.update({f"rootfs/{path}": env.get_template(name).render(context).encode()
                        for path, name in rootfs.items()})
        out["imagebuilder/manifest.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        return template.render(context), out

    # The hash covers everything rendered except itself, so it changes exactly when the
    # image's inputs change; publish compares it with the registry's copy.
    draft, draft_files = render_with("")
    inputs_hash = _hash(draft, draft_files)
    dockerfile, final_files = render_with(inputs_hash)
    secrets: dict[str, bytes] = {}
    if ca is not None and two_stage:
        final_files["ca-bundle.pem"] = ca
    elif ca is not None:
        secrets[CA_SECRET_ID] = ca
    return RenderedImage(
        spec=spec,
        repository=options.repository,
        tags=tags,
        dockerfile=dockerfile,
        files=final_files,
        labels=labels_for(spec, base_image, inputs_hash, options.source),
        inputs_hash=inputs_hash,
        base_image=base_image,
        trusts_ca_bundle=ca is not None,
        secrets=secrets,
    )
