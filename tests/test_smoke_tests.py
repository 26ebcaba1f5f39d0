"""smoke_tests against the real torch of this (CPU-only) host, and fakes where only a GPU would do.

Pass cases: environment with the installed torch's own versions, compile through
Inductor on the CPU, an exact all-reduce over gloo, GPU checks skipping. Fail cases
show that each check can fail: wrong versions, no C++ compiler, a hung, wrong or
crashed all-reduce (via the workers' test-only SMOKE_TESTS_FAULT), a CUDA build without a
GPU. The GPU paths are proven on fakes: a compiled stand-in for libcuda.so.1/NVML (driver
versions, MIG slices, compute modes through the real ctypes calls), recorded probe facts
for the cuda check's judge, FakeTensorMode for the device matmul, a faked device count.

The module is collected without torch: the tests that need it take the `torch` fixture,
which skips them; the pure ones still run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

import smoke_tests
from smoke_tests import driver, report
from smoke_tests.__main__ import main as cli_main
from smoke_tests.allreduce import CRASH_EXIT, FAULT_ENV
from smoke_tests.archs import Coverage, coverage, parse_entry, ptx_jit_impossible
from smoke_tests.context import ALLOW_NO_GPU_HINT, Context
from smoke_tests.driver import Device, judge_driver, mig_devices
from smoke_tests.expected import NOTHING_EXPECTED, Expected, ManifestError, load_expected
from smoke_tests.result import Result
from smoke_tests.toolchain import NO_COMPILER, Compiler, CompilerProblem, find_cxx
from smoke_tests.versions import decode_cudnn, decode_nccl, release_matches, torch_matches
from support.host_runs import host_manifest, host_smoke_run, smoke_env

REPO = Path(__file__).resolve().parent.parent
CU124 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


@pytest.fixture(scope="module")
def torch() -> Any:
    from support.unavailable import require_module

    return require_module("torch", "the smoke tests run on this host's torch (.ci/setup --tests installs the CPU build)")


correct_manifest = host_manifest  # support.host_runs': what a manifest for this very torch says


def cli_env(env: Optional[Dict[str, str]]) -> Dict[str, str]:
    return smoke_env(env)


def run_cli(*args: str, env: Optional[Dict[str, str]] = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smoke_tests", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=cli_env(env), check=False,
    )


def by_name(document: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {check["name"]: check for check in document["checks"]}


# ---------------------------------------------------------------- pure tables

@pytest.mark.parametrize(
    "device, arch_list, covered, via, jit",
    [
        ((9, 0), ["sm_80", "sm_90"], True, "sm_90", False),
        ((8, 6), ["sm_80"], True, "sm_80", False),  # same-major cubin compatibility
        ((8, 9), ["sm_80", "sm_86"], True, "sm_86", False),  # newest compatible cubin
        ((9, 0), ["sm_80", "sm_86"], False, None, False),  # cubins never cross majors
        ((12, 0), CU124, False, None, False),  # Blackwell on a cu124 build
        ((10, 0), CU124, False, None, False),
        ((12, 0), CU124 + ["sm_100", "sm_120"], True, "sm_120", False),
        ((12, 1), ["sm_120"], True, "sm_120", False),
        ((10, 0), ["sm_90", "compute_90"], True, "compute_90", True),  # PTX JITs forward
        ((12, 0), ["compute_80", "compute_90"], True, "compute_90", True),
        ((8, 6), ["compute_90"], False, None, False),  # PTX never runs backwards
        ((9, 0), ["sm_90a"], True, "sm_90a", False),
        ((10, 0), ["sm_90a", "compute_90a"], False, None, False),  # arch-specific: exact only
        ((10, 3), ["sm_100f"], True, "sm_100f", False),  # family-specific
        ((12, 0), ["sm_100f"], False, None, False),
        ((7, 5), [], False, None, False),
        ((8, 0), ["garbage", "sm_80"], True, "sm_80", False),
    ],
)
def test_arch_coverage(device, arch_list, covered, via, jit) -> None:
    result = coverage(device, arch_list)
    assert (result.covered, result.via, result.jit) == (covered, via, jit)


def test_arch_entry_reads_three_digit_capabilities() -> None:
    entries = {text: parse_entry(text) for text in ("sm_120", "sm_86", "compute_100a")}
    assert {text: (e.capability, e.suffix) if e else None for text, e in entries.items()} == {
        "sm_120": ((12, 0), ""), "sm_86": ((8, 6), ""), "compute_100a": ((10, 0), "a")}
    assert parse_entry("sm_8") is None


@pytest.mark.parametrize(
    "expected, measured, matches",
    [
        ("2.6.0", "2.6.0+cu124", True),
        ("2.6.0", "2.6.0", True),
        ("2.6", "2.6.0+cpu", True),
        ("2.6.0", "2.6.1+cu124", False),
        ("2.6.0", "2.5.1+cu124", False),
        ("2.6.0", "2.6.0a0+git1234", False),  # a source build is not the release
        ("2.6.0a0", "2.6.0a0+git1234", True),
        ("2.10.0", "2.1.0", False),  # numeric, not string, comparison
    ],
)
def test_torch_version_matching(expected, measured, matches) -> None:
    assert torch_matches(expected, measured) is matches


@pytest.mark.parametrize(
    "code, release",
    [(90100, (9, 1, 0)), (90800, (9, 8, 0)), (8907, (8, 9, 7)), (8600, (8, 6, 0)), (7605, (7, 6, 5))],
)
def test_decode_cudnn(code, release) -> None:
    assert decode_cudnn(code) == release


@pytest.mark.parametrize(
    "value, release",
    [((2, 21, 5), (2, 21, 5)), ([2, 27, 3], (2, 27, 3)), (22105, (2, 21, 5)), (2708, (2, 7, 8))],
)
def test_decode_nccl(value, release) -> None:
    assert decode_nccl(value) == release


@pytest.mark.parametrize(
    "expected, measured, matches",
    [((9, 1, 0), (9, 1, 0), True), ((12, 4), (12, 4), True), ((3, 11), (3, 11, 9), True),
     ((12, 4), (12, 1), False), ((2, 21, 5), (2, 21), False), ((2, 21, 0), (2, 21), True)],
)
def test_release_matches(expected, measured, matches) -> None:
    assert release_matches(expected, measured) is matches


@pytest.mark.parametrize("world, busbw", [(1, 0.0), (2, 10.0), (4, 15.0), (8, 17.5)])
def test_bus_bandwidth_like_nccl_tests(torch: Any, world, busbw) -> None:
    from smoke_tests.checks.nccl import bus_bandwidth

    assert bus_bandwidth(10.0, world) == pytest.approx(busbw)


# ---------------------------------------------------------------- manifest

def test_manifest_missing_means_no_expectations(tmp_path: Path) -> None:
    assert load_expected(str(tmp_path / "absent.json")) == NOTHING_EXPECTED


def test_manifest_env_override_and_null_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"torch": "2.6.0", "torch_cuda": None, "extra": {"x": 1}}))
    monkeypatch.setenv("SMOKE_TESTS_MANIFEST", str(path))
    expected = load_expected()
    assert expected == Expected(torch="2.6.0", cpu_build=True)
    # Saying nothing about CUDA is not the same as expecting a CPU build.
    assert Expected.from_manifest({"torch": "2.6.0"}).cpu_build is False


def test_manifest_unreadable_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text("[1, 2]")
    with pytest.raises(ManifestError, match="expected a JSON object"):
        load_expected(str(path))


# ---------------------------------------------------------------- compiler lookup

def test_find_cxx_runs_the_compiler() -> None:
    found = find_cxx({"PATH": os.environ["PATH"]})
    assert isinstance(found, Compiler) and found.version


def test_find_cxx_without_compiler(tmp_path: Path) -> None:
    assert find_cxx({"PATH": str(tmp_path)}) == CompilerProblem(NO_COMPILER)
    problem = find_cxx({"PATH": os.environ["PATH"], "CXX": "no-such-cxx -O2"})
    assert isinstance(problem, CompilerProblem) and "no-such-cxx" in problem.reason


# ---------------------------------------------------------------- environment

def test_environment_passes_with_the_installed_versions(torch: Any) -> None:
    from smoke_tests.checks import environment

    result = environment.check(Context(expected=Expected.from_manifest(correct_manifest())))
    assert result.status == "pass", result.reason
    assert result.measurements["torch"] == torch.__version__
    assert result.measurements["cxx"]


def test_environment_reports_every_wrong_expectation(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from smoke_tests.checks import environment

    monkeypatch.setenv("CUDA_VERSION", "12.1.1")  # as NVIDIA's base images set it
    wrong = {
        **correct_manifest(),
        "torch": "2.4.1", "torch_cuda": "12.4", "cudnn": "9.1.0.70", "nccl": "2.21.5", "image_cuda": "12.4",
    }
    result = environment.check(Context(expected=Expected.from_manifest(wrong)))
    assert result.status == "fail"
    assert f"torch {torch.__version__} != expected 2.4.1" in result.reason
    assert "CPU build" in result.reason and "expected CUDA 12.4" in result.reason
    assert "cuDNN not available, expected 9.1.0.70" in result.reason
    assert "NCCL not available, expected 2.21.5" in result.reason
    assert "image CUDA 12.1.1 (CUDA_VERSION) != expected 12.4" in result.reason


def test_environment_expecting_cuda_but_finding_cpu_build_fails_alone(torch: Any) -> None:
    from smoke_tests.checks import environment

    result = environment.check(Context(expected=Expected(torch_cuda="12.4")))
    assert result.status == "fail"
    assert result.reason == "torch is a CPU build (torch.version.cuda is None), expected CUDA 12.4"


# ---------------------------------------------------------------- GPU checks without a GPU

@pytest.mark.parametrize("name", ["cuda", "cuda_graph"])
def test_gpu_checks_skip_without_gpu_and_fail_when_required(torch: Any, name: str) -> None:
    (skipped,) = smoke_tests.run_checks([name])
    assert skipped.status == "skip" and "no CUDA GPU visible" in skipped.reason
    (failed,) = smoke_tests.run_checks([name], require_gpu=True)
    assert failed.status == "fail" and failed.reason.startswith("no CUDA GPU visible")


# ---------------------------------------------------------------- nccl (gloo here)

@pytest.mark.slow
def test_allreduce_hang_is_killed_at_the_time_limit(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "hang")
    start = time.monotonic()
    (result,) = smoke_tests.run_checks(["nccl"], timeout=10)
    elapsed = time.monotonic() - start
    assert result.status == "fail"
    assert "did not finish within 10s" in result.reason and "NCCL_DEBUG=WARN" in result.reason
    assert "/dev/shm" in result.reason
    assert elapsed < 10 + 5  # killed at the limit, not left to gloo's own timeout


@pytest.mark.slow
def test_allreduce_wrong_value_is_detected(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "wrong-value")
    (result,) = smoke_tests.run_checks(["nccl"], timeout=120)
    assert result.status == "fail"
    # world size 2: ranks fill 1 and 2, the sum is 3; one corrupted input element makes it 4.
    assert "1 element(s) differ" in result.reason and "is 4, expected 3" in result.reason


# ---------------------------------------------------------------- runner

def test_a_raising_check_becomes_a_fail(torch: Any) -> None:
    from smoke_tests.runner import run_one

    def broken(ctx: Context) -> Result:
        raise RuntimeError("CUDA error: no kernel image is available\nmore detail")

    result = run_one("broken", broken, Context())
    assert result.status == "fail"
    assert result.reason == "RuntimeError: CUDA error: no kernel image is available"


def test_a_stuck_check_is_abandoned_at_its_deadline(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from smoke_tests.runner import run_one

    monkeypatch.setattr("smoke_tests.runner.GRACE_S", 0.0)
    def stuck(ctx: Context) -> Result:
        time.sleep(60)
        return Result("stuck", "pass")

    result = run_one("stuck", stuck, Context(timeout=0.3))
    assert result.status == "fail" and "did not finish within 0.3s" in result.reason


def test_unknown_check_names_are_refused(torch: Any) -> None:
    from smoke_tests.runner import UnknownCheck

    with pytest.raises(UnknownCheck, match="known: environment, cuda, nccl, cache, compile, cuda_graph"):
        smoke_tests.run_checks(["environment", "gpu_burn"])


def test_report_round_trip_and_table() -> None:
    results = [
        Result("environment", "pass", "fine", {"torch": "2.6.0"}),
        Result("cuda", "fail", "no kernels for sm_120", {"gpu_count": 1}),
    ]
    document = json.loads(report.to_json(results, torch_version="2.6.0", gpu_count=1))
    assert document["ok"] is False and document["gpu_count"] == 1
    assert report.from_json(json.dumps(document)) == results
    table = report.format_table(results)
    assert "cuda         FAIL    no kernels for sm_120" in table and "gpu_count=1" in table
    assert table.endswith("FAILED: 1 failed, 1 passed")


# ---------------------------------------------------------------- the CLI, end to end

@pytest.fixture(scope="module")
def full_run(torch: Any) -> subprocess.CompletedProcess:
    """Every check through `python -m smoke_tests --json`, with a correct manifest: the session's
    one run of them on this host (support.host_runs; test_verify's `verify --local --json` reads it too)."""
    return host_smoke_run()


@pytest.mark.slow
def test_cli_json_passes_on_this_host(torch: Any, full_run: subprocess.CompletedProcess) -> None:
    from smoke_tests.checks import checks_for

    assert full_run.returncode == 0, full_run.stdout + full_run.stderr
    document = json.loads(full_run.stdout)
    assert document["ok"] is True and document["torch"] == torch.__version__ and document["gpu_count"] == 0
    assert [check["name"] for check in document["checks"]] == list(checks_for("runtime"))
    statuses = {name: check["status"] for name, check in by_name(document).items()}
    # No TORCHINDUCTOR_CACHE_DIR on this host: the cache check skips, as in an image imagebuilder did not build.
    assert statuses == {"environment": "pass", "cuda": "skip", "nccl": "pass", "cache": "skip", "compile": "pass",
                        "cuda_graph": "skip"}


@pytest.mark.slow
def test_cli_compile_ran_inductor_on_cpu(full_run: subprocess.CompletedProcess) -> None:
    compile_ = by_name(json.loads(full_run.stdout))["compile"]["measurements"]
    assert compile_["device"] == "cpu" and compile_["graphs"] == 1 and compile_["graph_breaks"] == 0
    assert compile_["kernels"] >= 1


@pytest.mark.slow
def test_cli_allreduce_ran_over_gloo(full_run: subprocess.CompletedProcess) -> None:
    nccl = by_name(json.loads(full_run.stdout))["nccl"]["measurements"]
    assert (nccl["backend"], nccl["world_size"], nccl["bytes"]) == ("gloo", 2, 8 * 2**20)
    assert nccl["algbw_GBps"] > 0 and nccl["busbw_GBps"] == pytest.approx(nccl["algbw_GBps"], rel=0.01)


def test_cli_fails_on_a_wrong_expectation(torch: Any, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({**correct_manifest(), "torch": "2.4.1"}))
    done = run_cli("--manifest", str(manifest), "--require-gpu", "--checks", "environment,cuda,cuda_graph")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "environment  FAIL" in done.stdout and "!= expected 2.4.1" in done.stdout
    assert "cuda         FAIL    no CUDA GPU visible" in done.stdout
    assert "cuda_graph   FAIL    no CUDA GPU visible" in done.stdout
    assert done.stdout.rstrip().endswith("FAILED: 3 failed")


# In-process from here: main() is the CLI minus the seconds a fresh torch import costs.

def test_cli_without_manifest_measures_only(
    torch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SMOKE_TESTS_MANIFEST", str(tmp_path / "none.json"))
    assert cli_main(["--json", "--checks", "environment"]) == 0
    (check,) = json.loads(capsys.readouterr().out)["checks"]
    assert check["status"] == "pass" and "measured only" in check["reason"]


def test_cli_without_compiler_fails_environment_and_compile(
    torch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert cli_main(["--json", "--checks", "environment,compile"]) == 1
    checks = by_name(json.loads(capsys.readouterr().out))
    for name in ("environment", "compile"):
        assert checks[name]["status"] == "fail"
        assert NO_COMPILER in checks[name]["reason"]


def test_cli_unknown_check_is_a_usage_error(torch: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["--checks", "environment,gpu_burn"]) == 2
    assert "unknown check(s) gpu_burn" in capsys.readouterr().err


def test_cli_unreadable_manifest_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{not json")
    assert cli_main(["--manifest", str(manifest)]) == 2
    assert f"manifest {manifest}" in capsys.readouterr().err


@pytest.mark.slow
def test_the_module_is_collected_and_its_pure_tests_run_without_torch() -> None:
    """A host without torch (a CI runner of imagebuilder alone) still collects this file."""
    blocker = textwrap.dedent("""
        import sys, pytest
        sys.modules["torch"] = None  # `import torch` now raises ImportError
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-k", "summary or judge_driver or mig_detection or fake_libcuda",
                              sys.argv[1]]))
    """)
    done = subprocess.run([sys.executable, "-c", blocker, __file__], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and "error" not in done.stdout.lower()


# ---------------------------------------------------------------- the summary and --allow-no-gpu

@pytest.mark.parametrize(
    "statuses, line",
    [(["pass", "pass", "pass", "skip", "skip"], "OK: 3 passed, 2 skipped"),
     (["pass", "fail", "skip"], "FAILED: 1 failed, 1 passed, 1 skipped"),
     (["skip"], "OK: 1 skipped"),
     ([], "OK: no check ran")],
)
def test_summary_says_passed_and_skipped(statuses, line) -> None:
    results = [Result(f"c{i}", status) for i, status in enumerate(statuses)]
    assert report.format_table(results).splitlines()[-1] == line


@pytest.mark.parametrize(
    "expected, torch_cuda, required",
    [(Expected(torch_cuda="12.4"), None, True),  # the manifest says CUDA: a GPU is the point
     (Expected(cpu_build=True), None, False),
     (NOTHING_EXPECTED, "12.4", True),  # no manifest: a CUDA torch decides
     (NOTHING_EXPECTED, None, False),
     (Expected(cpu_build=True), "12.4", False)],
)
def test_an_image_built_for_cuda_requires_a_gpu(torch: Any, expected, torch_cuda, required) -> None:
    from smoke_tests.runner import built_for_cuda

    assert built_for_cuda(expected, torch_cuda) is required


def test_cli_cuda_image_without_gpu_fails_unless_allowed(
    torch: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`docker run IMAGE python -m smoke_tests` without --gpus must not look green."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"torch": "2.6.0", "torch_cuda": "12.4"}))
    assert cli_main(["--manifest", str(manifest), "--checks", "cuda,cuda_graph"]) == 1
    out = capsys.readouterr().out
    assert ALLOW_NO_GPU_HINT.strip("; ") in out and out.rstrip().endswith("FAILED: 2 failed")
    assert cli_main(["--manifest", str(manifest), "--checks", "cuda,cuda_graph", "--allow-no-gpu"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK: 2 skipped")
    with pytest.raises(SystemExit) as exited:
        cli_main(["--require-gpu", "--allow-no-gpu"])
    assert exited.value.code == 2


# ---------------------------------------------------------------- the driver, through ctypes, on a fake

FAKE_LIBCUDA = r"""
#include <string.h>
int cuDriverGetVersion(int *v) { *v = DRIVER_CUDA; return 0; }
int cuInit(unsigned flags) { return 0; }
int cuDeviceGetCount(int *n) { *n = COUNT; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *s, int len, int d) { strncpy(s, d == 0 ? NAME0 : NAME1, len); return 0; }
int cuDeviceGetPCIBusId(char *s, int len, int d) { strncpy(s, d == 0 ? BUS0 : BUS1, len); return 0; }
int cuDeviceGetAttribute(int *v, int attribute, int d) { *v = attribute == 20 ? MODE : -1; return 0; }
"""
FAKE_NVML = r"""
#include <string.h>
int nvmlInit_v2(void) { return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 12020; return 0; }
int nvmlSystemGetDriverVersion(char *s, unsigned len) { strncpy(s, "535.183.01", len); return 0; }
"""


def compile_library(tmp_path: Path, name: str, source: str, **macros: object) -> str:
    """A stand-in for an NVIDIA library, so that the real ctypes calls run without a driver."""
    cc = find_cxx({"PATH": os.environ["PATH"]})
    if isinstance(cc, CompilerProblem):
        from support.unavailable import _unavailable

        _unavailable(cc.reason)
    c_file = tmp_path / f"{name}.c"
    c_file.write_text(source)
    library = tmp_path / name
    defines = [f"-D{key}={json.dumps(value) if isinstance(value, str) else value}" for key, value in macros.items()]
    subprocess.run(["gcc", "-shared", "-fPIC", *defines, "-o", str(library), str(c_file)], check=True)
    return str(library)


def fake_libcuda(tmp_path: Path, driver_cuda: int = 12040, count: int = 2, name0: str = "NVIDIA H200",
                 name1: str = "NVIDIA H200", bus0: str = "00000000:17:00.0", bus1: str = "00000000:65:00.0",
                 mode: int = 0) -> str:
    return compile_library(tmp_path, "libcuda.so.1", FAKE_LIBCUDA, DRIVER_CUDA=driver_cuda, COUNT=count,
                           NAME0=name0, NAME1=name1, BUS0=bus0, BUS1=bus1, MODE=mode)


def test_fake_libcuda_driver_versions_through_ctypes(tmp_path: Path) -> None:
    libcuda = fake_libcuda(tmp_path, driver_cuda=12080)
    nvml = compile_library(tmp_path, "libnvidia-ml.so.1", FAKE_NVML)
    assert driver.cuda_driver_version(libcuda, nvml) == ("12.8", "cuDriverGetVersion")
    # No libcuda.so.1 (a container with only NVML mounted): NVML's answer.
    assert driver.cuda_driver_version(str(tmp_path / "absent.so"), nvml) == ("12.2", "NVML")
    assert driver.display_driver_version(nvml) == ("535.183.01", "NVML")
    version, why = driver.cuda_driver_version(str(tmp_path / "absent.so"), str(tmp_path / "absent-nvml.so"))
    assert version is None and "could be loaded" in why


def test_fake_libcuda_lists_devices_mig_and_compute_mode(tmp_path: Path) -> None:
    slice_name = "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    libcuda = fake_libcuda(tmp_path, name0=slice_name, name1=slice_name, bus1="00000000:17:00.0", mode=3)
    found, error = driver.devices(libcuda)
    assert error is None
    assert found == [Device(0, slice_name, "00000000:17:00.0", "EXCLUSIVE_PROCESS"),
                     Device(1, slice_name, "00000000:17:00.0", "EXCLUSIVE_PROCESS")]
    assert mig_devices(found, visible="") == [0, 1]
    assert driver.devices(str(tmp_path / "absent.so")) == ([], f"{tmp_path / 'absent.so'} could not be loaded")


def test_a_library_without_the_entry_points_is_an_answer_not_a_crash(tmp_path: Path) -> None:
    stub = compile_library(tmp_path, "libstub.so", "int unrelated(void) { return 0; }\n")
    assert driver.cuda_driver_version(stub, stub)[0] is None
    if shutil.which("nvidia-smi") is None:  # else it answers in NVML's place
        assert driver.display_driver_version(stub) == (None, "unknown")
    assert driver.devices(stub) == ([], "cuInit failed with CUresult -1")


@pytest.mark.parametrize(
    "devices, visible, slices",
    [([Device(0, "NVIDIA H200", "0:17:00.0", "DEFAULT"), Device(1, "NVIDIA H200", "0:65:00.0", "DEFAULT")], "", []),
     ([Device(0, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "0:17:00.0", "DEFAULT")], "", [0]),
     # Two slices of one GPU with names that do not say so: the shared bus id does.
     ([Device(0, "NVIDIA A100", "0:17:00.0", "DEFAULT"), Device(1, "NVIDIA A100", "0:17:00.0", "DEFAULT")], "", [0, 1]),
     ([Device(0, "NVIDIA A100", "0:17:00.0", "DEFAULT")], "MIG-4f5e-aa", [0]),
     ([Device(0, "NVIDIA A100", "0:17:00.0", "DEFAULT")], "GPU-4f5e-aa,0", [])],
)
def test_mig_detection(devices, visible, slices) -> None:
    assert mig_devices(devices, visible=visible) == slices


@pytest.mark.parametrize(
    "host, status, compat, phrase",
    [("570.124.06", "pass", False, ">= 570.124.06"),
     ("580.95.05", "pass", False, ">= 570.124.06"),
     ("550.54.15", "pass", True, "through minor-version compatibility (>= 525.60.13)"),
     ("535.183.01", "pass", True, "cannot JIT-compile"),
     ("525.60.13", "pass", True, "minor-version compatibility"),
     ("525.60.12", "fail", False, "older than 525.60.13, the oldest that runs this image's CUDA 12.8"),
     ("470.256.02", "fail", False, "older than 525.60.13")],
)
def test_judge_driver_between_the_floors(host, status, compat, phrase) -> None:
    verdict = judge_driver(host, "570.124.06", "525.60.13", "12.8")
    assert (verdict.status, verdict.minor_version_compat) == (status, compat)
    assert phrase in verdict.detail


def test_judge_driver_without_a_compat_floor_keeps_the_toolkit_floor() -> None:
    assert judge_driver("550.54.15", "570.124.06").status == "fail"
    with pytest.raises(ValueError):
        judge_driver("n/a", "570.124.06")


@pytest.mark.parametrize(
    "covered, driver_cuda, torch_cuda, impossible",
    [(Coverage(True, "compute_90", jit=True), "12.2", "12.8", True),  # minor compat gives no PTX JIT
     (Coverage(True, "compute_90", jit=True), "12.8", "12.8", False),
     (Coverage(True, "compute_90", jit=True), None, "12.8", False),  # unknown decides nothing
     (Coverage(True, "sm_90", jit=False), "12.2", "12.8", False)],  # cubins run through minor compat
)
def test_ptx_jit_needs_a_driver_as_new_as_the_ptx(covered, driver_cuda, torch_cuda, impossible) -> None:
    assert ptx_jit_impossible(covered, driver_cuda, torch_cuda) is impossible


# ---------------------------------------------------------------- the cuda check's judge, on recorded facts

def probe_facts(*devices: Dict[str, Any], driver_version: str = "550.54.15",
                driver_cuda: str = "12.4") -> Dict[str, Any]:
    return {"torch_cuda": "12.8", "arch_list": ["sm_80", "sm_90", "compute_90"], "driver": driver_version,
            "driver_source": "NVML", "driver_cuda": driver_cuda, "driver_cuda_source": "cuDriverGetVersion",
            "devices_error": None, "mig": [], "devices": list(devices)}


def gpu(index: int = 0, capability=(9, 0), covered: bool = True, jit: bool = False, via: Optional[str] = "sm_90",
        error: Optional[float] = 1e-7, raised: Optional[str] = None, mode: str = "DEFAULT") -> Dict[str, Any]:
    return {"index": index, "name": "NVIDIA H200", "capability": list(capability),
            "arch": f"sm_{capability[0]}{capability[1]}", "covered": covered, "jit": jit, "via": via,
            "pci_bus_id": f"00000000:{index:02x}:00.0", "compute_mode": mode,
            "matmul_rel_error": error, "matmul_error": raised}


CU128_IMAGE = Expected(min_driver="570.124.06", min_driver_compat="525.60.13", image_cuda="12.8")


@pytest.mark.parametrize(
    "facts, status, phrase",
    [(probe_facts(gpu(0), gpu(1)), "pass", "2 GPU(s) (NVIDIA H200), driver 550.54.15, matmul on each GPU"),
     # 550 < 570 but through minor-version compatibility: pass, with the note.
     (probe_facts(gpu(0)), "pass", "through minor-version compatibility"),
     (probe_facts(gpu(0), driver_version="520.61.05"), "fail", "older than 525.60.13"),
     # A GPU only PTX covers, on a driver older than the PTX: the probe did not run it.
     (probe_facts(gpu(0, capability=(10, 0), jit=True, via="compute_90", error=None)), "fail",
      "GPU 0 NVIDIA H200 needs compute_90 PTX JIT-compiled, but the driver supports CUDA 12.4 < 12.8"),
     (probe_facts(gpu(0, capability=(12, 0), covered=False, via=None, error=None)), "fail",
      "is sm_120 but this torch (CUDA 12.8) has kernels only for sm_80, sm_90, compute_90 (Blackwell"),
     (probe_facts(gpu(0, error=0.7)), "fail", "GPU 0 NVIDIA H200: matmul off by 0.7"),
     (probe_facts(gpu(0, error=None, raised="RuntimeError: CUDA error: no kernel image is available")), "fail",
      "a matmul on the GPU raised RuntimeError: CUDA error: no kernel image"),
     (probe_facts(gpu(0, mode="EXCLUSIVE_PROCESS")), "pass", "GPU(s) [0] in EXCLUSIVE_PROCESS compute mode"),
     (probe_facts(), "fail", "the per-GPU probe saw no GPU"),
     (probe_facts(gpu(0), driver_version="N/A"), "fail", "cannot compare driver 'N/A'")],
)
def test_cuda_judge(torch: Any, facts, status, phrase) -> None:
    from smoke_tests.checks.cuda import judge

    result = judge(facts, CU128_IMAGE)
    assert result.status == status and phrase in result.reason, result.reason
    assert result.measurements.get("driver_cuda_source", "cuDriverGetVersion") == "cuDriverGetVersion"


def test_cuda_check_reports_a_probe_that_hangs_or_dies(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from smoke_tests.checks import cuda
    from smoke_tests.child import Finished

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    outcomes = iter([Finished("", "", None), Finished("", "Traceback...\nRuntimeError: CUDA driver error\n", 1),
                     Finished("noise\nSMOKE_TESTS_RESULT " + json.dumps(probe_facts(gpu(0))) + "\n", "", 0)])
    monkeypatch.setattr(cuda, "run_module", lambda module, args, timeout: next(outcomes))
    ctx = Context(expected=CU128_IMAGE, timeout=7)
    assert cuda.check(ctx).reason == "the per-GPU probe did not finish within 7s (killed): a GPU hangs"
    assert cuda.check(ctx).reason == "the per-GPU probe exited 1 without a result: RuntimeError: CUDA driver error"
    assert cuda.check(ctx).status == "pass"


def test_the_probe_runs_for_real_and_reads_the_driver_without_torch(torch: Any) -> None:
    from smoke_tests.child import run_module

    done = run_module("smoke_tests.gpu_probe", [], timeout=120)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.result_line() or "null")
    assert facts["devices"] == [] and facts["driver_cuda"] is None  # no driver on this host
    assert "libcuda.so.1" in facts["driver_cuda_source"]


def test_matmul_error_is_computed_on_the_device_with_torch_kernels(torch: Any) -> None:
    """FakeTensorMode gives a 'cuda' device on this CPU host; every op that computes the
    error must run there, and only a scalar may come back."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    from smoke_tests.gpu_probe import relative_error_on

    ops = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            devices = {a.device.type for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
            ops.append((func.overloadpacket.__name__, devices))
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(allow_non_fake_inputs=True), Record():
        error = relative_error_on("cuda:0", size=8)
    assert error.device.type == "cuda" and error.dim() == 0
    # From the matmul on the device on, nothing touches the CPU: the error is computed there.
    device_mm = ops.index(("mm", {"cuda"}))
    after = ops[device_mm:]
    assert all(devices == {"cuda"} for _, devices in after), after
    assert {"mm", "sub", "abs", "amax", "div"} <= {name for name, _ in after}
    # And on a real device (the CPU here) it is the right number: float32 vs float64.
    assert 0 < float(relative_error_on("cpu")) < 1e-5


# ---------------------------------------------------------------- nccl: one GPU, MIG, the first to fail

def test_one_gpu_skips_nccl_without_numbers(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from smoke_tests.checks import nccl

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = nccl.plan_for(Context(require_gpu=True), [Device(0, "NVIDIA H200", "0:17:00.0", "DEFAULT")])
    assert isinstance(result, Result) and result.status == "skip"
    assert "single-rank all-reduce moves no data" in result.reason
    assert not {"algbw_GBps", "busbw_GBps"} & set(result.measurements)


def test_mig_slices_skip_nccl_saying_so(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from smoke_tests.checks import nccl

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    slices = [Device(i, "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "00000000:17:00.0", "DEFAULT") for i in (0, 1)]
    result = nccl.plan_for(Context(), slices)
    assert isinstance(result, Result) and result.status == "skip"
    assert "MIG slices of one GPU (PCI bus 00000000:17:00.0)" in result.reason
    assert "Duplicate GPU detected" in result.reason
    whole = [Device(i, "NVIDIA H200", f"00000000:{17 + i}:00.0", "DEFAULT") for i in (0, 1)]
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert nccl.plan_for(Context(), whole) == nccl.Plan("nccl", 2, nccl.GPU_BYTES, nccl.GPU_ITERATIONS)


@pytest.mark.parametrize(
    "exits, first",
    [({0: (10.5, 1), 1: (10.2, 3), 2: (11.0, 1)}, (1, 3)),  # rank 1 died first; 0 and 2 followed
     ({0: (10.0, 0), 1: (12.0, -11)}, (1, -11)),
     ({0: (10.0, 1), 1: (10.0, 1)}, (0, 1)),  # a tie goes to the lower rank
     ({0: (10.0, 0), 1: (10.1, 0)}, None)],
)
def test_the_first_worker_to_fail_by_time_is_blamed(torch: Any, exits, first) -> None:
    from smoke_tests.checks.nccl import first_failure

    assert first_failure(exits) == first


def test_exclusive_process_busy_gpu_is_explained(torch: Any) -> None:
    from smoke_tests.checks.nccl import crash_hint

    busy = "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable"
    exclusive = [Device(0, "NVIDIA H200", "0:17:00.0", "EXCLUSIVE_PROCESS")]
    assert "GPU(s) [0] are in EXCLUSIVE_PROCESS compute mode" in crash_hint(busy, exclusive)
    assert crash_hint("RuntimeError: NCCL error", exclusive) == ""


@pytest.mark.slow
def test_allreduce_crash_blames_the_rank_that_died_first(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real gloo workers: the last rank exits at once, rank 0 fails after it in its all-reduce."""
    monkeypatch.setenv(FAULT_ENV, "crash")
    (result,) = smoke_tests.run_checks(["nccl"], timeout=60)
    assert result.status == "fail"
    assert result.reason.startswith(f"worker rank 1 exited {CRASH_EXIT} first"), result.reason
    assert result.measurements["exit_order"][0] == 1


# ---------------------------------------------------------------- compile on a Python Dynamo does not support

def test_compile_skips_with_dynamos_reason(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo import eval_frame

    from smoke_tests.checks import compile as compile_check

    def unsupported() -> None:
        raise RuntimeError("Python 3.13+ not yet supported for torch.compile")

    monkeypatch.setattr(eval_frame, "check_if_dynamo_supported", unsupported)
    result = compile_check.check(Context(require_gpu=True))
    assert result.status == "skip"
    assert result.reason == "torch.compile is not supported here: Python 3.13+ not yet supported for torch.compile"


# ---------------------------------------------------------------- the compile caches' folder

# /proc/self/mountinfo of a container: its layer at /, a named volume, a tmpfs, a path with a space.
MOUNTINFO = """\
612 540 0:52 / / rw,relatime master:301 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
613 612 0:55 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
640 612 8:1 /var/lib/docker/volumes/torch-cache/_data /home/torch/.cache/torch rw,relatime - ext4 /dev/sda1 rw
641 612 0:60 / /scratch rw,nosuid,nodev - tmpfs tmpfs rw,size=65536k
642 612 8:1 /home/me/my\\040project /work\\040space rw,relatime shared:1 master:2 - xfs /dev/sda2 rw
643 641 8:1 /srv /scratch/kept rw,relatime - ext4 /dev/sda1 rw
"""


@pytest.mark.parametrize(("path", "point", "fstype"), [
    ("/home/torch/.cache/torch", "/home/torch/.cache/torch", "ext4"),  # the volume itself
    ("/home/torch/.cache/torch/inductor", "/home/torch/.cache/torch", "ext4"),
    ("/home/torch/.cache/torchvision", "/", "overlay"),  # a name that only starts like the mount point
    ("/home/torch/.cache", "/", "overlay"),
    ("/scratch/cache", "/scratch", "tmpfs"),
    ("/scratch/kept/cache", "/scratch/kept", "ext4"),  # the deepest mount wins
    ("/work space/cache", "/work space", "xfs"),  # \040 is a space; optional fields skipped
])
def test_the_mount_that_holds_a_folder(torch: Any, path: str, point: str, fstype: str) -> None:
    from smoke_tests.checks.cache import Mount, mount_of, parse_mountinfo

    assert mount_of(path, parse_mountinfo(MOUNTINFO)) == Mount(point, fstype)


def test_a_later_mount_at_the_same_point_covers_the_earlier(torch: Any) -> None:
    from smoke_tests.checks.cache import Mount, mount_of, parse_mountinfo

    stacked = MOUNTINFO + "650 612 0:70 / /home/torch/.cache/torch rw - tmpfs tmpfs rw\n"
    assert mount_of("/home/torch/.cache/torch/x", parse_mountinfo(stacked)) == Mount("/home/torch/.cache/torch", "tmpfs")


def _cache_env(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folder / "triton"))
    monkeypatch.delenv("CUDA_CACHE_PATH", raising=False)


@pytest.mark.parametrize(("root", "mounted", "in_container", "phrase", "kept"), [
    ("overlay", None, True, "not a volume (overlay at /: lost with the container; mount one to keep "
                            "compiled kernels across containers: docker run -v torch-cache:{folder})", False),
    # Docker's btrfs, zfs or vfs storage driver: / looks like a disk, yet it is the container's layer.
    ("btrfs", None, True, "not a volume (btrfs at /: lost with the container;", False),
    ("ext4", None, False, "on this machine's disk (ext4 at /): compiled kernels stay", True),  # verify --local
    ("overlay", "ext4", True, "a volume (ext4 at {folder}): compiled kernels outlive the container", True),
    ("overlay", "tmpfs", True, "not a volume (tmpfs at {folder}: lost with the container;", False),
])
def test_the_cache_check_says_whether_a_volume_keeps_the_folder(
    torch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: str, mounted: Optional[str],
    in_container: bool, phrase: str, kept: bool,
) -> None:
    from smoke_tests.checks import cache

    folder = tmp_path / "torch"
    folder.mkdir()
    _cache_env(monkeypatch, folder)
    mountinfo = tmp_path / "mountinfo"
    lines = f"612 540 0:52 / / rw,relatime - {root} {root} rw\n"
    if mounted is not None:
        lines += f"640 612 8:1 /v {folder} rw - {mounted} /dev/sda1 rw\n"
    mountinfo.write_text(lines)
    marker = tmp_path / ".dockerenv"
    if in_container:
        marker.touch()
    result = cache.check(Context(), mountinfo=str(mountinfo), container_markers=[str(marker)])
    assert result.status == "pass"
    assert result.reason.startswith(f"{folder} writable; {phrase.format(folder=folder)}"), result.reason
    assert result.measurements["kept"] is kept


def test_the_cache_check_fails_a_cache_another_uid_filled(
    torch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder is open to every uid, what one uid made in it is not: Triton's folder here is
    one no uid can write (sysfs), as a volume filled by root is to uid 1000."""
    from smoke_tests.checks import cache

    _cache_env(monkeypatch, tmp_path)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/sys")
    result = cache.check(Context())
    assert result.status == "fail"
    owner = os.stat("/sys").st_uid
    assert result.reason.startswith(f"not writable by uid {os.getuid()}: /sys (TRITON_CACHE_DIR, owned by uid {owner}): "
                                    "another uid filled this cache;"), result.reason


@pytest.mark.parametrize(("cache_dir", "code", "status", "phrase"), [
    ("{tmp}/torch/inductor", 0, "pass", "{tmp}/torch writable; "),
    ("{tmp}/new/torch/inductor", 0, "pass", "{tmp}/new/torch does not exist yet (torch makes it; {tmp} writable); "),
    # A folder no uid writes, root included (which ignores modes): sysfs.
    ("/sys/inductor", 1, "fail", "/sys is not writable by uid {uid} (/sys: "),
    ("", 0, "skip", "TORCHINDUCTOR_CACHE_DIR is not set (an image imagebuilder did not build, or a Python outside "
                    "one): torch.compile caches in /tmp/torchinductor_<user>"),
])
def test_the_cache_check_through_the_cli(torch: Any, tmp_path: Path, cache_dir: str, code: int, status: str,
                                         phrase: str) -> None:
    (tmp_path / "torch").mkdir()
    done = run_cli("--checks", "cache", "--json", "--allow-no-gpu",
                   env={"TORCHINDUCTOR_CACHE_DIR": cache_dir.format(tmp=tmp_path)})
    assert done.returncode == code, done.stdout + done.stderr
    (check,) = json.loads(done.stdout)["checks"]
    assert check["status"] == status
    assert check["reason"].startswith(phrase.format(tmp=tmp_path, uid=os.getuid())), check["reason"]
    if status == "fail":
        assert "mount a volume there (docker run -v torch-cache:/sys: " in check["reason"]
    else:
        assert not list((tmp_path / "torch").iterdir())  # the probe left nothing behind


# ---------------------------------------------------------------- bench/gpu_verify.sh

@pytest.mark.slow
def test_gpu_verify_script_keeps_what_finished_when_a_check_hangs(torch: Any, tmp_path: Path) -> None:
    """A hung check costs its own limit, the total limit holds, and every result is on disk
    the moment its check finished (a stand-in python hangs the nccl check, ignoring SIGTERM)."""
    fake_python = tmp_path / "python"
    fake_python.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        case "$*" in *"--checks nccl"*) trap '' TERM; sleep 600; exit 0;; esac
        exec {sys.executable} "$@"
    """))
    fake_python.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_VERIFY_PYTHON": str(fake_python), "GPU_VERIFY_CHECK_S": "15",
           "GPU_VERIFY_TOTAL_S": "30", "GPU_VERIFY_CHECKS": "environment,nccl,cuda",
           "GPU_VERIFY_GPU_FLAG": "--allow-no-gpu"}
    env.pop(FAULT_ENV, None)
    start = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu_verify.sh")], capture_output=True, text=True,
                          env=env, timeout=180, check=False)
    elapsed = time.monotonic() - start
    assert done.returncode == 1, done.stdout + done.stderr
    checks = {check["name"]: check for check in json.loads((out / "verify.json").read_text())["checks"]}
    assert list(checks) == ["environment", "nccl", "cuda"]
    assert checks["environment"]["status"] == "pass"
    assert checks["nccl"]["status"] == "fail"
    killed = re.match(r"killed at the check's limit of (\d+)s", checks["nccl"]["reason"])
    assert killed is not None, checks["nccl"]["reason"]
    limit = int(killed.group(1))
    # Whatever this host's speed: nccl got min(15s, what was left) and 5s more for SIGKILL,
    # so at most 9 of the 30s remain, too few for another check.
    assert checks["cuda"]["reason"] == "not run: the run's total limit of 30s is spent"
    # The environment result was on disk while nccl still hung, not only at the end.
    written = {name: (out / "checks" / f"{name}.json").stat().st_mtime for name in checks}
    assert written["nccl"] - written["environment"] >= limit
    assert elapsed < 30 + 20, done.stdout
    assert "FAILED: 2 failed, 1 passed" in done.stdout


@pytest.mark.slow
def test_gpu_verify_script_stops_at_its_total_limit(torch: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_VERIFY_PYTHON": sys.executable, "GPU_VERIFY_TOTAL_S": "12",
           "GPU_VERIFY_CHECKS": "environment,cuda", "GPU_VERIFY_GPU_FLAG": "--allow-no-gpu"}
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu_verify.sh")], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    checks = {check["name"]: check for check in json.loads((out / "verify.json").read_text())["checks"]}
    assert set(checks) == {"environment", "cuda"}, done.stdout + done.stderr
    # Whatever the host's speed: a check either ran within what was left, or says it did not run.
    assert checks["cuda"]["status"] in ("skip", "fail")
    if checks["cuda"]["status"] == "fail":
        assert "total limit of 12s is spent" in checks["cuda"]["reason"] or "killed" in checks["cuda"]["reason"]
