"""`matrix check --online`: pins, Pythons and releases against the index's own wheel metadata (needs the index)."""

from __future__ import annotations

import dataclasses

import pytest
from packaging.version import Version

from imagebuilder.lock.drift import missing_releases, python_problems, release_drift
from imagebuilder.lock.index import PackageIndex
from imagebuilder.matrix.load import load_matrix
from imagebuilder.resources import default_matrix_path

pytestmark = pytest.mark.network  # reads the real index (about 10 s, no wheel downloaded)


@pytest.fixture(scope="module")
def index():
    return PackageIndex()  # one reader for the module: each page and wheel is read once


def test_the_packaged_pins_match_the_index(index):
    matrix = load_matrix(default_matrix_path())
    assert release_drift(index, matrix.torches["2.6"]) == []


def test_a_wrong_pin_is_reported_as_drift(index):
    release = load_matrix(default_matrix_path()).torches["2.6"]
    wrong = tuple(
        dataclasses.replace(v, nccl=Version("2.99.1")) if v.name == release.pypi_variant else v for v in release.variants
    )
    drifts = release_drift(index, dataclasses.replace(release, variants=wrong))
    assert drifts == [f"torch 2.6.0 ({release.pypi_variant}) nccl: matrix.yaml has 2.99.1, the index's wheel pins 2.21.5"]


def test_every_python_of_every_release_has_wheels_of_all_its_packages(index):
    """torch 2.5 listed 3.13, where torchvision 0.20.1, torchaudio 2.5.1 and triton have no wheel."""
    matrix = load_matrix(default_matrix_path())
    assert [line for release in matrix.torches.values() for line in python_problems(index, release)] == []


def test_a_python_without_companion_wheels_is_reported(index):
    release = load_matrix(default_matrix_path()).torches["2.5"]
    with_313 = dataclasses.replace(release, pythons=(*release.pythons, Version("3.13")))
    assert python_problems(index, with_313) == [
        "torch 2.5.1 lists Python 3.13, but there is no wheel of torchvision 0.20.1, torchaudio 2.5.1, "
        "triton (torch requires none on Python 3.13: no torch.compile on GPU) for it"
    ]


def test_releases_on_the_index_that_the_matrix_lacks_are_reported(index):
    matrix = load_matrix(default_matrix_path())
    assert missing_releases(index, matrix) == []
    without_newest = dataclasses.replace(matrix, torches={k: v for k, v in matrix.torches.items() if k != "2.15"})
    assert missing_releases(index, without_newest) == [Version("2.15.0")]


@pytest.mark.parametrize(("torch", "stated", "pinned"), [
    ("2.6", "12.6", "12.4"),  # nvidia-cuda-runtime-cu12==12.4.127
    ("2.15", "13.0", "13.2"),  # the cuda-toolkit meta-package (2.11 and later)
])
def test_a_block_whose_cuda_runtime_differs_from_its_wheels_is_named(index, torch, stated, pinned):
    """Issue 45, part 7: the wheel variant's stated CUDA against the runtime its wheel pins."""
    release = load_matrix(default_matrix_path()).torches[torch]
    wrong = tuple(
        dataclasses.replace(v, cuda=Version(stated)) if v.name == release.pypi_variant else v for v in release.variants
    )
    drifts = release_drift(index, dataclasses.replace(release, variants=wrong))
    assert drifts == [f"torch {release.version} ({release.pypi_variant}) cuda: matrix.yaml has {stated}, "
                      f"the index's wheel pins {pinned}"]
