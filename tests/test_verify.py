"""imagebuilder verify: preflight as a table, output parsing, --local for real, Docker for real."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support.fake_daemon import BUILT_BY_IMAGEBUILDER, OFFLINE, FakeEngine, document
from support.host_runs import host_verify

from imagebuilder.engine.api import NO_ACCESS, BuildRequest, HostAccess, RunResult
from imagebuilder.engine.classic import ClassicBuilder
from imagebuilder.engine.errors import ContainerFailed, GpuUnavailable
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.verify.lend import expected_from_torch
from imagebuilder.verify.lend import LENT_MANIFEST, PROBE_PREFIX
from imagebuilder.verify.output import parse_output
from imagebuilder.verify.preflight import daemon_runtime, Gpu, HostFacts, parse_nvidia_smi, preflight, read_gpu_probe
from imagebuilder.verify.report import NOT_RUN, VerificationFailed, VerifyReport
from imagebuilder.verify.run import run_process, verify_image, verify_local
from smoke_tests.result import Result

# Containers of the base image and classic builds of tiny images on it, no BuildKit and no
# torch image of the session's: CI runs these beside the builds (.ci/run, beside_builds).
pytestmark = pytest.mark.beside_builds

if TYPE_CHECKING:
    from imagebuilder.engine.docker import DockerEngine

REPO = Path(__file__).resolve().parent.parent
H100 = Gpu("NVIDIA H100 80GB HBM3", "550.54.15")
HOST_HAS_GPU = shutil.which("nvidia-smi") is not None


def gpus(driver: str, count: int = 1) -> tuple[Gpu, ...]:
    return tuple(Gpu("NVIDIA A100-SXM4-80GB", driver) for _ in range(count))


# --------------------------------------------------------------------------- preflight table

RUNTIME = "docker info lists the nvidia runtime"

PREFLIGHT_CASES: list[tuple[str, HostFacts, bool, dict[str, str | None], str]] = [
    # id, facts, allow_no_gpu, expected statuses, a phrase the failing detail must contain
    ("all-good", HostFacts(gpus=(H100,), min_driver="530.30.02", nvidia_runtime=RUNTIME), False,
     {"daemon": "pass", "image": "pass", "gpu": "pass", "runtime": "pass", "driver": "pass"}, ""),
    ("driver-older", HostFacts(gpus=gpus("525.85.12"), min_driver="530.30.02", cuda="12.1.1",
                               nvidia_runtime=RUNTIME), False,
     {"driver": "fail"}, "host driver 525.85.12 is older than 530.30.02, which this image's CUDA "
                         "12.1.1 needs: upgrade the driver or use an image for an older CUDA"),
    ("driver-newer", HostFacts(gpus=gpus("535.104.05"), min_driver="530.30.02", nvidia_runtime=RUNTIME),
     False, {"driver": "pass"}, ""),
    # Integer fields: "530.30.2" equals "530.30.02"; as strings "2" > "02" would still pass,
    # but "530.30.10" < "530.30.9" would not, so one of each.
    ("driver-equal-leading-zero", HostFacts(gpus=gpus("530.30.2"), min_driver="530.30.02",
                                            nvidia_runtime=RUNTIME), False, {"driver": "pass"}, ""),
    ("driver-integer-compare", HostFacts(gpus=gpus("530.30.10"), min_driver="530.30.9",
                                         nvidia_runtime=RUNTIME), False, {"driver": "pass"}, ""),
    ("driver-oldest-gpu-counts", HostFacts(gpus=(H100, Gpu("x", "470.1")), min_driver="530.30.02",
                                           nvidia_runtime=RUNTIME), False, {"driver": "fail"},
     "host driver 470.1 is older"),
    ("driver-no-label", HostFacts(gpus=(H100,), nvidia_runtime=RUNTIME), False, {"driver": "skip"}, ""),
    # Minor-version compatibility: a cu128 image on the 535 branch (DGX H100/H200) runs.
    ("driver-between-floors", HostFacts(gpus=gpus("535.183.01"), min_driver="570.124.06",
                                        min_driver_compat="525.60.13", cuda="12.8.1", nvidia_runtime=RUNTIME),
     False, {"driver": "pass"}, ""),
    ("driver-at-compat-floor", HostFacts(gpus=gpus("525.60.13"), min_driver="570.124.06",
                                         min_driver_compat="525.60.13", nvidia_runtime=RUNTIME),
     False, {"driver": "pass"}, ""),
    ("driver-below-compat-floor", HostFacts(gpus=gpus("520.61.05"), min_driver="570.124.06",
                                            min_driver_compat="525.60.13", cuda="12.8.1", nvidia_runtime=RUNTIME),
     False, {"driver": "fail"}, "host driver 520.61.05 is older than 525.60.13, the oldest that runs this "
                                "image's CUDA 12.8.1 even through minor-version compatibility"),
    ("driver-cuda13-on-a-12-driver", HostFacts(gpus=gpus("575.57.08"), min_driver="580.95.05",
                                               min_driver_compat="580.65.06", nvidia_runtime=RUNTIME),
     False, {"driver": "fail"}, "older than 580.65.06"),
    ("driver-garbage", HostFacts(gpus=gpus("n/a"), min_driver="530.30.02", nvidia_runtime=RUNTIME), False,
     {"driver": "fail"}, "cannot compare"),
    ("no-gpu", HostFacts(gpu_error="nvidia-smi lists none"), False,
     {"gpu": "fail", "runtime": "skip", "driver": "skip"}, "no NVIDIA GPU visible on the Docker daemon's host"),
    ("no-gpu-allowed", HostFacts(gpu_error="nvidia-smi not found"), True,
     {"gpu": "skip", "runtime": "skip", "driver": "skip"}, ""),
    ("no-runtime", HostFacts(gpus=(H100,), min_driver="530.30.02"), False,
     {"gpu": "pass", "runtime": "fail"}, "install the NVIDIA Container Toolkit"),
    # --allow-no-gpu forgives a host without GPUs, not a GPU host that cannot use them.
    ("no-runtime-allowed", HostFacts(gpus=(H100,)), True, {"runtime": "fail"}, "nvidia-ctk runtime configure"),
    # The GPUs are read from the image through the daemon: nothing past either can be judged.
    ("image-missing", HostFacts(image_error="image nosuch:1 is not here and could not be pulled: not found"),
     False, {"daemon": "pass", "image": "fail", "gpu": None}, "nosuch:1"),
    ("image-pulled", HostFacts(gpus=(H100,), nvidia_runtime=RUNTIME, pulled=True), False,
     {"image": "pass"}, ""),
    ("no-daemon", HostFacts(daemon_error="could not reach the Docker daemon at unix://x"),
     False, {"daemon": "fail", "image": None, "gpu": None}, "could not reach the Docker daemon"),
    ("local-has-no-docker-items", HostFacts(gpus=(H100,), in_container=False, min_driver="560.28.03"), False,
     {"gpu": "pass", "driver": "fail"}, "older than 560.28.03, which this image needs"),
]


@pytest.mark.parametrize(("facts", "allow_no_gpu", "statuses", "phrase"),
                         [case[1:] for case in PREFLIGHT_CASES], ids=[case[0] for case in PREFLIGHT_CASES])
def test_preflight(facts: HostFacts, allow_no_gpu: bool, statuses: dict[str, str | None], phrase: str) -> None:
    result = preflight(facts, allow_no_gpu=allow_no_gpu)
    got = {item.name: item.status for item in result.items}
    assert {name: got.get(name) for name in statuses} == statuses
    assert result.ok == all(status != "fail" for status in got.values())
    assert result.ok == (not phrase)
    if phrase:
        assert any(phrase in item.detail for item in result.problems), result.problems
    if not facts.in_container:
        assert not {"daemon", "image", "runtime"} & set(got)
    assert result.use_gpus == bool(facts.gpus)


def test_preflight_between_the_floors_passes_with_the_ptx_jit_note() -> None:
    facts = HostFacts(gpus=gpus("550.54.15"), min_driver="570.124.06", min_driver_compat="525.60.13",
                      cuda="12.8.1", nvidia_runtime=RUNTIME)
    (driver,) = [item for item in preflight(facts, allow_no_gpu=False).items if item.name == "driver"]
    assert driver.status == "pass"
    assert driver.detail == (
        "host driver 550.54.15 runs this image's CUDA 12.8.1 through minor-version compatibility "
        "(>= 525.60.13); below 570.124.06 the driver cannot JIT-compile the image's PTX, so a GPU that "
        "needs PTX JIT fails")


def test_preflight_reports_every_problem_at_once() -> None:
    facts = HostFacts(gpus=gpus("525.85.12"), min_driver="530.30.02")
    assert [item.name for item in preflight(facts, allow_no_gpu=False).problems] == ["runtime", "driver"]


@pytest.mark.parametrize(("text", "expected"), [
    ("NVIDIA H100 80GB HBM3, 550.54.15\nNVIDIA H100 80GB HBM3, 550.54.15\n",
     (Gpu("NVIDIA H100 80GB HBM3", "550.54.15"),) * 2),
    ("Tesla T4, 470.57.02", (Gpu("Tesla T4", "470.57.02"),)),
    ("NVIDIA A100-SXM4-40GB, MIG 1g.5gb, 535.129.03", (Gpu("NVIDIA A100-SXM4-40GB, MIG 1g.5gb", "535.129.03"),)),
    ("", ()),
    ("No devices were found\n", ()),
])
def test_parse_nvidia_smi(text: str, expected: tuple[Gpu, ...]) -> None:
    assert parse_nvidia_smi(text) == expected


# --------------------------------------------------------------------------- the daemon's host

NO_DEVICE_DRIVER = 'could not select device driver "" with capabilities: [[gpu]]'


@pytest.mark.parametrize(("outcome", "found", "accepted", "phrase"), [
    (RunResult(0, "NVIDIA H100 80GB HBM3, 550.54.15\nNVIDIA H100 80GB HBM3, 550.54.15\n", False, 1.0),
     (H100, H100), True, None),
    (RunResult(0, "No devices were found\n", False, 1.0), (), True, "nvidia-smi lists none"),
    (RunResult(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", False, 1.0),
     (), True, "nvidia-smi failed with exit code 9: NVIDIA-SMI has failed because"),
    (RunResult(137, "", True, 30.0), (), True, "did not answer within 30s"),
    # A daemon without the NVIDIA Container Toolkit (this CI's), in its own words.
    (NO_DEVICE_DRIVER, (), False, "could not start a container with GPUs (could not select device driver"),
    ('failed to create shim task: OCI runtime create failed: exec: "nvidia-smi": executable file not found '
     "in $PATH: unknown", (), True, "mounted no nvidia-smi"),
])
def test_read_gpu_probe(outcome: RunResult | str, found: tuple[Gpu, ...], accepted: bool, phrase: str | None) -> None:
    probe = read_gpu_probe(outcome)
    assert (probe.gpus, probe.accepted) == (found, accepted)
    assert probe.error is None if phrase is None else phrase in (probe.error or "")
    if not accepted:
        assert "NVIDIA Container Toolkit on the Docker daemon's host" in (probe.error or "")


@pytest.mark.parametrize(("info", "runtime"), [
    ({"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}}, "the daemon lists the nvidia runtime"),
    # Engine API 1.50+: the CDI devices the daemon found on its own host.
    ({"Runtimes": {"runc": {}}, "CDISpecDirs": ["/etc/cdi"],
      "DiscoveredDevices": [{"Source": "cdi", "ID": "vendor.com/fpga=0"}, {"Source": "cdi", "ID": "nvidia.com/gpu=0"}]},
     "the daemon lists the CDI device nvidia.com/gpu=0"),
    ({"Runtimes": {"runc": {}}, "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"]}, None),
    ({}, None),
])
def test_daemon_runtime_reads_only_the_daemons_info(info: dict[str, Any], runtime: str | None) -> None:
    assert daemon_runtime(info) == runtime


@pytest.mark.parametrize(("output", "expected"), [
    ("Warning: no NumPy\n" + PROBE_PREFIX + json.dumps({"python": "3.11.2", "torch": "2.6.0+cu124",
                                                         "torch_cuda": "12.4"}) + "\n",
     {"torch": "2.6.0+cu124", "torch_cuda": "12.4", "python": "3.11.2"}),
    (PROBE_PREFIX + json.dumps({"python": "3.12.1", "torch": "2.13.0+cpu", "torch_cuda": None}),
     {"torch": "2.13.0+cpu", "torch_cuda": None, "python": "3.12.1"}),
    (PROBE_PREFIX + json.dumps({"python": "3.11.2", "error": "ModuleNotFoundError(\"No module named 'torch'\")"}),
     None),
    (PROBE_PREFIX + "{broken", None),
    ("python3: not found", None),
])
def test_expected_from_torch(output: str, expected: dict[str, Any] | None) -> None:
    assert expected_from_torch(output) == expected


# --------------------------------------------------------------------------- output parsing


def test_parse_output_finds_the_report_among_warnings() -> None:
    noise = ("UserWarning: Failed to initialize NumPy\n  cpu = _conversion_method_template(...)\n"
             "{not json\n")
    output = noise + json.dumps(document("pass", "skip"), indent=2) + "\nW0101 trailing log {line}\n"
    parsed = parse_output(output, 0)
    assert parsed.error is None
    assert [c.status for c in parsed.checks] == ["pass", "skip"]
    assert (parsed.torch, parsed.gpu_count) == ("2.6.0+cu124", 8)


def test_parse_output_finds_a_report_split_by_lines_of_the_other_stream() -> None:
    # Docker copies stdout and stderr line by line, each on its own: a progress line (stderr)
    # can land between the report's lines (stdout).
    lines = json.dumps(document("pass", "skip"), indent=2).splitlines()
    progress = 'smoke_tests: done: {"name": "c1", "status": "skip"}'
    output = "\n".join(lines[:5] + [progress, "UserWarning: late"] + lines[5:]) + "\n"
    parsed = parse_output(output, 0)
    assert parsed.error is None
    assert [c.status for c in parsed.checks] == ["pass", "skip"]


def test_parse_output_takes_the_last_report() -> None:
    output = json.dumps(document("fail")) + "\n" + json.dumps(document("pass"), indent=2) + "\n"
    assert [c.status for c in parse_output(output, 0).checks] == ["pass"]


@pytest.mark.parametrize(("output", "exit_code", "timed_out", "phrase"), [
    ("/usr/bin/python3: No module named smoke_tests\n", 1, False, "has no smoke_tests package"),
    ("Traceback...\nModuleNotFoundError: No module named 'torch'\n", 1, False, "torch is not importable"),
    ("", 137, False, "exited with code 137 (killed (out of memory?))"),
    ("Segmentation fault (core dumped)", 139, False, "segmentation fault"),
    ("step 3 of a hung compile", None, True, "did not finish within 5s"),
    (json.dumps({"ok": True, "checks": [{"name": "x"}]}), 0, False, "malformed"),
    (json.dumps(document("pass")), 3, False, "exited with code 3 although no check failed"),
])
def test_parse_output_explains_a_run_without_a_verdict(output: str, exit_code: int | None, timed_out: bool,
                                                       phrase: str) -> None:
    parsed = parse_output(output, exit_code, timed_out=timed_out, timeout=5)
    assert parsed.error is not None and phrase in parsed.error


# --------------------------------------------------------------------------- report


def test_report_verdicts() -> None:
    passing = preflight(HostFacts(gpus=(H100,), nvidia_runtime=RUNTIME), allow_no_gpu=False).items
    results = tuple(Result.from_dict(c) for c in document("pass", "skip", "fail")["checks"])
    failed = VerifyReport("img:1", "docker", passing, checks=results)
    assert not failed.ok
    assert failed.failures == (("c2", "why 2"),)
    with pytest.raises(VerificationFailed, match=r"img:1 failed verification: c2: why 2") as info:
        failed.raise_if_failed()
    assert info.value.failures == (("c2", "why 2"),) and info.value.exit_code == 1
    assert VerifyReport("img:1", "docker", passing, checks=results[:2]).ok
    # No checks at all is no proof.
    assert VerifyReport("img:1", "docker", passing).failures == (("smoke tests", "no check ran"),)
    blocked = VerifyReport("img:1", "docker", preflight(HostFacts(), allow_no_gpu=False).items, error=NOT_RUN)
    assert [name for name, _ in blocked.failures] == ["gpu"]


def test_report_json_and_table() -> None:
    items = preflight(HostFacts(gpus=(H100,), nvidia_runtime=RUNTIME), allow_no_gpu=False).items
    results = tuple(Result.from_dict(c) for c in document("pass", "fail")["checks"])
    report = VerifyReport("img:1", "docker", items, checks=results, error=None, torch="2.6.0", gpu_count=8,
                          output_tail=("last line",))
    data = json.loads(json.dumps(report.to_json()))
    assert data["ok"] is False and data["target"] == "img:1"
    assert [p["name"] for p in data["preflight"]] == ["daemon", "image", "gpu", "runtime", "driver"]
    assert [c["status"] for c in data["checks"]] == ["pass", "fail"]
    text = report.format()
    assert "PREFLIGHT  STATUS  DETAIL" in text and "c1           FAIL" not in text
    assert "c1     FAIL    why 1" in text and "  | last line" in text
    assert text.endswith("FAILED: img:1 (0.0s)")


# --------------------------------------------------------------------------- verify_image, fake engine


@pytest.fixture
def cpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """For --local: this machine's nvidia-smi finds nothing."""
    monkeypatch.setattr("imagebuilder.verify.facts.host_gpus", lambda: ((), "nvidia-smi not found"))


