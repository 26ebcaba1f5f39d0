"""matrix.yaml parsing and validation: every problem reported at once, with key path and line."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from imagebuilder.matrix.load import load_matrix, parse_matrix
from imagebuilder.matrix.model import MatrixError, MatrixMissing, driver_key
from imagebuilder.resources import default_matrix_path

SMALL = Path(__file__).parent / "data" / "matrix-small.yaml"
SMALL_TEXT = SMALL.read_text()


def problems_of(text: str) -> list[str]:
    with pytest.raises(MatrixError) as e:
        parse_matrix(text, Path("m.yaml"))
    return [p.render(Path("m.yaml")) for p in e.value.problems]


def test_small_matrix_parses_into_the_model():
    m = load_matrix(SMALL)
    assert list(m.torches) == ["2.6", "2.12"]  # ordered by version, not text
    t26 = m.torches["2.6"]
    assert t26.version == Version("2.6.0")
    assert [v.name for v in t26.variants] == ["cu118", "cu124", "cu126"]
    assert t26.variant("cu124").nccl == Version("2.21.5")
    assert m.cudas[Version("12.1")].min_driver == "530.30.02"  # the zero NVIDIA writes is kept
    assert m.newest_torch().key == "2.12"


def test_packaged_matrix_is_valid():
    m = load_matrix(default_matrix_path())
    assert Version("2.4") <= min(t.version for t in m.torches.values())
    assert Version("12.1") in m.cudas
    for release in m.torches.values():
        assert release.source and all(v.source for v in release.variants)


BAD_CASES = [
    # (name, edit of the small matrix, expected fragments of one problem line)
    ("syntax error", lambda t: t.replace("schema: 1", "schema: [1"), ["not valid YAML"]),
    ("unknown key", lambda t: t.replace('    version: "2.6.0"', '    version: "2.6.0"\n    colour: blue'),
     ["m.yaml:", "torch.2.6.colour: unknown key"]),
    ("wrong type", lambda t: t.replace('torchvision: "0.21.0"', "torchvision: [1]"),
     ["torch.2.6.torchvision: expected a quoted version string"]),
    ("float version", lambda t: t.replace('min_driver: "530.30.02"', "min_driver: 530.30"),
     ["cuda.12.1.min_driver: expected a non-empty string"]),
    ("duplicate key", lambda t: t.replace('    torchaudio: "2.6.0"', '    torchaudio: "2.6.0"\n    torchaudio: "2.6.1"'),
     ["torch.2.6.torchaudio: duplicate key"]),
    ("unknown CUDA", lambda t: t.replace('cu126: {cuda: "12.6"', 'cu129: {cuda: "12.9"'),
     ["torch.2.6.variants.cu129.cuda: unknown CUDA 12.9"]),
    ("python not shipped", lambda t: t.replace('cu124: {cuda: "12.4",', 'cu124: {python: ["3.8"], cuda: "12.4",'),
     ["torch.2.6.variants.cu124.python: torch 2.6.0 ships no wheels for Python 3.8"]),
    ("missing key", lambda t: t.replace('    pypi_variant: cu124\n', ""), ["torch.2.6.pypi_variant: missing"]),
    ("variant misnamed", lambda t: t.replace("cu118: {", "cu117: {"), ["torch.2.6.variants.cu117: a CUDA 11.8 variant is named cu118"]),
    ("unknown OS in images", lambda t: t.replace("ubuntu22.04: {runtime: \"nvidia/cuda:11.8.0", "rocky9: {runtime: \"nvidia/cuda:11.8.0"),
     ["cuda.11.8.images.rocky9: unknown OS"]),
    ("version of another release", lambda t: t.replace('version: "2.6.0"', 'version: "2.7.0"'),
     ["torch.2.6.version: 2.7.0 is not a 2.6 release"]),
    ("jupyter-server-proxy without auth on websockets",
     lambda t: t.replace('"3.12": {jupyterlab: "4.6.6", ipykernel: "7.4.0", ipywidgets: "8.1.9", pandas: "3.1.1", matplotlib: "3.11.2", tqdm: "4.70.1", tensorboard: "2.21.0", "jupyter-server-proxy": "4.6.0"',
                         '"3.12": {jupyterlab: "4.6.6", ipykernel: "7.4.0", ipywidgets: "8.1.9", pandas: "3.1.1", matplotlib: "3.11.2", tqdm: "4.70.1", tensorboard: "2.21.0", "jupyter-server-proxy": "4.1.0"'),
     ["tools.notebook.3.12.jupyter-server-proxy: 4.1.0 is older than 4.1.1", "CVE-2024-28179"]),
    # Issue 42: NCCL over InfiniBand, RoCE and EFA needs the OS's RDMA libraries in every image.
    ("OS without its RDMA packages",
     lambda t: t.replace('rdma: [libibverbs1, ibverbs-providers, librdmacm1t64], ', ''),
     ["os.ubuntu24.04.rdma: missing", "NCCL loads for InfiniBand, RoCE and EFA", "librdmacm1]"]),
    ("RDMA packages not a list", lambda t: t.replace('rdma: [libibverbs1, ibverbs-providers, librdmacm1t64]', 'rdma: libibverbs1'),
     ["os.ubuntu24.04.rdma: expected a list of OS package names like 'libibverbs1'"]),
]


@pytest.mark.parametrize("name,edit,fragments", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_matrix_is_reported_with_path_and_line(name, edit, fragments):
    text = edit(SMALL_TEXT)
    assert text != SMALL_TEXT, "the edit must change the fixture"
    lines = problems_of(text)
    assert any(all(f in line for f in fragments) for line in lines), lines
    assert all(line.startswith("m.yaml") for line in lines)


def test_every_problem_is_reported_at_once_with_lines():
    text = SMALL_TEXT.replace('cu126: {cuda: "12.6"', 'cu129: {cuda: "12.9"').replace(
        '    version: "2.6.0"', '    version: "2.6.0"\n    colour: blue'
    ).replace('torchvision: "0.21.0"', "torchvision: 0.21")
    with pytest.raises(MatrixError) as e:
        parse_matrix(text, Path("m.yaml"))
    assert len(e.value.problems) == 3  # unknown key, unknown CUDA, wrong type
    colour = next(p for p in e.value.problems if p.path[-1] == "colour")
    assert colour.line is not None and text.splitlines()[colour.line - 1].strip() == "colour: blue"
    assert "has 3 problems" in str(e.value)


def test_a_missing_matrix_file_is_a_bad_request(tmp_path):
    with pytest.raises(MatrixMissing, match="No such file") as e:
        load_matrix(tmp_path / "missing.yaml")
    assert e.value.exit_code == 2


@pytest.mark.parametrize("a,b", [("530.30.02", "525.60.13"), ("550.54.15", "550.54.14"), ("1000.1", "999.99.99")])
def test_driver_versions_compare_as_integers(a, b):
    assert driver_key(a) > driver_key(b)


# Facts read from primary sources; matrix.yaml cites each (its header and the blocks' source).
CU118_BUILDS = [("2.4", "9.1.0.70", "2.20.5"), ("2.5", "9.1.0.70", "2.21.5")]


@pytest.mark.parametrize("torch,cudnn,nccl", CU118_BUILDS)
def test_the_cu118_builds_of_2_4_and_2_5_are_in_the_matrix(torch, cudnn, nccl):
    """RELEASE.md's rows give cuDNN; NCCL is the one submodule's, as PyPI's wheel of the release."""
    release = load_matrix(default_matrix_path()).torches[torch]
    cu118 = release.variant("cu118")
    assert (cu118.cuda, cu118.cudnn, cu118.nccl) == (Version("11.8"), Version(cudnn), Version(nccl))
    assert cu118.nccl == release.variant(release.pypi_variant).nccl
    assert "third_party/nccl submodule" in cu118.source and "nccl-cu11.txt" not in cu118.source


