"""Pure: the facts of a host and an image -> preflight items that pass, fail or skip.

Every item that can be judged is judged, so all problems show at once; a failed preflight
stops verify before the smoke tests (they would only fail again, slower and less clearly).
The readers of nvidia-smi's output and the daemon's info are here too: pure, beside the I/O
in facts.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smoke_tests.driver import FAIL as DRIVER_FAIL
from smoke_tests.driver import judge_driver
from smoke_tests.result import FAIL, PASS, SKIP

from ..engine.api import RunResult
from ..engine.errors import refuses_gpus
from ..matrix.model import driver_key
from ..trust import labels
from .rdma import RDMA_ACCESS, RdmaFacts

NVIDIA_SMI_TIMEOUT = 30.0
"""nvidia-smi hangs rather than fails on some broken drivers; also covers the container start."""
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader")


MIN_DRIVER_LABEL = labels.MIN_DRIVER
MIN_DRIVER_COMPAT_LABEL = labels.MIN_DRIVER_COMPAT
CUDA_LABEL = labels.CUDA
CUDA_RUNTIME_LABEL = labels.CUDA_RUNTIME
CUDA_TOOLKIT_LABEL = labels.CUDA_TOOLKIT
BUILT_LABEL = labels.INPUTS_HASH
"""Every image imagebuilder builds carries it, and with it smoke_tests and a manifest."""

# --------------------------------------------------------------------------- preflight


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str


@dataclass(frozen=True)
class HostFacts:
    """What preflight() judges; collect_facts() gathers it. None errors mean "fine"."""

    gpus: tuple[Gpu, ...] = ()
    gpu_error: str | None = None
    """Why no GPU is listed: no GPU runtime, nvidia-smi missing, failing or hanging."""
    min_driver: str | None = None
    """The image's (or manifest's) minimum NVIDIA driver; None: not declared."""
    min_driver_compat: str | None = None
    """Its floor through CUDA minor-version compatibility; None: not declared (min_driver rules)."""
    cuda: str | None = None
    """The image's CUDA version, to say what needs the driver."""
    cuda_runtime: str | None = None
    """The CUDA runtime its torch wheels bring (CUDA_RUNTIME_LABEL); None: not labelled."""
    cuda_toolkit: str | None = None
    """Devel images: the CUDA toolkit nvcc comes from (CUDA_TOOLKIT_LABEL); None: not labelled."""
    in_container: bool = True
    """False for --local: no daemon, image or container runtime involved."""
    daemon_error: str | None = None
    image_error: str | None = None
    image_not_found: bool = False
    """The registry says there is no such image: the request's mistake, not the world's."""
    pulled: bool = False
    nvidia_runtime: str | None = None
    """How the daemon gives containers GPUs: its nvidia runtime, a CDI device, or device requests."""
    built_by_imagebuilder: bool = True
    """The image carries imagebuilder's labels, and so its own smoke_tests and manifest."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The image's labels, which verify holds against what the smoke tests measure (verify/labels.py)."""
    compression: str | None = None
    """The registry image's layer compression ("zstd", "gzip"); None: local or unknown."""
    compression_error: str | None = None
    """Why the daemon cannot pull that compression (export.cannot_pull); None: it can."""
    rdma: RdmaFacts | None = None
    """The RDMA devices the container sees and what verify gives it; None: not read (no GPU)."""


@dataclass(frozen=True)
class PreflightItem:
    name: str
    status: str
    """PASS, FAIL or SKIP, as the smoke tests' results."""
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class Preflight:
    items: tuple[PreflightItem, ...]
    use_gpus: bool
    """Pass every GPU into the container and require them in the smoke tests."""

    @property
    def ok(self) -> bool:
        return not any(item.failed for item in self.items)

    @property
    def problems(self) -> tuple[PreflightItem, ...]:
        return tuple(item for item in self.items if item.failed)


