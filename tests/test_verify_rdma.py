"""verify and RDMA: the host's devices as a container sees them, what verify gives the smoke tests,
and the warnings, as tables over recorded facts; then verify_image over a fake daemon."""

from __future__ import annotations

import json

import pytest
from support.fake_daemon import BUILT_BY_IMAGEBUILDER, OFFLINE, FakeEngine

from imagebuilder.engine.api import NO_ACCESS, HostAccess, RunResult
from imagebuilder.verify.preflight import Gpu, HostFacts, preflight
from imagebuilder.verify.report import VerifyReport
from imagebuilder.verify.run import verify_image
from imagebuilder.verify.rdma import RDMA_ACCESS, RdmaFacts, access_for, rdma_warnings, read_rdma_probe
from smoke_tests.nccl_log import Transport
from smoke_tests.result import Result

FLAGS = "--device /dev/infiniband --ulimit memlock=-1 --cap-add IPC_LOCK"


def probe_output(*paths: str) -> str:
    return "".join(f"rdma-probe {path}\n" for path in (*paths, "end"))


PROBES: list[tuple[str, RunResult, RdmaFacts]] = [
    # id, what the probe container printed, the facts read from it
    ("infiniband-host", RunResult(0, probe_output("/sys/class/infiniband/mlx5_0", "/sys/class/infiniband/mlx5_1",
                                                  "/sys/class/infiniband_verbs/uverbs0",
                                                  "/sys/class/infiniband_verbs/uverbs1"), False, 0.2),
     RdmaFacts(("mlx5_0", "mlx5_1"), ("uverbs0", "uverbs1"))),
    ("efa-host", RunResult(0, probe_output("/sys/class/infiniband/efa_0", "/sys/class/infiniband_verbs/uverbs0"),
                           False, 0.2), RdmaFacts(("efa_0",), ("uverbs0",))),
    ("no-ib_uverbs", RunResult(0, probe_output("/sys/class/infiniband/mlx5_0"), False, 0.2), RdmaFacts(("mlx5_0",))),
    ("no-rdma", RunResult(0, probe_output(), False, 0.2), RdmaFacts()),
    # An entrypoint's own words around the marked lines change nothing.
    ("entrypoint-noise", RunResult(0, "WARNING: /dev/shm is 64 MiB\n" + probe_output("/sys/class/infiniband/mlx5_0"),
                                   False, 0.2), RdmaFacts(("mlx5_0",))),
    ("no-shell", RunResult(127, 'exec: "sh": executable file not found in $PATH', False, 0.1),
     RdmaFacts(error='listing /sys/class/infiniband in the image failed (exec: "sh": executable file not found '
                     'in $PATH)')),
]


@pytest.mark.parametrize("outcome,facts", [p[1:] for p in PROBES], ids=[p[0] for p in PROBES])
def test_rdma_probe_is_read(outcome: RunResult, facts: RdmaFacts) -> None:
    assert read_rdma_probe(outcome) == facts


@pytest.mark.parametrize("facts,given", [
    (RdmaFacts(("mlx5_0",), ("uverbs0",)), RDMA_ACCESS),
    (RdmaFacts(("mlx5_0",)), NO_ACCESS),  # the daemon refuses --device of a missing /dev/infiniband
    (RdmaFacts(), NO_ACCESS),
    (RdmaFacts(error="no sh"), NO_ACCESS),
])
def test_verify_gives_the_devices_only_when_there_are_some_to_give(facts: RdmaFacts, given: HostAccess) -> None:
    assert access_for(facts) == given


def test_rdma_access_is_the_three_flags() -> None:
    assert RDMA_ACCESS.flags() == FLAGS
    assert HostAccess(("/dev/infiniband",)).lacks(RDMA_ACCESS).flags() == "--ulimit memlock=-1 --cap-add IPC_LOCK"


MLX5 = ("mlx5_0",)
SOCKET = Transport("Socket", ("eth0",), None, ("P2P/IPC",))
IB = Transport("IB", ("mlx5_0:1/IB",), None, ("P2P/IPC",))

