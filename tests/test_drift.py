"""`matrix check --online`: the pins against the index's own wheel metadata (needs the index)."""

from __future__ import annotations

import dataclasses

import pytest
from packaging.version import Version

from imagebuilder.drift import release_drift
from imagebuilder.matrix import load_matrix
from imagebuilder.resources import default_matrix_path

pytestmark = pytest.mark.slow


def test_the_packaged_pins_match_the_index():
    matrix = load_matrix(default_matrix_path())
    assert release_drift(matrix.torches["2.6"]) == []


def test_a_wrong_pin_is_reported_as_drift():
    release = load_matrix(default_matrix_path()).torches["2.6"]
    wrong = tuple(
        dataclasses.replace(v, nccl=Version("2.99.1")) if v.name == release.pypi_variant else v for v in release.variants
    )
    drifts = release_drift(dataclasses.replace(release, variants=wrong))
    assert drifts == [f"torch 2.6.0 ({release.pypi_variant}) nccl: matrix.yaml has 2.99.1, the index's wheel pins 2.21.5"]
