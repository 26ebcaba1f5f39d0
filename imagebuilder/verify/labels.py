"""An image's labels are facts about it, and verify checks them: each against what the smoke tests'
environment check measured inside the image (its torch, torch's CUDA, its Python; the variant its
manifest declares, whose promises the variant's own checks prove). A label that disagrees fails the
`labels` check naming both values: a relabelled image (`FROM img` + `LABEL ...torch=2.5.0`) would
otherwise be published and found by what it does not contain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from packaging.version import Version
from smoke_tests.result import Result, failed, passed

from ..trust import labels as L

NAME = "labels"
ENVIRONMENT = "environment"  # the smoke check whose measurements these are
# label -> (the environment check's measurement, what a message calls it)
CHECKED: tuple[tuple[str, str, str], ...] = (
    (L.TORCH, "torch", "torch"),
    (L.TORCH_CUDA, "torch_cuda", "torch's CUDA"),
    (L.PYTHON, "python", "Python"),
    (L.VARIANT, "variant", "variant (its manifest's)"),
)


def agrees(measurement: str, label: str, measured: object) -> bool:
    """Whether the label says what was measured: torch by its public version (2.6.0 is 2.6.0+cu124),
    CUDA and Python to the label's precision (3.12 is 3.12.8), the variant exactly."""
    if not isinstance(measured, str):
        return False
    if measurement == "variant":
        return label == measured
    try:
        want, got = Version(label), Version(measured)
    except ValueError:  # InvalidVersion, or a number too long for int()
        return label == measured
    if measurement == "torch":
        return Version(got.public) == want
    return got.release[:len(want.release)] == want.release


def check_labels(labels: Mapping[str, str], checks: Sequence[Result]) -> Result | None:
    """The `labels` check over the image's labels and the smoke tests' results; None when there is
    nothing to hold the labels against (an image imagebuilder did not label, no environment check)."""
    environment = next((c for c in checks if c.name == ENVIRONMENT), None)
    if environment is None or not environment.measurements or not any(label in labels for label, _, _ in CHECKED):
        return None
    measured = environment.measurements
    compared, disagree = [], []
    for label, measurement, what in CHECKED:
        if label not in labels or measurement not in measured:
            continue
        if measurement == "variant" and measured[measurement] is None:
            continue  # no manifest says which variant: nothing to hold the label against
        compared.append(measurement)
        if not agrees(measurement, labels[label], measured[measurement]):
            found = measured[measurement] if measured[measurement] is not None else "none (a CPU build)"
            disagree.append(f"label {label} says {labels[label]} but the image's {what} is {found}")
    if disagree:
        return failed(NAME, "; ".join(disagree) + "; the image's labels do not describe it: rebuild it, "
                                                  "or label it with what it contains")
    return passed(NAME, f"{', '.join(compared)} labels match the image")