def cpu_daemon() -> FakeEngine:
    """A daemon without the NVIDIA Container Toolkit, as docker 20.10 refuses `--gpus all`."""
    return FakeEngine(info_doc={"Runtimes": {"runc": {}}}, smi=GpuUnavailable(image="img:1", detail=NO_DEVICE_DRIVER))


@pytest.fixture(autouse=True)
def no_client_reads(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Image verification reads the daemon's host only: nvidia-smi on this client is an error
    (--local, which is about this machine, is the exception)."""
    if "local" in request.node.name:
        return

    def client_nvidia_smi() -> None:
        raise AssertionError("verify of an image ran nvidia-smi on the client")

    monkeypatch.setattr("imagebuilder.verify.facts.host_gpus", client_nvidia_smi)


def test_verify_image_runs_the_smoke_tests_with_every_gpu() -> None:
    engine = FakeEngine(labels={**BUILT_BY_IMAGEBUILDER, "io.imagebuilder.min-driver": "530.30.02",
                                "io.imagebuilder.cuda": "12.4.1"})
    report = verify_image(engine, "img:1", registry=OFFLINE, timeout=60)
    assert report.ok, report.format()
    probe, rdma, run = engine.runs
    assert probe["command"] == ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    assert rdma["command"][:2] == ["sh", "-c"] and rdma["gpus"] is False and run["access"] == NO_ACCESS
    assert probe["image"] == "img:1" and probe["gpus"] is True and probe["timeout"] == 30
    assert run["command"] == ["python3", "-m", "smoke_tests", "--json", "--require-gpu"]
    assert run["gpus"] is True and run["shm_size"] == "1g" and run["timeout"] == 60
    # Its own smoke tests: nothing lent, nothing said about it.
    assert run["volumes"] == {} and run["archives"] == {} and report.notices == ()
    gpu = {item.name: item for item in report.preflight}["gpu"]
    assert gpu.detail == "2 GPU(s): NVIDIA H100 80GB HBM3"


def test_verify_says_which_cuda_is_which_as_the_image_is_labelled() -> None:
    """The wheels' CUDA runtime and a devel image's nvcc toolkit (build.cuda_labels), in the
    image's line of the preflight, which the report prints and --json keeps."""
    devel = FakeEngine(labels={**BUILT_BY_IMAGEBUILDER, "io.imagebuilder.cuda": "12.1.1",
                               "io.imagebuilder.cuda.runtime": "12.4.127", "io.imagebuilder.cuda.toolkit": "12.4.1"})
    report = verify_image(devel, "img:1", registry=OFFLINE)
    image = {item.name: item for item in report.preflight}["image"]
    assert image.detail == "present locally; CUDA runtime 12.4.127, CUDA toolkit (nvcc) 12.4.1"
    assert "CUDA runtime 12.4.127, CUDA toolkit (nvcc) 12.4.1" in report.format()
    runtime = FakeEngine(labels={**BUILT_BY_IMAGEBUILDER, "io.imagebuilder.cuda.runtime": "13.0.96"})
    image = {item.name: item for item in verify_image(runtime, "img:1", registry=OFFLINE).preflight}["image"]
    assert image.detail == "present locally; CUDA runtime 13.0.96"
    # An image built before the labels (or not by imagebuilder) says nothing it does not know.
    older = {item.name: item for item in verify_image(FakeEngine(), "img:1", registry=OFFLINE).preflight}["image"]
    assert older.detail == "present locally"


def test_gpus_and_runtime_come_from_the_daemons_host(tmp_path: Path) -> None:
    """A CDI spec on this client says nothing about the daemon's host (DOCKER_HOST=ssh://...)."""
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    engine = FakeEngine(info_doc={"Runtimes": {"runc": {}}, "CDISpecDirs": [str(tmp_path)]})
    report = verify_image(engine, "img:1", registry=OFFLINE)
    items = {item.name: item for item in report.preflight}
    assert items["runtime"].detail == "the daemon accepted a GPU device request"
    assert str(tmp_path) not in report.format()


def test_a_daemon_without_gpu_support_is_a_host_without_gpus() -> None:
    engine = cpu_daemon()
    refused = verify_image(engine, "img:1", registry=OFFLINE)
    assert [name for name, _ in refused.failures] == ["gpu"]
    assert "the Docker daemon's host" in refused.failures[0][1] and NO_DEVICE_DRIVER in refused.failures[0][1]
    allowed = verify_image(cpu_daemon(), "img:1", registry=OFFLINE, allow_no_gpu=True)
    assert allowed.ok and not allowed.require_gpu
    statuses = {item.name: item.status for item in allowed.preflight}
    assert statuses == {"daemon": "pass", "image": "pass", "gpu": "skip", "runtime": "skip", "driver": "skip"}


def unpacked(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()  # type: ignore[union-attr]
                if member.isfile()}


def test_a_foreign_image_is_lent_the_smoke_tests_and_judged_by_its_own_torch() -> None:
    """pytorch/pytorch, or a venv with `pip install torch`: no labels, no smoke_tests, no manifest."""
    engine = cpu_daemon()
    engine.labels = {"maintainer": "someone"}
    report = verify_image(engine, "pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime", registry=OFFLINE, allow_no_gpu=True)
    assert report.ok, report.format()
    assert [run["command"][0] for run in engine.runs] == ["nvidia-smi", "python3", "python3"]
    run = engine.smoke_run
    assert run["command"] == ["python3", "-m", "smoke_tests", "--json", "--manifest", LENT_MANIFEST, "--allow-no-gpu"]
    # Copied in through the API, not bind-mounted: a remote daemon has no such host path.
    assert run["volumes"] == {} and list(run["archives"]) == ["/"]
    files = unpacked(run["archives"]["/"])
    assert files["opt/imagebuilder/host/smoke_tests/__main__.py"].startswith(b'"""python -m smoke_tests')
    assert "opt/imagebuilder/host/smoke_tests/checks/devel.py" in files
    assert not any("__pycache__" in name for name in files)
    assert json.loads(files[LENT_MANIFEST.lstrip("/")]) == {"torch": "2.6.0+cu124", "torch_cuda": "12.4",
                                                            "python": "3.11.2"}
    assert run["environment"]["PYTHONPATH"] == "/opt/imagebuilder/host"
    (notice,) = report.notices
    assert notice == ("notice: pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime: it carries no imagebuilder labels, so "
                      "it is verified with this imagebuilder's smoke tests, copied into the container; expecting "
                      "what its own torch reports: torch 2.6.0+cu124 (CUDA 12.4)")
    assert report.to_json()["notices"] == [notice]


def test_a_foreign_image_without_torch_is_still_judged() -> None:
    engine = cpu_daemon()
    engine.labels = {}
    engine.probe = RunResult(0, PROBE_PREFIX + json.dumps({"python": "3.11.2", "error": "no torch"}), False, 1.0)
    report = verify_image(engine, "python:3.11", registry=OFFLINE, allow_no_gpu=True)
    run = engine.smoke_run
    assert "--manifest" not in run["command"] and LENT_MANIFEST.lstrip("/") not in unpacked(run["archives"]["/"])
    assert report.notices[0].endswith("its torch could not be read, so there are no expectations")


def test_mount_smoke_tests_lends_them_to_an_imagebuilder_image_too() -> None:
    """The explicit way, kept: for an image whose own copy is older. Its manifest still counts."""
    engine = cpu_daemon()
    report = verify_image(engine, "img:1", registry=OFFLINE, allow_no_gpu=True, mount_smoke_tests=True)
    assert report.ok and not report.require_gpu
    assert [run["command"][0] for run in engine.runs] == ["nvidia-smi", "python3"]  # no torch probe
    run = engine.smoke_run
    assert "--require-gpu" not in run["command"] and "--manifest" not in run["command"] and run["gpus"] is False
    assert run["command"][-1] == "--allow-no-gpu"  # a CUDA image's smoke tests require a GPU otherwise
    assert "opt/imagebuilder/host/smoke_tests/__main__.py" in unpacked(run["archives"]["/"])
    assert run["environment"]["PYTHONPATH"] == "/opt/imagebuilder/host"
    assert "--mount-smoke-tests" in report.notices[0] and "/opt/imagebuilder/manifest.json" in report.notices[0]


def test_verify_image_reads_the_compat_floor_label() -> None:
    """A cu128 image on a 550 driver: the min-driver label alone would refuse it."""
    engine = FakeEngine(labels={**BUILT_BY_IMAGEBUILDER, "io.imagebuilder.min-driver": "570.124.06",
                                "io.imagebuilder.min-driver-compat": "525.60.13", "io.imagebuilder.cuda": "12.8.1"})
    report = verify_image(engine, "img:1", registry=OFFLINE)
    assert report.ok, report.format()
    (driver,) = [item for item in report.preflight if item.name == "driver"]
    assert "through minor-version compatibility (>= 525.60.13)" in driver.detail


def test_verify_image_stops_at_a_failed_preflight() -> None:
    engine = FakeEngine(labels={**BUILT_BY_IMAGEBUILDER, "io.imagebuilder.min-driver": "999.0"})
    report = verify_image(engine, "img:1", registry=OFFLINE)
    assert not report.ok and report.error == NOT_RUN
    assert [run["command"][0] for run in engine.runs] == ["nvidia-smi", "sh"]  # the facts: GPUs, RDMA devices
    assert [name for name, _ in report.failures] == ["driver"]


def test_verify_image_names_an_image_it_cannot_pull() -> None:
    engine = FakeEngine(present=False)
    report = verify_image(engine, "registry.example/ml/pytorch:nope", registry=OFFLINE)
    assert engine.pulled == ["registry.example/ml/pytorch:nope"] and engine.runs == []
    ((name, reason),) = report.failures
    assert name == "image" and "registry.example/ml/pytorch:nope" in reason and "manifest unknown" in reason


def test_an_image_of_this_engine_alone_is_verified_without_a_registry() -> None:
    """registry None (project's candidate image): nothing is asked of one, not even for a name
    with a registry host (a registry reader here would raise: OFFLINE's every method does)."""
    engine = cpu_daemon()
    report = verify_image(engine, "registry.example/ml/project:1", registry=None, allow_no_gpu=True)
    assert report.ok and report.built_from is None
    assert engine.pulled == []


def test_verify_image_rejected_device_request_is_a_runtime_problem() -> None:
    engine = FakeEngine(run_error=GpuUnavailable(image="img:1", detail=NO_DEVICE_DRIVER))
    report = verify_image(engine, "img:1", registry=OFFLINE)
    assert [name for name, _ in report.failures] == ["runtime"]
    assert "could not select device driver" in report.failures[0][1]


def test_verify_image_container_that_cannot_start() -> None:
    engine = FakeEngine(run_error=ContainerFailed(image="img:1", detail='exec: "python3": executable file not found in $PATH'))
    report = verify_image(engine, "img:1", registry=OFFLINE)
    assert report.failures == (("smoke tests", 'could not run a container from img:1: exec: "python3": '
                                               "executable file not found in $PATH"),)


def test_verify_image_timeout_keeps_the_output_tail() -> None:
    engine = FakeEngine(result=RunResult(137, "compiling...\n" * 100, True, 30.0))
    report = verify_image(engine, "img:1", registry=OFFLINE, timeout=30)
    assert report.failures == (("smoke tests", "the smoke tests did not finish within 30s and were killed; "
                                               "raise --timeout or look at the output below"),)
    assert len(report.output_tail) == 40 and report.output_tail[-1] == "compiling..."


# --------------------------------------------------------------------------- local processes


def fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    script.chmod(0o755)
    return str(script)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of an exited parent may linger as a zombie until init reaps it.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" not in status.read_text()


def wait_dead(pid: int, within: float = 5) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_local_timeout_kills_the_whole_process_group(tmp_path: Path, cpu_host: None) -> None:
    python = fake_python(tmp_path, f"""\
        sleep 300 &
        echo $! > {tmp_path}/child
        echo "compiling a kernel"
        sleep 300
        """)
    started = time.monotonic()
    report = verify_local(allow_no_gpu=True, timeout=2, python=python)
    assert time.monotonic() - started < 15
    assert report.error is not None and "did not finish within 2s" in report.error
    assert report.output_tail == ("compiling a kernel",)
    assert wait_dead(int((tmp_path / "child").read_text()))


def test_local_ctrl_c_kills_the_process_group(tmp_path: Path) -> None:
    python = fake_python(tmp_path, f"""\
        sleep 300 &
        echo $! > {tmp_path}/child
        sleep 300
        """)
    # A real SIGINT, as a terminal's Ctrl-C sends: it wakes the blocked wait.
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_process([python], timeout=60)
    finally:
        timer.cancel()
    assert wait_dead(int((tmp_path / "child").read_text()))


def test_local_fake_report_passes(tmp_path: Path, cpu_host: None) -> None:
    (tmp_path / "report.json").write_text(json.dumps(document("pass", "skip"), indent=2))
    python = fake_python(tmp_path, f"""\
        echo "$@" > {tmp_path}/args
        echo "a warning" >&2
        cat {tmp_path}/report.json
        """)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"torch": "2.6.0", "min_driver": "530.30.02"}))
    report = verify_local(allow_no_gpu=True, python=python, manifest=str(manifest))
    assert report.ok and report.mode == "local"
    assert (tmp_path / "args").read_text().split() == ["-m", "smoke_tests", "--json", "--manifest", str(manifest),
                                                       "--allow-no-gpu"]


