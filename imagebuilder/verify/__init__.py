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

The names below are what imagebuilder outside this package uses (the CLI and publish/);
everything else, tests included, imports from the module that defines it.
"""

from __future__ import annotations

from .report import Live, VerifyReport
from .run import DEFAULT_TIMEOUT, verify_image, verify_local, verify_published

__all__ = ["DEFAULT_TIMEOUT", "Live", "VerifyReport", "verify_image", "verify_local", "verify_published"]
