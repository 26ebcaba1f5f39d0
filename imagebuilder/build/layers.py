"""Pure: a lock's wheels as the layers an image installs them in (wheel groups).

A torch image's wheels are ~6 GB; as one layer they compress on one or two cores, download as one
stream and unpack only when all of it has arrived, and two releases that pin the very same CUDA
libraries share none of it. As groups, each installed by its own RUN whose layer depends on its
pins alone (render fixes the files' times and touches nothing else), the layers compress side by
side, pull in parallel, and a layer whose pins recur (a CUDA release's libraries, pinned alike by
every torch built for it) is one blob in every image that has them: stored once, pulled once.

The groups are plain data, ordered most shared first: the CUDA libraries (which recur across
torch releases of one CUDA version; cuSPARSELt and NCCL, which move more often, on their own),
then triton, torch, and the rest (torchvision, torchaudio, numpy, ...: each release's own).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..lock.lockfile import Lock, Pin

# (group name, what its pins' names match), most shared first; the first match wins, and the
# last group takes what no other did. Sizes (2.6 cu124, wheels): cuDNN 634 MB, cuBLAS 347 MB,
# the other CUDA libraries ~900 MB, NCCL 180 MB, triton 241 MB, torch 731 MB.
GROUPS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cuda-libraries", re.compile(r"^(nvidia-(?!cublas|cudnn|cusparselt|nccl)|cuda-)")),
    ("cublas", re.compile(r"^nvidia-cublas(-cu\d+)?$")),
    ("cudnn", re.compile(r"^nvidia-cudnn(-cu\d+)?$")),
    ("cusparselt", re.compile(r"^nvidia-cusparselt(-cu\d+)?$")),
    ("nccl", re.compile(r"^nvidia-nccl(-cu\d+)?$")),
    ("triton", re.compile(r"^(pytorch-)?triton$")),
    ("torch", re.compile(r"^torch$")),
    ("rest", re.compile(r".")),
)


@dataclass(frozen=True)
class WheelGroup:
    name: str
    lock: Lock
    """The group's pins, as a lock of their own (its file is what the group's RUN installs)."""

    @property
    def filename(self) -> str:
        return f"{self.name}.lock"


def group_of(pin: Pin) -> str:
    return next(name for name, pattern in GROUPS if pattern.match(pin.name))


def wheel_groups(lock: Lock) -> tuple[WheelGroup, ...]:
    """The lock's pins by group, in GROUPS' order, empty groups left out: together exactly the
    lock's pins, each once."""
    by_group: dict[str, list[Pin]] = {name: [] for name, _ in GROUPS}
    for pin in lock.pins:
        by_group[group_of(pin)].append(pin)
    return tuple(WheelGroup(name, Lock(f"{lock.name}-{name}", lock.requirements, lock.platform, lock.python,
                                       tuple(pins)))
                 for name, pins in by_group.items() if pins)