# --------------------------------------------------------------------------- CLI --local, for real


@pytest.fixture(scope="module")
def local_runs() -> dict[str, tuple[int, str, str]]:
    """`verify --local --allow-no-gpu` as a table (a minute or two on a CPU host: a real gloo
    all-reduce and a real Inductor compile). Its argv is docs/verify.md's: conftest runs each
    argv once per session, so the documented command's run is this one."""
    return {"table": host_verify("--local", "--allow-no-gpu")}


@pytest.mark.slow
def test_cli_local_cpu_mode_passes(local_runs: dict[str, tuple[int, str, str]]) -> None:
    code, stdout, stderr = local_runs["table"]
    assert code == 0, stdout + stderr
    assert "gpu        SKIP    no NVIDIA GPU visible" in stdout or HOST_HAS_GPU
    assert "environment  PASS" in stdout and "compile      PASS" in stdout
    assert stdout.rstrip().splitlines()[-1].startswith("OK: local ")


@pytest.mark.slow
def test_cli_local_json_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify --local --allow-no-gpu --json`: this host's preflight for real, and the smoke suite's
    verdict on this host's torch read from the session's one run of it (support.host_runs, which
    test_smoke_tests' CLI tests read too) instead of a third run; the table's run above is the
    real subprocess path. The command verify would have run is the one asserted."""
    from click.testing import CliRunner
    from support.host_runs import host_smoke_run

    from imagebuilder.cli import cli
    from imagebuilder.verify import run as verify_run

    smoke = host_smoke_run()
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr[-3000:]
    asked: list[list[str]] = []

    def replayed(command: Sequence[str], **_: Any) -> tuple[str, int | None, bool]:
        asked.append(list(command))
        return smoke.stdout + smoke.stderr, smoke.returncode, False

    monkeypatch.setattr(verify_run, "run_process", replayed)
    result = CliRunner().invoke(cli, ["verify", "--local", "--allow-no-gpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["mode"] == "local" and data["error"] is None
    assert [c["name"] for c in data["checks"]] == ["environment", "cuda", "nccl", "cache", "compile", "cuda_graph"]
    assert data["torch"].startswith("2.")
    assert asked == [[sys.executable, "-m", "smoke_tests", "--json", "--require-gpu" if HOST_HAS_GPU else "--allow-no-gpu"]]


@pytest.mark.skipif(HOST_HAS_GPU, reason="this host has GPUs")
def test_cli_local_without_gpu_fails_saying_so() -> None:
    from click.testing import CliRunner

    from imagebuilder.cli import cli

    result = CliRunner().invoke(cli, ["verify", "--local"])
    assert result.exit_code == 1, result.output
    assert "gpu        FAIL    no NVIDIA GPU visible on this host" in result.stdout
    assert "--allow-no-gpu" in result.stderr and result.stderr.startswith("error: local ")
    assert "Traceback" not in result.output


def test_cli_usage_errors() -> None:
    from click.testing import CliRunner

    from imagebuilder.cli import cli

    runner = CliRunner()
    assert runner.invoke(cli, ["verify"]).exit_code == 2
    assert "or --local" in runner.invoke(cli, ["verify"]).stderr
    manifest = str(REPO / "pyproject.toml")
    assert runner.invoke(cli, ["verify", "img:1", "--manifest", manifest]).exit_code == 2


# --------------------------------------------------------------------------- Docker, for real

docker = pytest.mark.docker


def containers_from(engine: DockerEngine, ref: str) -> list[str]:
    import docker as sdk

    client = sdk.DockerClient(base_url=engine.base_url)
    try:
        return [str(c.id) for c in client.containers.list(all=True, filters={"ancestor": ref})]
    finally:
        client.close()


def build(engine: DockerEngine, tmp_path: Path, ref: str, dockerfile: str,
          files: Mapping[str, str] | None = None) -> str:
    context = tmp_path / ref.replace("/", "_").replace(":", "_")
    context.mkdir()
    (context / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    for name, text in (files or {}).items():
        (context / name).write_text(textwrap.dedent(text))
        (context / name).chmod(0o755)
    ClassicBuilder(engine).build(BuildRequest(context=context, tags=(ref,), timeout=600))
    return ref


@pytest.fixture(scope="module")
def python_image(docker_engine: DockerEngine, base_image: str,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base image plus Debian's python3: a Python without torch and without smoke_tests."""
    ref = "imagebuilder-test/verify-python3:latest"
    build(docker_engine, tmp_path_factory.mktemp("py3"), ref, f"""\
        FROM {base_image}
        RUN apt-get update && apt-get install -y --no-install-recommends python3 \\
            && rm -rf /var/lib/apt/lists/*
        """)
    yield ref
    docker_engine.remove_image(ref)


@docker
def test_docker_lends_the_smoke_tests_to_an_image_without_them(docker_engine: DockerEngine,
                                                               python_image: str) -> None:
    """No --mount-smoke-tests: the smoke tests are copied in through the API and run, and say
    what they find (here: no torch). The GPU probe ran in the image and was refused by this
    daemon; every container is gone."""
    report = verify_image(docker_engine, python_image, registry=HttpRegistry(), allow_no_gpu=True, timeout=120)
    assert [name for name, _ in report.failures] == ["smoke tests"]
    # The probe of the image's own torch finds none: said before any smoke test is lent (exit 2).
    assert "not a PyTorch image: its python3 cannot import torch" in (report.error or "")
    assert report.bad_request
    gpu = {item.name: item for item in report.preflight}["gpu"]
    assert (gpu.status == "skip" and "could not select device driver" in gpu.detail) or HOST_HAS_GPU
    assert containers_from(docker_engine, python_image) == []


@docker
def test_docker_mount_smoke_tests_still_works(docker_engine: DockerEngine, python_image: str) -> None:
    report = verify_image(docker_engine, python_image, registry=HttpRegistry(), allow_no_gpu=True, timeout=120, mount_smoke_tests=True)
    # Without torch there is nothing to lend the smoke tests to: the image's own probe says so first.
    assert report.error is not None and "not a PyTorch image: its python3 cannot import torch" in report.error
    assert report.bad_request
    assert containers_from(docker_engine, python_image) == []


@docker
def test_docker_archives_reach_the_container_as_a_non_root_user(docker_engine: DockerEngine, base_image: str,
                                                                image_repo: str, tmp_path: Path) -> None:
    """The lent package is readable by the image's user and lands where PYTHONPATH points,
    without touching the image's own directories."""
    from imagebuilder.verify.lend import smoke_tests_archive

    ref = build(docker_engine, tmp_path, f"{image_repo}:user", f"""\
        FROM {base_image}
        RUN mkdir -m 0700 /opt/private
        USER 4242
        """)
    run = docker_engine.run(ref, ["sh", "-c", "stat -c %a /opt/private && head -n 1 /opt/imagebuilder/host/"
                                              "smoke_tests/__main__.py && cat /opt/imagebuilder/host/manifest.json"],
                            timeout=60, archives={"/": smoke_tests_archive({"torch": "2.6.0"})})
    assert run.exit_code == 0, run.output
    lines = run.output.splitlines()
    assert lines[0] == "700" and lines[1].startswith('"""python -m smoke_tests')
    assert json.loads("\n".join(lines[2:])) == {"torch": "2.6.0"}
    assert containers_from(docker_engine, ref) == []


@docker
def test_docker_timeout_kills_and_removes_the_container(docker_engine: DockerEngine, base_image: str,
                                                         image_repo: str, tmp_path: Path) -> None:
    ref = build(docker_engine, tmp_path, f"{image_repo}:sleeper", f"""\
        FROM {base_image}
        COPY python3 /usr/local/bin/python3
        """, {"python3": "#!/bin/sh\necho 'warming up'\nexec sleep 600\n"})
    started = time.monotonic()
    report = verify_image(docker_engine, ref, registry=HttpRegistry(), allow_no_gpu=True, timeout=5)
    assert time.monotonic() - started < 60
    assert report.error == "the smoke tests did not finish within 5s and were killed; raise --timeout or " \
                           "look at the output below"
    assert report.output_tail == ("warming up",)
    assert containers_from(docker_engine, ref) == []


@docker
def test_docker_cli_passes_on_a_passing_report(docker_engine: DockerEngine, base_image: str, image_repo: str,
                                               tmp_path: Path) -> None:
    """The whole CLI path through a real container: the report is read out of its output."""
    from click.testing import CliRunner

    from imagebuilder.cli import cli

    ref = build(docker_engine, tmp_path, f"{image_repo}:reporter", f"""\
        FROM {base_image}
        COPY python3 /usr/local/bin/python3
        """, {"python3": "#!/bin/sh\necho \"args: $*\" >&2\necho '" + json.dumps(document("pass", "skip"))
              + "'\n"})
    result = CliRunner().invoke(cli, ["verify", ref, "--allow-no-gpu", "--json", "--timeout", "60"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and [c["status"] for c in data["checks"]] == ["pass", "skip"]
    assert containers_from(docker_engine, ref) == []


# --------------------------------------------------------------------------- a remote daemon over SSH
# The docs' remote example, `DOCKER_HOST=ssh://gpu-box imagebuilder verify TAG`, against this
# machine's daemon behind our own sshd on 127.0.0.1 (conftest's ssh_docker_host).


