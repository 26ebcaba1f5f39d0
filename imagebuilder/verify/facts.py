"""The I/O half of preflight: the host's facts, read through the daemon (from the daemon's
host, never this client: DOCKER_HOST may be another machine) and the registry it is handed.

The runtimes come from the daemon's info, the GPUs and driver from nvidia-smi in a short
container of the image itself, the RDMA devices from another (rdma.PROBE); a registry image's layer compression and provenance from the
registry the caller passes in (its signature says every registry call it makes).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from smoke_tests.expected import ManifestError, load_expected

from ..build.platforms import host_platform
from ..engine.api import Runner
from ..engine.errors import ContainerFailed, DaemonUnavailable, GpuUnavailable, PullFailed, names_nothing
from ..engine.export import cannot_pull, compression_of, gzip_ref
from ..errors import BadRequest
from ..registry.api import RegistryError
from ..registry.reference import InvalidReference, names_domain, parse_reference
from ..trust.provenance import BuiltFrom, built_from
from .preflight import (BUILT_LABEL, CUDA_LABEL, CUDA_RUNTIME_LABEL, CUDA_TOOLKIT_LABEL, MIN_DRIVER_COMPAT_LABEL,
                        MIN_DRIVER_LABEL, NVIDIA_SMI, NVIDIA_SMI_TIMEOUT, Gpu, GpuProbe, HostFacts, daemon_runtime,
                        parse_nvidia_smi, read_gpu_probe)
from .rdma import PROBE, PROBE_TIMEOUT, RdmaFacts, access_for, read_rdma_probe


class RegistryReader(Protocol):
    """What verify reads from a registry (registry.client.HttpRegistry is one)."""

    def blobs(self, ref: str) -> dict[str, tuple[int, str]]: ...

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None: ...

    def digest(self, ref: str) -> str | None: ...

    def provenance(self, ref: str) -> dict[str, Any] | None: ...

# --------------------------------------------------------------------------- host facts (I/O)



def host_gpus() -> tuple[tuple[Gpu, ...], str | None]:
    """The GPUs nvidia-smi lists on this host, or why there are none."""
    command = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT,
                              check=False)
    except FileNotFoundError:
        return (), "nvidia-smi not found: no NVIDIA driver installed"
    except subprocess.TimeoutExpired:
        return (), f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT:g}s: the driver is stuck"
    if done.returncode != 0:
        said = " ".join((done.stdout + done.stderr).split())[:200]
        return (), f"nvidia-smi failed with exit code {done.returncode}: {said}"
    gpus = parse_nvidia_smi(done.stdout)
    return gpus, None if gpus else "nvidia-smi lists none"



def probe_gpus(engine: Runner, ref: str) -> GpuProbe:
    """nvidia-smi in a container of `ref` with every GPU: the NVIDIA runtime mounts it in, so
    this sees the GPUs and driver of the daemon's host, whatever image and client."""
    try:
        run = engine.run(ref, list(NVIDIA_SMI), timeout=NVIDIA_SMI_TIMEOUT, gpus=True)
    except (GpuUnavailable, ContainerFailed) as e:
        return read_gpu_probe(e.detail)
    return read_gpu_probe(run)


def probe_rdma(engine: Runner, ref: str) -> RdmaFacts:
    """The RDMA devices a container of `ref` sees on the daemon's host, and what verify gives the
    smoke tests' container of them (rdma.access_for)."""
    try:
        rdma = read_rdma_probe(engine.run(ref, list(PROBE), timeout=PROBE_TIMEOUT))
    except ContainerFailed as e:
        return RdmaFacts(error=f"listing /sys/class/infiniband in the image failed ({e.detail})")
    return replace(rdma, given=access_for(rdma))