JUDGED: list[tuple[str, RdmaFacts | None, Transport | None, str | None, list[str], list[str]]] = [
    # id, facts, NCCL's transport, the rdma item's status (None: no item), phrases of the one
    # warning (none: no warning), phrases no warning may contain
    ("no-gpu-not-read", None, None, None, [], []),
    ("no-rdma", RdmaFacts(), SOCKET, "skip", [], []),
    ("probe-failed", RdmaFacts(error="no sh"), SOCKET, "skip", [], []),
    ("given-and-ib", RdmaFacts(MLX5, ("uverbs0",), given=RDMA_ACCESS), IB, "pass", [], []),
    ("given-nccl-did-not-run", RdmaFacts(MLX5, ("uverbs0",), given=RDMA_ACCESS), None, "pass", [], []),
    ("given-but-socket", RdmaFacts(MLX5, ("uverbs0",), given=RDMA_ACCESS), SOCKET, "pass",
     ["NCCL chose Socket (eth0)", "although the container was given the host's RDMA devices (mlx5_0)",
      "libibverbs.so.1"], []),
    ("given-efa-libfabric", RdmaFacts(("efa_0",), ("uverbs0",), given=RDMA_ACCESS),
     Transport("Libfabric", (), "efa"), "pass", [], []),
    ("given-ofi-over-tcp", RdmaFacts(("efa_0",), ("uverbs0",), given=RDMA_ACCESS),
     Transport("AWS Libfabric", (), "tcp"), "pass", ["NCCL chose AWS Libfabric (provider tcp)"], []),
    # A host with mlx5_0 whose container lacks /dev/infiniband: the three flags, and no word of
    # what NCCL chose when it did not run.
    ("not-given-nccl-did-not-run", RdmaFacts(MLX5, ("uverbs0",)), None, "skip",
     ["RDMA devices (mlx5_0) the container was not given", f"add `{FLAGS}`",
      "falls back to TCP sockets between nodes"], ["NCCL chose"]),
    ("not-given-socket", RdmaFacts(MLX5, ("uverbs0",)), SOCKET, "skip",
     ["the container was not given: NCCL chose Socket (eth0)", f"add `{FLAGS}`"], []),
    ("given-only-the-device", RdmaFacts(MLX5, ("uverbs0",), given=HostAccess(("/dev/infiniband",))), None, "skip",
     ["add `--ulimit memlock=-1 --cap-add IPC_LOCK`", f"needs `{FLAGS}`"], ["NCCL chose"]),
    ("no-ib_uverbs", RdmaFacts(MLX5), None, "skip", ["modprobe ib_uverbs", f"needs `{FLAGS}`"], ["NCCL chose"]),
    ("daemon-refused", RdmaFacts(MLX5, ("uverbs0",), refused="error setting rlimit type 8: operation not permitted"),
     SOCKET, "skip", [f"the daemon refused `{FLAGS}` (error setting rlimit type 8", "NCCL chose Socket (eth0)"], []),
]


@pytest.mark.parametrize("facts,transport,status,said,unsaid", [j[1:] for j in JUDGED], ids=[j[0] for j in JUDGED])
def test_rdma_is_judged(facts: RdmaFacts | None, transport: Transport | None, status: str | None,
                        said: list[str], unsaid: list[str]) -> None:
    host = HostFacts(gpus=(Gpu("NVIDIA H100 80GB HBM3", "550.54.15"),), nvidia_runtime="nvidia", rdma=facts)
    items = {item.name: item for item in preflight(host, allow_no_gpu=False).items}
    assert (items["rdma"].status if "rdma" in items else None) == status
    assert not ("rdma" in items and items["rdma"].failed)  # never fails the image
    warnings = rdma_warnings(facts, transport)
    assert len(warnings) == (1 if said else 0), warnings
    for phrase in said:
        assert phrase in warnings[0]
    for phrase in unsaid:
        assert all(phrase not in warning for warning in warnings)


# --------------------------------------------------------------------------- verify_image