INSTALL_TOOLKIT = (
    "install the NVIDIA Container Toolkit on the Docker daemon's host, then `sudo nvidia-ctk "
    "runtime configure --runtime=docker && sudo systemctl restart docker`"
)
NO_RUNTIME = (
    "no NVIDIA container runtime: the daemon's info lists no `nvidia` runtime and no CDI device "
    f"nvidia.com/gpu, and it refused a GPU device request; {INSTALL_TOOLKIT}"
)


def preflight(facts: HostFacts, *, allow_no_gpu: bool) -> Preflight:
    """Judge the host: every item that can be judged, so all problems show at once.

    In a container the GPUs are read through the daemon from the image, so nothing past a
    failed daemon or image item can be judged.
    """
    items: list[PreflightItem] = []
    if facts.in_container:
        items += _container_items(facts)
        if any(item.failed for item in items):
            return Preflight(tuple(items), use_gpus=False)
    gpus = facts.gpus
    if gpus:
        names = sorted({gpu.name for gpu in gpus})
        items.append(PreflightItem("gpu", PASS, f"{len(gpus)} GPU(s): {', '.join(names)}"))
    else:
        why = facts.gpu_error or "nvidia-smi lists none"
        host = "the Docker daemon's host" if facts.in_container else "this host"
        if allow_no_gpu:
            items.append(PreflightItem("gpu", SKIP, f"no NVIDIA GPU visible ({why}); "
                                                    "--allow-no-gpu: running the CPU mode"))
        else:
            items.append(PreflightItem("gpu", FAIL, f"no NVIDIA GPU visible on {host} ({why}); run "
                                                    "on a GPU host, or pass --allow-no-gpu for the CPU "
                                                    "mode (CI runners)"))
    if facts.in_container:
        items.append(_runtime_item(facts))
    items.append(_driver_item(facts))
    if facts.rdma is not None:
        items.append(_rdma_item(facts.rdma))
    return Preflight(tuple(items), use_gpus=bool(gpus))


def _container_items(facts: HostFacts) -> list[PreflightItem]:
    if facts.daemon_error is not None:
        return [PreflightItem("daemon", FAIL, facts.daemon_error)]
    items = [PreflightItem("daemon", PASS, "the Docker daemon answers")]
    if facts.compression_error is not None:
        return [*items, PreflightItem("compression", FAIL, facts.compression_error)]
    if facts.image_error is not None:
        items.append(PreflightItem("image", FAIL, facts.image_error))
    else:
        cuda = cuda_facts(facts)
        items.append(PreflightItem("image", PASS, ("pulled" if facts.pulled else "present locally")
                                   + (f"; {cuda}" if cuda else "")))
    return items


def cuda_facts(facts: HostFacts) -> str | None:
    """Which CUDA is which in the image, as its labels say (build/_build_labels.py's cuda_labels); None: unlabelled."""
    said = [f"{what} {version}" for what, version in (("CUDA runtime", facts.cuda_runtime),
                                                       ("CUDA toolkit (nvcc)", facts.cuda_toolkit)) if version]
    return ", ".join(said) or None


def _runtime_item(facts: HostFacts) -> PreflightItem:
    if facts.nvidia_runtime is not None:
        return PreflightItem("runtime", PASS, facts.nvidia_runtime)
    if not facts.gpus:
        return PreflightItem("runtime", SKIP, "no GPU to pass into the container")
    return PreflightItem("runtime", FAIL, NO_RUNTIME)


def _driver_item(facts: HostFacts) -> PreflightItem:
    if not facts.gpus:
        return PreflightItem("driver", SKIP, "no GPU, no driver to check")
    host = min(facts.gpus, key=lambda gpu: _driver_or_zero(gpu.driver)).driver
    if facts.min_driver is None:
        return PreflightItem("driver", SKIP, f"host driver {host}; the image declares no minimum "
                                             f"({MIN_DRIVER_LABEL} label or manifest min_driver)")
    try:
        verdict = judge_driver(host, facts.min_driver, facts.min_driver_compat, facts.cuda)
    except ValueError:
        return PreflightItem("driver", FAIL, f"cannot compare host driver {host!r} with the image's "
                                             f"minimum {facts.min_driver!r}: not a dotted number")
    # Between the compatibility floor and min_driver the image runs without PTX JIT; only
    # the smoke tests' cuda check knows whether a GPU needs it (it has torch's arch list).
    return PreflightItem("driver", FAIL if verdict.status == DRIVER_FAIL else PASS, verdict.detail)


