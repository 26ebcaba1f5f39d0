"""Pure: what an image holds, computed from its BuildSpec: its user and paths, OS packages,
environment, constraint pins, manifest, and the nvcc check of a devel image on a --base-image.

image_plan.py and render.py hand these values to the templates, which only lay them out; build,
publish, the tests and the benchmarks name the image's paths from here (SBOM_PATH, VENV, COMPILE_CACHE).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..lock.lockfile import Lock
from ..matrix.model import Matrix
from ..matrix.resolve import BuildSpec
from ..matrix.variants import variant

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
# Each cache's own folder, made in the image as COMPILE_CACHE is: a named volume mounted at one
# of them (not only at COMPILE_CACHE) is seeded writable for every uid, not root-owned.
INDUCTOR_CACHE, TRITON_CACHE, NV_CACHE = (f"{COMPILE_CACHE}/{name}" for name in ("inductor", "triton", "nv"))
COMPILE_CACHES = (COMPILE_CACHE, INDUCTOR_CACHE, TRITON_CACHE, NV_CACHE)
ENTRYPOINT = ("/usr/bin/tini", "-g", "--", "/usr/local/bin/imagebuilder-entrypoint")
SESSION_ENV = "/etc/profile.d/00-container-env.sh"  # the container's environment, for SSH sessions
# TensorBoard behind Jupyter's auth, at <base_url>/TENSORBOARD_PATH/ (jupyter-server-proxy's server
# name, and TensorBoard's --path_prefix). Its logdir is SummaryWriter's default `runs/` relative to
# the WORKDIR, where a project mounted at WORKSPACE keeps it.
TENSORBOARD_PATH = "tensorboard"
TENSORBOARD_LOGDIR = f"{WORKSPACE}/runs"
# How long the proxy waits for TensorBoard to answer at its start: its default, 5 s, is about what
# TensorBoard took here on a busy 2-core machine, too tight for a cold one.
TENSORBOARD_START_TIMEOUT_S = 60
CA_PATH = "/etc/imagebuilder/ca-bundle.pem"
LOCK_PATH = "/opt/imagebuilder/requirements.lock"  # runtime/devel: the whole venv
JUPYTER_LOCK_PATH = "/opt/imagebuilder/jupyter.lock"  # jupyter: what it adds to its runtime's
CONSTRAINTS_PATH = "/opt/imagebuilder/constraints.txt"
SBOM_PATH = "/opt/imagebuilder/sbom.cdx.json"


def python_path(spec: BuildSpec) -> str:
    return f"{VENV}/lib/python{spec.python}/site-packages"


def apt_packages(spec: BuildSpec, stage: str) -> list[str]:
    # python3 and its venv module bootstrap uv.
    packages = ["ca-certificates", "python3", "python3-venv"]
    if stage == "wheels":
        return packages
    packages.append("g++")  # torch.compile (Inductor, Triton) needs a C/C++ compiler
    packages.append("tini")  # PID 1: forwards signals, reaps zombies, passes exit codes on
    # NCCL dlopens libibverbs for InfiniBand and RoCE (AWS's EFA plugin needs it too); without
    # it a multi-node job falls back to TCP sockets without a word. The providers are the
    # drivers' user-space halves (mlx5, efa, ...), librdmacm the connection manager RoCE uses.
    packages += spec.os.rdma
    if spec.python_from_os:
        packages.append("python3-dev")  # headers: Triton and Inductor build Python extensions
    packages += variant(spec.variant).packages
    if spec.torch.torchcodec_for(spec.python) is not None:
        packages += spec.os.ffmpeg  # the shared libraries torchcodec loads
    if has_ssh(spec):
        packages.append("openssh-server")
    return sorted(packages)


def has_ssh(spec: BuildSpec) -> bool:
    """The devel images (and devel-jupyter, built FROM them) are the ones people work in over
    SSH; `ssh-server` as the command starts it. The runtime images stay lean."""
    return variant(spec.variant).ssh


def constraints_for(spec: BuildSpec, lock: Lock | None) -> str:
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


def env_for(spec: BuildSpec) -> list[tuple[str, str]]:
    cuda_home = None
    if variant(spec.variant).toolchain:
        cuda_home = f"{python_path(spec)}/nvidia/cu{spec.cuda.major}" if spec.toolchain == "pip" else "/usr/local/cuda"
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
        # torch's version, as NGC's and pytorch/pytorch's images set it: enroot's pytorch hook
        # derives RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from Slurm only
        # in an image whose environment has it.
        ("PYTORCH_VERSION", str(spec.torch.version)),
        # Not under /tmp/torchinductor_<user> and ~/.triton of a container that dies: COMPILE_CACHE.
        ("TORCH_HOME", COMPILE_CACHE),
        ("TORCHINDUCTOR_CACHE_DIR", INDUCTOR_CACHE),
        ("TRITON_CACHE_DIR", TRITON_CACHE),
        # CUDA's PTX JIT cache: a GPU newer than the wheels' cubins JIT-compiles at every start without it.
        ("CUDA_CACHE_PATH", NV_CACHE),
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
