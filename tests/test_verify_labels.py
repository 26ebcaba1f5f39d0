"""An image's labels are facts verify checks against what the smoke tests measured in it
(verify/labels.py): a table over the comparison, and verify_image failing a relabelled image."""

from __future__ import annotations

import json
from typing import Any

import pytest
from smoke_tests.result import Result

from support.fake_daemon import BUILT_BY_IMAGEBUILDER, OFFLINE, FakeEngine
from imagebuilder.engine.api import RunResult
from imagebuilder.trust import labels as L
from imagebuilder.verify.labels import agrees, check_labels
from imagebuilder.verify.run import verify_image

MEASURED = {"torch": "2.6.0+cu124", "torch_cuda": "12.4", "python": "3.11.2", "variant": "runtime"}
LABELS = {L.TORCH: "2.6.0", L.TORCH_CUDA: "12.4", L.PYTHON: "3.11", L.VARIANT: "runtime"}


def environment(**measurements: Any) -> Result:
    return Result("environment", "pass", "as expected", {**MEASURED, **measurements})


@pytest.mark.parametrize(("measurement", "label", "measured", "same"), [
    ("torch", "2.6.0", "2.6.0+cu124", True),
    ("torch", "2.6", "2.6.0", True),
    ("torch", "2.5.1", "2.6.0+cu124", False),
    ("torch", "2.6.0", "2.6.0rc1", False),
    ("torch_cuda", "12.4", "12.4", True),
    ("torch_cuda", "12.4", "12.1", False),
    ("torch_cuda", "12.4", None, False),  # a CPU build under a CUDA label
    ("python", "3.11", "3.11.2", True),
    ("python", "3.12", "3.11.2", False),
    ("python", "3", "3.11.2", True),
    ("python", "not-a-version", "3.11.2", False),
    ("variant", "devel", "runtime", False),
    ("variant", "runtime", "runtime", True),
])
def test_a_label_agrees_with_a_measurement_to_its_own_precision(measurement: str, label: str, measured: Any,
                                                                  same: bool) -> None:
    assert agrees(measurement, label, measured) is same


def test_labels_that_say_what_the_image_holds_pass() -> None:
    result = check_labels(LABELS, [environment()])
    assert result is not None and result.status == "pass", result
    assert result.reason == "torch, torch_cuda, python, variant labels match the image"


@pytest.mark.parametrize(("label", "value", "names"), [
    (L.TORCH, "2.5.1", "label io.imagebuilder.torch says 2.5.1 but the image's torch is 2.6.0+cu124"),
    (L.TORCH_CUDA, "11.8", "label io.imagebuilder.torch.cuda says 11.8 but the image's torch's CUDA is 12.4"),
    (L.PYTHON, "3.12", "label io.imagebuilder.python says 3.12 but the image's Python is 3.11.2"),
    (L.VARIANT, "devel", "label io.imagebuilder.variant says devel but the image's variant (its manifest's) is runtime"),
])
def test_a_label_that_disagrees_fails_naming_both_values(label: str, value: str, names: str) -> None:
    result = check_labels({**LABELS, label: value}, [environment()])
    assert result is not None and result.status == "fail" and names in result.reason, result


def test_a_cuda_label_on_a_cpu_build_says_so() -> None:
    result = check_labels(LABELS, [environment(torch_cuda=None)])
    assert result is not None and result.failed
    assert "label io.imagebuilder.torch.cuda says 12.4 but the image's torch's CUDA is none (a CPU build)" in result.reason


@pytest.mark.parametrize(("labels", "checks"), [
    ({}, [environment()]),  # an image imagebuilder did not label: lent smoke tests judge it
    (LABELS, []),  # no environment check ran (the run died): nothing measured to hold the labels against
    (LABELS, [Result("environment", "fail", "torch is not importable")]),
])
def test_nothing_to_compare_is_no_labels_check(labels: dict[str, str], checks: list[Result]) -> None:
    assert check_labels(labels, checks) is None


def test_verify_image_fails_a_relabelled_image_naming_both_values() -> None:
    smoke = {"ok": True, "torch": "2.6.0+cu124", "gpu_count": 8,
             "checks": [{"name": "environment", "status": "pass", "reason": "as expected", "measurements": MEASURED}]}
    engine = FakeEngine(labels={**BUILT_BY_IMAGEBUILDER, **LABELS, L.TORCH: "2.5.1"},
                        result=RunResult(0, json.dumps(smoke), False, 1.0))
    report = verify_image(engine, "img:1", registry=OFFLINE, timeout=60)
    assert not report.ok
    (labels,) = [c for c in report.checks if c.name == "labels"]
    assert "label io.imagebuilder.torch says 2.5.1 but the image's torch is 2.6.0+cu124" in labels.reason
    assert ("labels", labels.reason) in report.failures
    honest = verify_image(FakeEngine(labels={**BUILT_BY_IMAGEBUILDER, **LABELS},
                                     result=RunResult(0, json.dumps(smoke), False, 1.0)),
                          "img:1", registry=OFFLINE, timeout=60)
    assert honest.ok and [c.status for c in honest.checks if c.name == "labels"] == ["pass"]