@docker
def test_verify_over_ssh_runs_the_smoke_tests_on_the_far_daemon(docker_engine: DockerEngine, base_image: str,
                                                               image_repo: str, tmp_path: Path,
                                                               ssh_docker_host: Any) -> None:
    ref = build(docker_engine, tmp_path, f"{image_repo}:remote", f"""\
        FROM {base_image}
        COPY python3 /usr/local/bin/python3
        """, {"python3": "#!/bin/sh\necho '" + json.dumps(document("pass", "pass")) + "'\n"})
    logins = ssh_docker_host.logins()
    done = subprocess.run([sys.executable, "-m", "imagebuilder", "verify", ref, "--allow-no-gpu", "--json",
                           "--timeout", "120"], capture_output=True, text=True, timeout=600,
                          env=ssh_docker_host.env())
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is True and [c["status"] for c in data["checks"]] == ["pass", "pass"]
    assert ssh_docker_host.logins() > logins  # it went through our sshd, not the local socket
    assert containers_from(docker_engine, ref) == []


@docker
def test_the_smoke_tests_deadline_holds_over_ssh(docker_engine: DockerEngine, base_image: str, image_repo: str,
                                                 tmp_path: Path, ssh_docker_host: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A container that never finishes is killed at --timeout over ssh too: docker-py's own ssh
    transport (paramiko) honours the read timeout that ends the wait; its shell-out mode would
    wait for the container."""
    from imagebuilder.engine.docker import DockerEngine as Engine

    ref = build(docker_engine, tmp_path, f"{image_repo}:remote-sleeper", f"""\
        FROM {base_image}
        COPY python3 /usr/local/bin/python3
        """, {"python3": "#!/bin/sh\necho 'warming up'\nexec sleep 600\n"})
    for key, value in ssh_docker_host.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    started = time.monotonic()
    report = verify_image(Engine(), ref, registry=HttpRegistry(), allow_no_gpu=True, timeout=5)
    assert time.monotonic() - started < 60
    assert report.error is not None and "did not finish within 5s" in report.error
    assert report.output_tail == ("warming up",)
    assert containers_from(docker_engine, ref) == []


@docker
@pytest.mark.parametrize("case", ["nothing listens", "unknown host key", "key not authorized"])
def test_an_unreachable_ssh_daemon_says_what_to_check_over_ssh(ssh_docker_host: Any, free_port: int,
                                                               tmp_path: Path, case: str) -> None:
    url = ssh_docker_host.url if case != "nothing listens" else f"ssh://{ssh_docker_host.user}@127.0.0.1:{free_port}"
    home = ssh_docker_host.home
    if case != "nothing listens":
        home = tmp_path / "home"
        (home / ".ssh").mkdir(parents=True)
        if case == "key not authorized":
            shutil.copy(ssh_docker_host.home / ".ssh" / "known_hosts", home / ".ssh" / "known_hosts")
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")],
                           check=True, timeout=60)
    done = subprocess.run([sys.executable, "-m", "imagebuilder", "verify", "pytorch:any", "--allow-no-gpu"],
                          capture_output=True, text=True, timeout=120,
                          env=ssh_docker_host.env(HOME=str(home), DOCKER_HOST=url))
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "Traceback" not in said and "dockerd" not in said and "systemctl" not in said
    port = url.rpartition(":")[2]
    assert f"`ssh -p {port} {ssh_docker_host.user}@127.0.0.1 docker version`" in said, said
    reason = {"nothing listens": "Unable to connect", "unknown host key": "not found in known_hosts",
              "key not authorized": "Authentication failed"}[case]
    assert reason in said, said


# --------------------------------------------------------------------------- live output (issue 29, item 3)


PROGRESS = [Result("c0", "pass", "why 0", {"seconds": 0.1}), Result("c1", "skip", "why 1", {"seconds": 0.1})]


def test_verify_shows_its_head_at_once_and_a_line_per_check_as_it_ends() -> None:
    from imagebuilder.verify.report import CHECK_WIDTH, Live
    from smoke_tests.report import check_line, progress_line

    shown: list[str] = []
    before_run: list[str] = []

    @dataclass
    class Watching(FakeEngine):
        def run(self, image: str, command: Sequence[str] | str, **kwargs: Any) -> RunResult:
            if "smoke_tests" in command:
                before_run.extend(shown)
            return super().run(image, command, **kwargs)

    output = "".join(progress_line(r) + "\n" for r in PROGRESS) + json.dumps(document("pass", "skip"))
    live = Live(shown.append)
    report = verify_image(Watching(result=RunResult(0, output, False, 1.0)), "img:1", registry=OFFLINE, timeout=60, live=live)
    assert before_run[0].startswith("verify img:1 (docker") and any(line.startswith("PREFLIGHT") for line in before_run)
    assert not any(line.startswith("c0") for line in before_run), "a check line before the smoke tests ran"
    assert [line for line in shown if line.startswith("c")] == [check_line(r, CHECK_WIDTH) for r in PROGRESS]
    rest = report.format(live)
    assert "PREFLIGHT" not in rest and "c0" not in rest, "printed twice"
    assert rest.splitlines()[-2:] == ["checks: 1 passed, 1 skipped", rest.splitlines()[-1]]
    assert sum(line.startswith("OK") for line in rest.splitlines()) == 1


def test_an_image_whose_smoke_tests_print_no_progress_gets_its_table_at_the_end() -> None:
    from imagebuilder.verify.report import Live

    shown: list[str] = []
    live = Live(shown.append)
    report = verify_image(FakeEngine(), "img:1", registry=OFFLINE, timeout=60, live=live)
    rest = report.format(live)
    assert any(line.startswith("PREFLIGHT") for line in shown) and "PREFLIGHT" not in rest
    assert "CHECK" in rest and "checks: 1 passed" in rest
    assert sum(line.startswith("OK") for line in rest.splitlines()) == 1


def test_local_shows_each_check_while_the_smoke_tests_still_run(tmp_path: Path, cpu_host: None) -> None:
    """The fake smoke tests wait (up to 20 s) for the line verify shows of their first check."""
    from imagebuilder.verify.report import Live
    from smoke_tests.report import progress_line

    seen = tmp_path / "seen"
    (tmp_path / "report.json").write_text(json.dumps(document("pass", "skip")))
    python = fake_python(tmp_path, f"""\
        echo '{progress_line(PROGRESS[0])}' >&2
        for _ in $(seq 200); do [ -e {seen} ] && break; sleep 0.1; done
        cat {tmp_path}/report.json
        """)

    def echo(line: str) -> None:
        if line.startswith("c0"):
            seen.touch()

    started = time.monotonic()
    report = verify_local(allow_no_gpu=True, python=python, live=Live(echo))
    assert report.ok and time.monotonic() - started < 10, "the check's line came only after the smoke tests ended"


def test_the_smoke_tests_print_a_progress_line_per_check_with_json() -> None:
    from smoke_tests.report import read_progress

    done = subprocess.run([sys.executable, "-m", "smoke_tests", "--json", "--checks", "environment", "--allow-no-gpu"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    progress = [r for r in map(read_progress, done.stderr.splitlines()) if r is not None]
    assert [r.name for r in progress] == ["environment"], done.stderr


def test_live_check_lines_line_up_with_every_check_name() -> None:
    from imagebuilder.verify.report import CHECK_WIDTH
    from smoke_tests.checks import CHECK_NAMES

    assert CHECK_WIDTH == max(len(name) for name in CHECK_NAMES)


@docker
def test_docker_gives_the_container_what_host_access_says(docker_engine: DockerEngine, base_image: str) -> None:
    """What verify gives the smoke tests on an RDMA host: a device (here /dev/kmsg, present on any
    Linux host and not given by default), a memlock limit and CAP_IPC_LOCK (bit 14). The limit is
    a lowered one: a daemon without the privilege (rootless, or in a container, as CI's) refuses
    to raise it to unlimited."""
    access = HostAccess(("/dev/kmsg",), (("memlock", 65536),), ("IPC_LOCK",))
    script = "ulimit -l; grep CapEff /proc/self/status; test -c /dev/kmsg && echo device-given"
    given = docker_engine.run(base_image, ["sh", "-c", script], timeout=60, access=access)
    default = docker_engine.run(base_image, ["sh", "-c", script], timeout=60)
    assert given.exit_code == 0, given.output
    limit, capabilities, device = given.output.split("\n")[:3]
    assert limit == "64" and int(capabilities.split()[1], 16) & 1 << 14 and device == "device-given"
    assert default.output.split("\n")[0] != "64" and "device-given" not in default.output
    assert not int(default.output.split("\n")[1].split()[1], 16) & 1 << 14