def collect_facts(engine: Runner, ref: str, registry: RegistryReader | None) -> HostFacts:
    """The I/O half of preflight for an image: ask the daemon, pull if needed (asking `registry`
    first whether the daemon can pull the image's compression), probe the GPUs. `registry` None:
    an image of this engine's alone (a candidate not yet pushed), nothing is read from one."""
    try:
        engine.ping()
    except DaemonUnavailable as e:
        return HostFacts(daemon_error=str(e))
    pulled = False
    if not engine.image_exists(ref):
        # Before the pull: a daemon that cannot pull zstd fails it with an obscure error.
        compression = registry_compression(registry, ref)
        version = str(engine.info().get("ServerVersion") or "") or None
        why = cannot_pull(compression, version, gzip_instead(registry, ref) if compression == "zstd" else None)
        if why is not None:
            return HostFacts(compression=compression, compression_error=why)
        try:
            engine.pull(ref)
            pulled = True
        except PullFailed as e:
            # "not found" from a registry that names a digest under the tag is its fault, not the request's.
            undelivered = names_nothing(e.detail) and registry_has(registry, ref)
            todo = ("the registry names the image but could not deliver it: try again later, or tell whoever runs "
                    "it" if undelivered else "build it or check the reference and `docker login`")
            return HostFacts(image_error=f"image {ref} is not here and could not be pulled: {e.detail}; {todo}",
                             image_not_found=names_nothing(e.detail) and not undelivered)
    labels = engine.image_labels(ref)
    info: Mapping[str, Any] = engine.info()
    probe = probe_gpus(engine, ref)
    runtime = daemon_runtime(info)
    if runtime is None and probe.accepted:
        runtime = "the daemon accepted a GPU device request"
    return HostFacts(
        gpus=probe.gpus, gpu_error=probe.error,
        min_driver=labels.get(MIN_DRIVER_LABEL), min_driver_compat=labels.get(MIN_DRIVER_COMPAT_LABEL),
        cuda=labels.get(CUDA_LABEL), cuda_runtime=labels.get(CUDA_RUNTIME_LABEL),
        cuda_toolkit=labels.get(CUDA_TOOLKIT_LABEL),
        pulled=pulled, nvidia_runtime=runtime, built_by_imagebuilder=BUILT_LABEL in labels, labels=dict(labels),
        # NCCL only runs with GPUs: without them there is no transport to give devices to.
        rdma=probe_rdma(engine, ref) if probe.gpus else None,
    )


def registry_compression(registry: RegistryReader | None, ref: str) -> str | None:
    """The layer compression of the image a daemon pulls for `ref` from its registry: of an
    index, its first entry for this host's platform (what Docker takes; gzip, in a gzip+zstd
    index); None: not a registry image, or unknown."""
    try:
        if registry is None or "/" not in ref or not names_domain(parse_reference(ref).host):
            return None
        found = registry.image_config(ref, host_platform())
        return None if found is None else compression_of(found[1])
    except (RegistryError, InvalidReference, ValueError, OSError):
        return None


def gzip_instead(registry: RegistryReader | None, ref: str) -> str | None:
    """The gzip image a gzip+zstd publish left beside the tag `ref` (gzip_ref()), where the
    registry has it; None: none (or `ref` names a digest)."""
    try:
        if registry is None or parse_reference(ref).reference.startswith("sha256:"):
            return None
        return gzip_ref(ref) if registry.digest(gzip_ref(ref)) is not None else None
    except (RegistryError, InvalidReference, ValueError, OSError):
        return None


def registry_has(registry: RegistryReader | None, ref: str) -> bool:
    """Whether `ref`'s registry names a digest under it: a pull of such an image that failed with
    "not found" (a blob or manifest it advertises and cannot deliver) is the registry's fault, not
    a request for nothing (exit 1, not 2). False where it says no, or cannot be asked."""
    try:
        if registry is None or "/" not in ref or not names_domain(parse_reference(ref).host):
            return False
        return registry.digest(ref) is not None
    except (RegistryError, InvalidReference, ValueError, OSError):
        return False


def registry_built_from(registry: RegistryReader | None, ref: str) -> BuiltFrom | None:
    """Where the registry image `ref` was built from, per its provenance; None: none readable."""
    try:
        if registry is None or "/" not in ref or not names_domain(parse_reference(ref).host):
            return None
        predicate = registry.provenance(ref)
    except (RegistryError, InvalidReference, ValueError, OSError):
        return None
    return built_from(predicate) if predicate else None


def collect_local_facts(manifest: str | None) -> HostFacts:
    try:
        expected = load_expected(manifest)
    except ManifestError as e:
        raise BadRequest(f"{e}; pass --manifest with the image's manifest.json, or none") from e
    gpus, gpu_error = host_gpus()
    return HostFacts(gpus=gpus, gpu_error=gpu_error, min_driver=expected.min_driver,
                     min_driver_compat=expected.min_driver_compat, cuda=expected.image_cuda,
                     in_container=False)