def test_cuda_13_floors_are_nvidias():
    """13.x runs on any R580 driver (minor-version compatibility: ">= 580"); the 13.2 block's own
    floor is that of the update it names (13.2.1), and torch 2.15's cu132 wheels, which pin
    cuda-toolkit 13.2.2, carry 13.2 Update 2's (issue 29, item 8)."""
    from smoke_tests.driver import PASS, judge_driver

    matrix = load_matrix(default_matrix_path())
    cudas = matrix.cudas
    assert cudas[Version("13.0")].min_driver_compat == cudas[Version("13.2")].min_driver_compat == "580"
    assert cudas[Version("13.2")].version == Version("13.2.1") and cudas[Version("13.2")].min_driver == "595.58.03"
    cu132 = matrix.torches["2.15"].variant("cu132")
    assert "cuda-toolkit[" in cu132.source and "==13.2.2" in cu132.source and cu132.min_driver == "595.71.05"
    verdict = judge_driver("580.10.02", "595.71.05", "580", cuda="13.2")  # an R580 driver older than 13.0 GA's
    assert verdict.status == PASS and verdict.minor_version_compat
    assert judge_driver("575.57.08", "595.71.05", "580").status != PASS


@pytest.mark.parametrize("key,ok", [("min_driver_compat", True), ("min_driver", False)])
def test_a_driver_branch_is_a_floor_only_through_compatibility(key, ok):
    """NVIDIA states the compatibility floor as a branch; a toolkit's own floor is a release."""
    text = SMALL_TEXT.replace(f'{key}: "525.60.13"' if key == "min_driver_compat" else 'min_driver: "530.30.02"',
                              f'{key}: "525"', 1)
    assert text != SMALL_TEXT
    if ok:
        parse_matrix(text, Path("m.yaml"))
    else:
        assert any(f"cuda.12.1.{key}: not a driver version" in line for line in problems_of(text))


def test_a_variant_driver_is_for_a_later_update_than_its_block():
    """A wheel variant's min_driver names the driver of a later toolkit update than its CUDA
    block's; one at or below the block's says nothing the block does not."""
    text = SMALL_TEXT.replace('index: "https://download.pytorch.org/whl/cu124", ',
                              'index: "https://download.pytorch.org/whl/cu124", min_driver: "550.54.15", ', 1)
    assert text != SMALL_TEXT
    assert any("min_driver: is not above CUDA 12.4's min_driver 550.54.15" in line for line in problems_of(text))
    later = text.replace('min_driver: "550.54.15", ', 'min_driver: "550.90.07", ', 1)
    parse_matrix(later, Path("m.yaml"))
