"""Resolution: request x matrix -> BuildSpec, as a table."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from imagebuilder.build.tags import labels_for, tags_for
from imagebuilder.errors import BadRequest
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, enumerate_matrix, resolve
from imagebuilder.resources import default_matrix_path
from smoke_tests.driver import PASS, judge_driver

M = load_matrix(Path(__file__).parent / "data" / "matrix-small.yaml")

# request kwargs -> (wheel, image CUDA, python, base image, toolchain, notice fragment or None)
OK_CASES = [
    (dict(torch="2.6", cuda="12.1"), ("cu124", "12.1.1", "3.10", "nvidia/cuda:12.1.1-base-ubuntu22.04", "none", "minor-version compatibility")),
    (dict(torch="2.6.0", cuda="12.1.1"), ("cu124", "12.1.1", "3.10", "nvidia/cuda:12.1.1-base-ubuntu22.04", "none", "needs driver >= 525.60.13")),
    (dict(torch="2.6", cuda="12.4"), ("cu124", "12.4.1", "3.10", "nvidia/cuda:12.4.1-base-ubuntu22.04", "none", None)),
    (dict(torch="2.6", cuda="12.8"), ("cu126", "12.8.1", "3.10", "ubuntu:22.04", "none", "newest older 12.x build")),
    (dict(torch="2.6", cuda="11.8", variant="devel"), ("cu118", "11.8.0", "3.10", "nvidia/cuda:11.8.0-devel-ubuntu22.04", "base", None)),
    (dict(torch="2.6", cuda="12.4", os="debian12"), ("cu124", "12.4.1", "3.11", "debian:bookworm-slim", "none", None)),
    (dict(torch="2.6", cuda="12.4", python="3.12"), ("cu124", "12.4.1", "3.12", "nvidia/cuda:12.4.1-base-ubuntu22.04", "none", "uv python install")),
    (dict(torch="2.12", cuda="13.0", os="debian12", variant="devel"), ("cu130", "13.0.2", "3.11", "debian:bookworm-slim", "pip", None)),
    (dict(torch="2.12", cuda="13.0", os="ubuntu24.04", variant="devel"), ("cu130", "13.0.2", "3.12", "nvidia/cuda:13.0.2-devel-ubuntu24.04", "base", None)),
    (dict(torch="2.12", cuda="13.0", variant="devel", base_image="local/base:1"), ("cu130", "13.0.2", "3.10", "local/base:1", "pip", None)),
    (dict(torch="2.6", cuda="12.4", variant="devel", base_image="local/base:1"), ("cu124", "12.4.1", "3.10", "local/base:1", "base", "must provide nvcc 12.4")),
    (dict(torch="2.6", cuda="12.1", strict=False, base_image="local/base:1"), ("cu124", "12.1.1", "3.10", "local/base:1", "none", "minor-version")),
]


@pytest.mark.parametrize("request_kw,expected", OK_CASES, ids=[str(c[0]) for c in OK_CASES])
def test_resolution(request_kw, expected):
    wheel, cuda, python, base, toolchain, notice = expected
    spec = resolve(M, Request(**request_kw))
    assert spec.wheel.name == wheel
    assert str(spec.cuda.version) == cuda
    assert str(spec.python) == python
    assert spec.base_image == base
    assert spec.toolchain == toolchain
    if notice is None:
        assert [n for n in spec.notices if "wheels" in n] == []
    else:
        assert any(notice in n for n in spec.notices), spec.notices


BAD_CASES = [
    (dict(torch="9.9", cuda="12.1"), "torch 9.9 is not in matrix.yaml; known: 2.6.0, 2.12.0"),
    (dict(torch="2.6.1", cuda="12.1"), "torch 2.6.1 is not in matrix.yaml"),
    (dict(torch="banana", cuda="12.1"), "torch banana is not in matrix.yaml"),
    (dict(torch="2.6", cuda="12.3"), "CUDA 12.3 is not in matrix.yaml; known: 11.8, 12.1, 12.4, 12.6, 12.8, 13.0"),
    (dict(torch="2.6", cuda="12.1", strict=True), "torch 2.6.0 is published for CUDA 11.8, 12.4, 12.6; --strict"),
    (dict(torch="2.6", cuda="13.0"), "none for CUDA 13.x, and wheels of another CUDA major cannot be used"),
    (dict(torch="2.12", cuda="11.8"), "torch 2.12.0 is published for CUDA 12.8, 13.0; none for CUDA 11.x"),
    (dict(torch="2.6", cuda="12.4", python="3.14"), "ships no wheels for Python 3.14; it ships 3.9, 3.10, 3.11, 3.12, 3.13"),
    (dict(torch="2.6", cuda="12.4", os="plan9"), "OS plan9 is not in matrix.yaml; known: ubuntu22.04, ubuntu24.04, debian12"),
    (dict(torch="2.6", cuda="12.4", variant="tiny"), "unknown variant 'tiny'"),
    (dict(torch="2.6", cuda="12.4", variant="devel", os="debian12"), "NVIDIA publishes none for debian12; use --os with one of: ubuntu22.04"),
]


@pytest.mark.parametrize("request_kw,message", BAD_CASES, ids=[str(c[0]) for c in BAD_CASES])
def test_bad_requests_say_what_is_known(request_kw, message):
    with pytest.raises(BadRequest) as e:
        resolve(M, Request(**request_kw))
    assert message in str(e.value)
    assert e.value.exit_code == 2


def test_strict_accepts_an_exact_match():
    assert resolve(M, Request("2.6", "12.6", strict=True)).wheel.name == "cu126"


def test_jupyter_is_built_on_the_runtime_image():
    spec = resolve(M, Request("2.6", "12.4", variant="jupyter", base_image="local/base:1"))
    assert spec.parent is not None and spec.parent.variant == "runtime"
    assert spec.parent.base_image == "local/base:1"


TAG_CASES = [
    (dict(torch="2.6", cuda="12.4"), ["2.6.0-cuda12.4-cudnn9-runtime", "2.6.0-cuda12.4-cudnn9-py3.10-ubuntu22.04-runtime",
                                      "2.6-cuda12.4-runtime", "2.6.0-runtime", "2.6-runtime"]),
    (dict(torch="2.6", cuda="12.1"), ["2.6.0-cuda12.1-cudnn9-runtime", "2.6.0-cuda12.1-cudnn9-py3.10-ubuntu22.04-runtime",
                                      "2.6-cuda12.1-runtime"]),
    (dict(torch="2.6", cuda="12.4", python="3.12"), ["2.6.0-cuda12.4-cudnn9-py3.12-runtime",
                                                     "2.6.0-cuda12.4-cudnn9-py3.12-ubuntu22.04-runtime"]),
    (dict(torch="2.6", cuda="12.4", os="debian12"), ["2.6.0-cuda12.4-cudnn9-debian12-runtime",
                                                                      "2.6.0-cuda12.4-cudnn9-py3.11-debian12-runtime"]),
    (dict(torch="2.12", cuda="13.0"), ["2.12.0-cuda13.0-cudnn9-runtime", "2.12.0-cuda13.0-cudnn9-py3.10-ubuntu22.04-runtime",
                                       "2.12-cuda13.0-runtime", "2.12.0-runtime", "2.12-runtime", "latest"]),
    (dict(torch="2.12", cuda="13.0", variant="jupyter"), ["2.12.0-cuda13.0-cudnn9-jupyter",
                                                          "2.12.0-cuda13.0-cudnn9-py3.10-ubuntu22.04-jupyter",
                                                          "2.12-cuda13.0-jupyter", "2.12.0-jupyter", "2.12-jupyter",
                                                          "latest-jupyter"]),
]


@pytest.mark.parametrize("request_kw,tags", TAG_CASES, ids=[str(c[0]) for c in TAG_CASES])
def test_tags(request_kw, tags):
    assert list(tags_for(resolve(M, Request(**request_kw)), M)) == tags


def test_every_tag_in_the_matrix_names_one_image():
    owners: dict[str, str] = {}
    for spec in enumerate_matrix(M):
        for tag in tags_for(spec, M):
            assert owners.setdefault(tag, spec.key) == spec.key, f"{tag} names {owners[tag]} and {spec.key}"
    assert len(owners) > 20


def test_enumeration_leaves_out_what_cannot_be_built_and_filters():
    specs = list(enumerate_matrix(M, torch="2.6"))
    assert {s.torch.version for s in specs} == {Version("2.6.0")}
    assert not any(s.variant == "devel" and s.os.name == "debian12" for s in specs)  # no 12.x nvcc there
    assert {s.variant for s in enumerate_matrix(M, torch="2.6", variant="jupyter")} == {"jupyter"}
    assert all(s.cuda.key == Version("12.4") for s in enumerate_matrix(M, cuda="12.4"))


@pytest.mark.parametrize("os_python,shipped,expected", [
    ("3.11", ["3.10", "3.11", "3.12"], "3.11"),  # the OS's own
    ("3.10", ["3.11", "3.12", "3.13", "3.14", "3.15"], "3.11"),  # ubuntu22.04 x torch 2.15: nearest above
    ("3.13", ["3.8", "3.9", "3.10", "3.11", "3.12"], "3.12"),  # an OS newer than the release: its newest
])
def test_default_python_is_one_torch_ships(os_python, shipped, expected):
    from dataclasses import replace

    from imagebuilder.matrix.resolve import default_python

    torch = replace(M.torches["2.6"], pythons=tuple(Version(p) for p in shipped))
    os = replace(M.oses["ubuntu22.04"], python=Version(os_python))
    assert default_python(torch, os, torch.variants[0]) == Version(expected)


# issue 29, item 8: an image's min-driver is the driver of the newest CUDA toolkit whose
# libraries it carries (the base image's, or the wheels'), min-driver-compat its major's floor.
# (torch, image CUDA) -> (wheel, min-driver, min-driver-compat), over the packaged matrix
DRIVER_CASES = [
    ("2.4", "12.1", "cu121", "530.30.02", "525.60.13"),  # wheels of the image's own toolkit
    ("2.6", "12.1", "cu124", "550.54.15", "525.60.13"),  # cu124 wheels carry 12.4 Update 1's libraries
    ("2.6", "12.4", "cu124", "550.54.15", "525.60.13"),
    ("2.6", "12.8", "cu126", "570.124.06", "525.60.13"),  # an older wheel: the image's toolkit
    ("2.7", "12.1", "cu126", "560.35.05", "525.60.13"),
    ("2.11", "13.2", "cu130", "595.58.03", "580"),  # the 13.2.1 image's own
    ("2.15", "13.2", "cu132", "595.71.05", "580"),  # cuda-toolkit 13.2.2 on the 13.2.1 image
    ("2.15", "13.0", "cu132", "595.71.05", "580"),
]


@pytest.mark.parametrize("torch,cuda,wheel,min_driver,compat", DRIVER_CASES)
def test_min_driver_is_the_newest_toolkit_the_image_carries(torch, cuda, wheel, min_driver, compat):
    matrix = load_matrix(default_matrix_path())
    spec = resolve(matrix, Request(torch, cuda))
    assert spec.wheel.name == wheel
    labels = labels_for(spec, spec.base_image, "0" * 64, "imagebuilder")
    assert (labels["io.imagebuilder.min-driver"], labels["io.imagebuilder.min-driver-compat"]) == (min_driver, compat)
    if min_driver != spec.cuda.min_driver:
        # a driver of the image's own toolkit runs it only through minor-version compatibility:
        # verify says so (no PTX JIT of the newer code) instead of a plain pass
        verdict = judge_driver(spec.cuda.min_driver, min_driver, compat, str(spec.cuda.key))
        assert verdict.status == PASS and verdict.minor_version_compat