def _rdma_item(rdma: RdmaFacts) -> PreflightItem:
    # Never a failure: a host without a fabric, or whose containers cannot use it, still runs
    # one-node jobs; rdma.rdma_warnings() says what multi-node jobs would meet.
    if rdma.error is not None:
        return PreflightItem("rdma", SKIP, f"RDMA devices not known: {rdma.error}")
    if not rdma.devices:
        return PreflightItem("rdma", SKIP, "no RDMA device (/sys/class/infiniband lists none): NCCL uses TCP "
                                           "sockets between nodes")
    names = ", ".join(rdma.devices)
    if not rdma.missing:
        return PreflightItem("rdma", PASS, f"{names}; the smoke tests get `{rdma.given.flags()}`")
    return PreflightItem("rdma", SKIP, f"{names}; the smoke tests do not get `{RDMA_ACCESS.flags()}` "
                                       "(see the warning)")


def _driver_or_zero(version: str) -> tuple[int, ...]:
    try:
        return driver_key(version)
    except ValueError:
        return (0,)



def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """`nvidia-smi --query-gpu=name,driver_version --format=csv,noheader` -> GPUs."""
    gpus = []
    for line in text.splitlines():
        name, sep, driver = line.rpartition(",")
        if sep and name.strip() and driver.strip():
            gpus.append(Gpu(name.strip(), driver.strip()))
    return tuple(gpus)



def daemon_runtime(info: Mapping[str, Any]) -> str | None:
    """How the daemon says it gives containers GPUs, from its info (None: it does not say).

    The daemon's host may be another machine: its info is the only view of its runtimes and
    CDI devices (DiscoveredDevices, Engine API 1.50+); the CDI spec files are not ours to read.
    """
    if "nvidia" in (info.get("Runtimes") or {}):
        return "the daemon lists the nvidia runtime"
    for device in info.get("DiscoveredDevices") or ():
        name = str(device.get("ID", "")) if isinstance(device, Mapping) else ""
        if name.startswith("nvidia.com/gpu"):
            return f"the daemon lists the CDI device {name}"
    return None


@dataclass(frozen=True)
class GpuProbe:
    """What nvidia-smi said in a container of the image run with every GPU."""

    gpus: tuple[Gpu, ...]
    error: str | None
    accepted: bool
    """The daemon started a container with a GPU device request."""


def read_gpu_probe(outcome: RunResult | str) -> GpuProbe:
    """Pure: the GPU probe's run, or the daemon's refusal to start it with GPUs -> GPUs or why none."""
    if isinstance(outcome, str):
        if "executable file not found" in outcome:
            return GpuProbe((), "the NVIDIA runtime mounted no nvidia-smi into the container: no "
                                "NVIDIA driver on the daemon's host?", accepted=True)
        if not refuses_gpus(outcome):
            return GpuProbe((), f"the daemon could not start any container ({outcome}): not a GPU "
                                "problem; `docker run --rm IMAGE true` shows the same, fix the daemon",
                            accepted=False)
        return GpuProbe((), f"the daemon could not start a container with GPUs ({outcome}): no GPU "
                            f"there, or {INSTALL_TOOLKIT}", accepted=False)
    if outcome.timed_out:
        return GpuProbe((), f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT:g}s: the driver is "
                            "stuck", accepted=True)
    if outcome.exit_code != 0:
        said = " ".join(outcome.output.split())[:200]
        return GpuProbe((), f"nvidia-smi failed with exit code {outcome.exit_code}: {said}", accepted=True)
    gpus = parse_nvidia_smi(outcome.output)
    return GpuProbe(gpus, None if gpus else "nvidia-smi lists none", accepted=True)


