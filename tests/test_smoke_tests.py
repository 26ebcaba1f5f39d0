"""smoke_tests against the real torch of this (CPU-only) host.

Pass cases: environment with the installed torch's own versions, compile through
Inductor on the CPU, an exact all-reduce over gloo, GPU checks skipping. Fail cases
show that each check can fail: wrong versions, no C++ compiler, a hung or wrong
all-reduce (via the workers' test-only SMOKE_TESTS_FAULT), --require-gpu.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import torch

import smoke_tests
from smoke_tests import report
from smoke_tests.__main__ import main as cli_main
from smoke_tests.allreduce import FAULT_ENV
from smoke_tests.archs import coverage, parse_entry
from smoke_tests.checks import checks_for, environment
from smoke_tests.checks.nccl import bus_bandwidth
from smoke_tests.context import Context
from smoke_tests.expected import NOTHING_EXPECTED, Expected, ManifestError, load_expected
from smoke_tests.result import Result
from smoke_tests.runner import UnknownCheck, run_one
from smoke_tests.toolchain import NO_COMPILER, Compiler, CompilerProblem, find_cxx
from smoke_tests.versions import decode_cudnn, decode_nccl, release_matches, torch_matches

REPO = Path(__file__).resolve().parent.parent
CU124 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def correct_manifest() -> Dict[str, Any]:
    """What an imagebuilder manifest for this very torch would say."""
    return {
        "torch": torch.__version__.split("+")[0],
        "torch_cuda": torch.version.cuda,  # None: this host's torch is a CPU build
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "variant": "runtime",
        "unrelated_key": [1, 2, 3],
    }


def cli_env(env: Optional[Dict[str, str]]) -> Dict[str, str]:
    base = dict(os.environ)
    base["PYTHONPATH"] = str(REPO)
    # One compile worker: spawning Inductor's worker pool costs more than it saves here.
    base.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    base.pop(FAULT_ENV, None)
    base.update(env or {})
    return base


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
    assert parse_entry("sm_120").capability == (12, 0)
    assert parse_entry("sm_86").capability == (8, 6)
    assert parse_entry("compute_100a").suffix == "a"
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
def test_bus_bandwidth_like_nccl_tests(world, busbw) -> None:
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

def test_environment_passes_with_the_installed_versions() -> None:
    result = environment.check(Context(expected=Expected.from_manifest(correct_manifest())))
    assert result.status == "pass", result.reason
    assert result.measurements["torch"] == torch.__version__
    assert result.measurements["cxx"]


def test_environment_reports_every_wrong_expectation(monkeypatch: pytest.MonkeyPatch) -> None:
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


def test_environment_expecting_cuda_but_finding_cpu_build_fails_alone() -> None:
    result = environment.check(Context(expected=Expected(torch_cuda="12.4")))
    assert result.status == "fail"
    assert result.reason == "torch is a CPU build (torch.version.cuda is None), expected CUDA 12.4"


# ---------------------------------------------------------------- GPU checks without a GPU

@pytest.mark.parametrize("name", ["cuda", "cuda_graph"])
def test_gpu_checks_skip_without_gpu_and_fail_when_required(name: str) -> None:
    (skipped,) = smoke_tests.run_checks([name])
    assert skipped.status == "skip" and "no CUDA GPU visible" in skipped.reason
    (failed,) = smoke_tests.run_checks([name], require_gpu=True)
    assert failed.status == "fail" and failed.reason.startswith("no CUDA GPU visible")


# ---------------------------------------------------------------- nccl (gloo here)

def test_allreduce_hang_is_killed_at_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "hang")
    start = time.monotonic()
    (result,) = smoke_tests.run_checks(["nccl"], timeout=10)
    elapsed = time.monotonic() - start
    assert result.status == "fail"
    assert "did not finish within 10s" in result.reason and "NCCL_DEBUG=WARN" in result.reason
    assert "/dev/shm" in result.reason
    assert elapsed < 10 + 5  # killed at the limit, not left to gloo's own timeout


def test_allreduce_wrong_value_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "wrong-value")
    (result,) = smoke_tests.run_checks(["nccl"], timeout=120)
    assert result.status == "fail"
    # world size 2: ranks fill 1 and 2, the sum is 3; one corrupted input element makes it 4.
    assert "1 element(s) differ" in result.reason and "is 4, expected 3" in result.reason


# ---------------------------------------------------------------- runner

def test_a_raising_check_becomes_a_fail() -> None:
    def broken(ctx: Context) -> Result:
        raise RuntimeError("CUDA error: no kernel image is available\nmore detail")

    result = run_one("broken", broken, Context())
    assert result.status == "fail"
    assert result.reason == "RuntimeError: CUDA error: no kernel image is available"


def test_a_stuck_check_is_abandoned_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("smoke_tests.runner.GRACE_S", 0.0)
    result = run_one("stuck", lambda ctx: time.sleep(60) or Result("stuck", "pass"), Context(timeout=0.3))
    assert result.status == "fail" and "did not finish within 0.3s" in result.reason


def test_unknown_check_names_are_refused() -> None:
    with pytest.raises(UnknownCheck, match="known: environment, cuda, nccl, compile, cuda_graph"):
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
    assert table.endswith("FAILED: 2 check(s), 1 failed")


# ---------------------------------------------------------------- the CLI, end to end

@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """Every check through `python -m smoke_tests --json`, with a correct manifest."""
    manifest = tmp_path_factory.mktemp("manifest") / "manifest.json"
    manifest.write_text(json.dumps(correct_manifest()))
    return run_cli("--json", env={"SMOKE_TESTS_MANIFEST": str(manifest)})


def test_cli_json_passes_on_this_host(full_run: subprocess.CompletedProcess) -> None:
    assert full_run.returncode == 0, full_run.stdout + full_run.stderr
    document = json.loads(full_run.stdout)
    assert document["ok"] is True and document["torch"] == torch.__version__ and document["gpu_count"] == 0
    assert [check["name"] for check in document["checks"]] == list(checks_for("runtime"))
    statuses = {name: check["status"] for name, check in by_name(document).items()}
    assert statuses == {"environment": "pass", "cuda": "skip", "nccl": "pass", "compile": "pass", "cuda_graph": "skip"}


def test_cli_compile_ran_inductor_on_cpu(full_run: subprocess.CompletedProcess) -> None:
    compile_ = by_name(json.loads(full_run.stdout))["compile"]["measurements"]
    assert compile_["device"] == "cpu" and compile_["graphs"] == 1 and compile_["graph_breaks"] == 0
    assert compile_["kernels"] >= 1


def test_cli_allreduce_ran_over_gloo(full_run: subprocess.CompletedProcess) -> None:
    nccl = by_name(json.loads(full_run.stdout))["nccl"]["measurements"]
    assert (nccl["backend"], nccl["world_size"], nccl["bytes"]) == ("gloo", 2, 8 * 2**20)
    assert nccl["algbw_GBps"] > 0 and nccl["busbw_GBps"] == pytest.approx(nccl["algbw_GBps"], rel=0.01)


def test_cli_fails_on_a_wrong_expectation(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({**correct_manifest(), "torch": "2.4.1"}))
    done = run_cli("--manifest", str(manifest), "--require-gpu", "--checks", "environment,cuda,cuda_graph")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "environment  FAIL" in done.stdout and "!= expected 2.4.1" in done.stdout
    assert "cuda         FAIL    no CUDA GPU visible" in done.stdout
    assert "cuda_graph   FAIL    no CUDA GPU visible" in done.stdout
    assert done.stdout.rstrip().endswith("FAILED: 3 check(s), 3 failed")


# In-process from here: main() is the CLI minus the seconds a fresh torch import costs.

def test_cli_without_manifest_measures_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SMOKE_TESTS_MANIFEST", str(tmp_path / "none.json"))
    assert cli_main(["--json", "--checks", "environment"]) == 0
    (check,) = json.loads(capsys.readouterr().out)["checks"]
    assert check["status"] == "pass" and "measured only" in check["reason"]


def test_cli_without_compiler_fails_environment_and_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert cli_main(["--json", "--checks", "environment,compile"]) == 1
    checks = by_name(json.loads(capsys.readouterr().out))
    for name in ("environment", "compile"):
        assert checks[name]["status"] == "fail"
        assert NO_COMPILER in checks[name]["reason"]


def test_cli_unknown_check_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["--checks", "environment,gpu_burn"]) == 2
    assert "unknown check(s) gpu_burn" in capsys.readouterr().err


def test_cli_unreadable_manifest_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{not json")
    assert cli_main(["--manifest", str(manifest)]) == 2
    assert f"manifest {manifest}" in capsys.readouterr().err
