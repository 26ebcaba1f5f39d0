"""/dev/shm against what NCCL needs, for the nccl check and the images' entrypoint
(imagebuilder renders these values into it).

NCCL's shared-memory transport keeps its buffers in /dev/shm (about 9 MiB per channel and
peer), so Docker's default of 64 MiB fails as soon as two GPUs talk (NVIDIA/nccl#342).
1 GiB is what `verify` passes and NVIDIA's container guides start with.
"""

from __future__ import annotations

import os

NCCL_SHM_MIN_BYTES = 1 << 30
SHM_ADVICE = "start the container with --shm-size=1g (or more) or --ipc=host"


def shm_bytes(path: str = "/dev/shm") -> int:
    """The size of the shared-memory file system; 0 when there is none."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return 0
    return stat.f_frsize * stat.f_blocks


def shm_too_small(gpus: int, size: int) -> bool:
    """Whether NCCL among `gpus` GPUs would outgrow a /dev/shm of `size` bytes."""
    return gpus > 1 and size < NCCL_SHM_MIN_BYTES
