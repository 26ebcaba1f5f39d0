"""Will PyTorch jobs in this image work on this machine? Preflight the host, run smoke_tests/.

Two steps, each a pure function beside a thin I/O wrapper:

- preflight.py (pure): HostFacts (daemon, image, NVIDIA runtime, GPUs, driver, RDMA) -> items that
  pass, fail or skip; facts.py gathers the facts from the daemon's host, never from this
  client (DOCKER_HOST may be another machine), and from the registry its caller hands in.
  A failed preflight stops there: the smoke tests would only fail again, slower and less clearly.
- run.py: the smoke tests run in a container with every GPU (verify_image) or in this Python
  environment (verify_local), always under a time limit; output.py reads their JSON report
  out of whatever else the process printed. An image imagebuilder did not build is lent this
  imagebuilder's smoke tests (lend.py), with the versions its own torch reports as the
  expectations. rdma.py (pure) decides what of the host's RDMA devices the container gets and
  warns, with the transport NCCL named in the nccl check, when a multi-node job would fall back to TCP.

Both return a VerifyReport (report.py); the CLI prints it and `raise_if_failed()` turns a
failure into VerificationFailed (exit 1). `publish` calls verify_image() once per image.
"""

from __future__ import annotations

from .facts import RegistryReader, collect_facts, collect_local_facts, host_gpus, probe_gpus
from .lend import expected_from_torch, lend_notice, not_pytorch, probe_torch, smoke_tests_archive
from .output import SmokeOutput, parse_output, tail
from .preflight import (INSTALL_TOOLKIT, NO_RUNTIME, Gpu, GpuProbe, HostFacts, Preflight, PreflightItem,
                        daemon_runtime, parse_nvidia_smi, preflight, read_gpu_probe)
from .report import CHECK_WIDTH, NOT_RUN, SIGNATURE_ONLY, Live, NotVerifiable, VerificationFailed, VerifyReport
from .run import (DEFAULT_TIMEOUT, PublishedRegistry, run_process, smoke_command, verify_image, verify_local,
                  verify_published)

__all__ = [
    "CHECK_WIDTH", "DEFAULT_TIMEOUT", "INSTALL_TOOLKIT", "NOT_RUN", "NO_RUNTIME", "SIGNATURE_ONLY", "Gpu",
    "GpuProbe", "HostFacts", "Live", "NotVerifiable", "Preflight", "PreflightItem", "PublishedRegistry",
    "RegistryReader", "SmokeOutput", "VerificationFailed", "VerifyReport", "collect_facts",
    "collect_local_facts", "daemon_runtime", "expected_from_torch", "host_gpus", "lend_notice", "not_pytorch",
    "parse_nvidia_smi", "parse_output", "preflight", "probe_gpus", "probe_torch", "read_gpu_probe",
    "run_process", "smoke_command", "smoke_tests_archive", "tail", "verify_image", "verify_local",
    "verify_published",
]