IB_HOST = RunResult(0, probe_output("/sys/class/infiniband/mlx5_0", "/sys/class/infiniband_verbs/uverbs0"), False, 0.2)


def smoke_report(transport: Transport | None) -> RunResult:
    measurements = {"backend": "nccl", **({"transport": transport.to_dict()} if transport else {})}
    checks = [Result("nccl", "pass", "64 MiB all-reduce over nccl x2 exact", measurements).to_dict()]
    return RunResult(0, json.dumps({"ok": True, "torch": "2.6.0+cu124", "gpu_count": 2, "checks": checks}), False, 9.0)


def test_verify_gives_an_rdma_host_s_devices_and_reports_nccl_s_transport() -> None:
    engine = FakeEngine(labels=BUILT_BY_IMAGEBUILDER, rdma=IB_HOST, result=smoke_report(IB))
    report = verify_image(engine, "img:1", registry=OFFLINE, timeout=60)
    assert report.ok, report.format()
    assert engine.smoke_run["access"] == RDMA_ACCESS
    text = report.format()
    assert "nccl transport: IB (mlx5_0:1/IB); ranks connected via P2P/IPC" in text.splitlines()
    rdma = {item.name: item for item in report.preflight}["rdma"]
    assert (rdma.status, rdma.detail) == ("pass", f"mlx5_0; the smoke tests get `{FLAGS}`")
    assert "warning" not in text
    assert report.to_json()["nccl_transport"]["network"] == "IB" and report.to_json()["warnings"] == []


def test_verify_warns_when_nccl_chose_sockets_on_an_rdma_host() -> None:
    engine = FakeEngine(labels=BUILT_BY_IMAGEBUILDER, rdma=IB_HOST, result=smoke_report(SOCKET))
    report = verify_image(engine, "img:1", registry=OFFLINE, timeout=60)
    assert report.ok  # a warning, not a failure: one-node jobs run
    lines = report.format().splitlines()
    assert "nccl transport: Socket (eth0); ranks connected via P2P/IPC" in lines
    (warning,) = [line for line in lines if line.startswith("warning: ")]
    assert "NCCL chose Socket (eth0) although the container was given" in warning
    assert report.to_json()["warnings"] == [warning.removeprefix("warning: ")]


def test_a_daemon_that_refuses_the_rdma_flags_still_verifies_the_image_and_says_so() -> None:
    engine = FakeEngine(labels=BUILT_BY_IMAGEBUILDER, rdma=IB_HOST, result=smoke_report(SOCKET), refuses_access=True)
    report = verify_image(engine, "img:1", registry=OFFLINE, timeout=60)
    assert report.ok, report.format()
    assert report.to_json()["rdma"]["refused"] == "error setting rlimit type 8: operation not permitted"
    # Refused with the flags, run again without them.
    assert [run["access"] for run in engine.runs if "smoke_tests" in run["command"]] == [RDMA_ACCESS, NO_ACCESS]
    (warning,) = report.warnings
    assert f"the daemon refused `{FLAGS}` (error setting rlimit type 8" in warning


def test_a_host_without_rdma_gets_no_flags_and_no_warning() -> None:
    engine = FakeEngine(labels=BUILT_BY_IMAGEBUILDER, result=smoke_report(SOCKET))
    report = verify_image(engine, "img:1", registry=OFFLINE, timeout=60)
    assert engine.smoke_run["access"] == NO_ACCESS and report.warnings == ()
    assert "nccl transport: Socket (eth0); ranks connected via P2P/IPC" in report.format()


def test_without_nccl_s_word_nothing_is_said_about_its_transport() -> None:
    """The nccl check skipped (one GPU) or ran over gloo: no transport line, and the warning that
    the container lacks the devices claims nothing about NCCL."""
    report = VerifyReport("img:1", "docker", (), checks=(Result("nccl", "skip", "one GPU"),),
                          rdma=RdmaFacts(MLX5))
    assert "nccl transport" not in report.format() and report.transport is None
    (warning,) = report.warnings
    assert "NCCL chose" not in warning and "modprobe ib_uverbs" in warning
