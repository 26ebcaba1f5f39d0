"""Which CUDA is which (issue 45, part 7): the runtime the locked wheels bring and, in devel
images, the toolkit nvcc comes from, as build-time labels. The real images' labels are checked
against what is installed in them in test_e2e (runtime) and test_workspace (devel)."""

from __future__ import annotations

import pytest

from support.real_images import REPO_ROOT
from imagebuilder.build._build_labels import cuda_labels
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.lock.lockfile import load_locks
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve
from imagebuilder.trust.labels import CUDA, CUDA_RUNTIME, CUDA_TOOLKIT

MATRIX = load_matrix(REPO_ROOT / "matrix.yaml")
LOCKS = load_locks(REPO_ROOT / "locks")


@pytest.mark.parametrize(("request_", "runtime", "toolkit", "block"), [
    # cu124 wheels on the CUDA 12.1 image (the README's job): three different CUDA facts.
    (Request("2.6", "12.1", "3.11", "runtime", "debian12"), "12.4.127", None, "12.1.1"),
    (Request("2.6", "12.4", "3.10", "devel"), "12.4.127", "12.4.1", "12.4.1"),
    # 2.13 pins the runtime through cuda-toolkit 13.0.3; cudart's own number is the label.
    (Request("2.13", "13.0", "3.12", "runtime", "debian12"), "13.0.96", None, "13.0.2"),
    # nvcc from PyPI (the block's pip toolchain), of the block's update.
    (Request("2.13", "13.0", "3.11", "devel", "debian12"), "13.0.96", "13.0.2", "13.0.2"),
])
def test_labels_say_which_cuda(request_: Request, runtime: str, toolkit: str | None, block: str) -> None:
    image = render(resolve(MATRIX, request_), MATRIX, RenderOptions(locks=LOCKS))
    assert image.lock is not None, "the test's request needs a committed lock"
    labels = cuda_labels(image)
    assert labels.get(CUDA_RUNTIME) == runtime
    assert labels.get(CUDA_TOOLKIT) == toolkit
    assert image.labels[CUDA] == block


def test_an_unlocked_image_claims_no_runtime() -> None:
    image = render(resolve(MATRIX, Request("2.6", "12.4", "3.10", "runtime")), MATRIX, RenderOptions())
    assert image.lock is None
    assert CUDA_RUNTIME not in cuda_labels(image)


@pytest.mark.parametrize("variant", ["jupyter", "devel-jupyter"])
def test_a_jupyter_image_keeps_its_parents_cuda_labels(variant: str) -> None:
    """Its lock pins only what JupyterLab adds; it is FROM the parent, whose labels it inherits
    (test_e2e reads them off the real jupyter image)."""
    image = render(resolve(MATRIX, Request("2.6", "12.4", "3.10", variant)), MATRIX, RenderOptions(locks=LOCKS))
    assert image.lock is not None and image.lock.cuda_runtime() is None
    assert cuda_labels(image) == {}
