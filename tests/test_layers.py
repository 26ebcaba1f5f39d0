"""The wheel groups (imagebuilder/build/layers.py): every lock splits into them exactly, most shared
first, and the groups that two releases pin alike are the same pins (so the same layer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuilder.build.layers import GROUPS, group_of, wheel_groups
from imagebuilder.lock.lockfile import Lock, load_locks, parse_lock

LOCKS = load_locks(Path(__file__).resolve().parent.parent / "locks")


@pytest.mark.parametrize("name, group", [
    ("nvidia-cublas-cu12", "cublas"), ("nvidia-cublas", "cublas"),
    ("nvidia-cudnn-cu12", "cudnn"), ("nvidia-cudnn-cu13", "cudnn"),
    ("nvidia-cusparselt-cu12", "cusparselt"), ("nvidia-nccl-cu13", "nccl"),
    ("nvidia-cuda-runtime-cu12", "cuda-libraries"), ("nvidia-nvjitlink", "cuda-libraries"),
    ("nvidia-cufile", "cuda-libraries"), ("cuda-bindings", "cuda-libraries"), ("nvidia-cuda-nvcc", "cuda-libraries"),
    ("triton", "triton"), ("pytorch-triton", "triton"), ("torch", "torch"),
    ("torchvision", "rest"), ("numpy", "rest"), ("pip", "rest"), ("nvidia-ml-py", "cuda-libraries"),
])
def test_each_pin_has_its_group(name: str, group: str) -> None:
    lock = parse_lock("x", f"{name}==1.0 \\\n    --hash=sha256:{'0' * 64}\n")
    assert group_of(lock.pins[0]) == group


@pytest.mark.parametrize("name", sorted(LOCKS.locks))
def test_every_lock_splits_into_its_groups_exactly_in_order(name: str) -> None:
    lock = LOCKS.locks[name]
    groups = wheel_groups(lock)
    assert [pin for group in groups for pin in group.lock.pins] == sorted(
        lock.pins, key=lambda pin: [g for g, _ in GROUPS].index(group_of(pin)))
    assert all(group.lock.pins for group in groups)  # no empty group
    assert [g.name for g in groups] == [g for g, _ in GROUPS if g in {x.name for x in groups}]


def _group(lock: Lock, name: str) -> tuple[str, ...]:
    return next((tuple(p.line() for p in g.lock.pins) for g in wheel_groups(lock) if g.name == name), ())


def test_releases_that_pin_the_same_cuda_libraries_share_those_groups() -> None:
    """Read from locks/: 2.5.1 and 2.6.0 (cu124, py3.11) pin the same CUDA libraries but
    cuSPARSELt (which 2.5 lacks), so four of 2.6's layers are 2.5's too."""
    old, new = (LOCKS.locks[f"torch{v}-cu124-py3.11-runtime"] for v in ("2.5.1", "2.6.0"))
    shared = [name for name, _ in GROUPS if _group(old, name) and _group(old, name) == _group(new, name)]
    assert shared == ["cuda-libraries", "cublas", "cudnn", "nccl"]
    assert _group(new, "cusparselt") and not _group(old, "cusparselt")
