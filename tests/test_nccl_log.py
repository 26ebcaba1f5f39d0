"""smoke_tests.nccl_log: NCCL's INFO lines -> the transport it chose, over lines recorded from
real runs (each case says where it was published; the host/pid prefix is shortened, NCCL's own
text is as printed), and the nccl check's wiring: its workers log at INFO and the check reports
what they said."""

from __future__ import annotations

import sys
import textwrap
from typing import Any

import pytest
from support.unavailable import require_module

from smoke_tests.nccl_log import DEBUG_ENV, Transport, parse_transport

P = "node:1:2 [0] NCCL INFO "

CASES: list[tuple[str, list[str], Transport | None]] = [
    # id, NCCL's lines, what they say
    # RoCE over the built-in IB transport, NCCL 2.19.3 (NVIDIA/nccl-tests#185).
    ("ib-roce", [
        P + "NET/Plugin : No plugin found, using internal implementation",
        P + "NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:11.1.128.136<0>",
        P + "Using non-device net plugin version 0",
        P + "Using network IB",
     ], Transport("IB", ("mlx5_10:1/RoCE", "mlx5_11:1/RoCE"))),
    # InfiniBand with GPUDirect RDMA between two nodes (siderolabs/docs#566, its expected log).
    ("ib-gdrdma", [
        P + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB [RO]; OOB eth0:10.0.0.1<0>",
        P + "Using network IB",
        P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
        P + "Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
     ], Transport("IB", ("mlx5_0:1/IB", "mlx5_1:1/IB", "mlx5_2:1/IB", "mlx5_3:1/IB"), None, ("NET/IB",))),
    # The HPC-X SHARP plugin: "Using network IBext", its HCAs listed by NET/IB (NVIDIA/nccl#1357).
    ("ibext-sharp", [
        P + "NET/IB : Using [0]mlx5_0:1/IB/SHARP [1]mlx5_1:1/IB/SHARP [RO]; OOB ibp25s0:10.20.0.119<0>",
        P + "Using network IBext",
     ], Transport("IBext", ("mlx5_0:1/IB/SHARP", "mlx5_1:1/IB/SHARP"))),
    # IB disabled: sockets over two interfaces (NVIDIA/nccl-tests#188), P2P within the node.
    ("socket-two-interfaces", [
        P + "NCCL_IB_DISABLE set by environment to 1.",
        P + "NET/Socket : Using [0]ibs85f0:192.168.1.14<0> [1]ib0:192.168.1.15<0>",
        P + "Using network Socket",
        P + "Channel 01/0 : 1[2a000] -> 8[27000] [send] via NET/Socket/0",
        P + "Channel 00/0 : 0[27000] -> 7[ca000] via P2P/IPC/read",
     ], Transport("Socket", ("ibs85f0", "ib0"), None, ("NET/Socket", "P2P/IPC"))),
    # No RDMA device at all: "No device found", then sockets (NVIDIA/nccl#226, NCCL 2.4: no
    # "Using network" line yet).
    ("socket-no-ib-device", [
        P + "NET/IB : No device found.",
        P + "NET/Socket : Using [0]ens3:172.31.12.210<0>",
     ], Transport("Socket", ("ens3",))),
    # Sockets on loopback (NVIDIA/nccl#1053).
    ("socket-lo", [
        P + "NET/Socket : Using [0]lo:127.0.0.1<0>",
        P + "Using network Socket",
        P + "NET/Socket : GPU Direct RDMA Disabled for HCA 0 'lo'",
     ], Transport("Socket", ("lo",))),
    # An IPv6 link-local address in the interface list (NVIDIA/nccl#1291's bootstrap line, as NET/Socket prints it).
    ("socket-ipv6", [P + "NET/Socket : Using [0]ib0:fe80::a288:c203:d2:aaf2%ib0<0>", P + "Using network Socket"],
     Transport("Socket", ("ib0",))),
    # AWS EFA through aws-ofi-nccl, NCCL 2.2x (NVIDIA/nccl#1597).
    ("ofi-efa", [
        P + "NET/OFI Selected Provider is efa (found 16 nics)",
        P + "NET/OFI NIC group 0 device #0 0000:56:00.0",
        P + "Using network Libfabric",
     ], Transport("Libfabric", (), "efa")),
    # The plugin's older name, as its channels print it (aws/aws-ofi-nccl#24), with P2P/IPC
    # rings (NCCL 2.4's "Ring" lines) and a plugin over TCP.
    ("ofi-aws-libfabric-tcp", [
        P + "NET/OFI Selected Provider is tcp",
        P + "Using network AWS Libfabric",
        P + "Ring 00 : 26[2] -> 30[6] via P2P/IPC",
        P + "Ring 00 : 7 -> 8 [send] via NET/AWS Libfabric/0",
     ], Transport("AWS Libfabric", (), "tcp", ("P2P/IPC", "NET/AWS Libfabric"))),
    # One node, eight GPUs: CUMEM P2P (NCCL 2.19+, uccl-project/uccl#172) and shared memory
    # (NVIDIA/nccl#1232); the ring-order lines ("Channel 00/02 :    0   1") name no transport.
    ("one-node-p2p-shm", [
        P + "Channel 00/02 :    0   1",
        P + "Channel 12/0 : 15[7] -> 8[0] via P2P/CUMEM",
        P + "Channel 00 : 2[1] -> 0[0] via SHM/direct/direct",
        P + "Channel 00/0 : 1[1] -> 0[0] via P2P/direct pointer",
     ], Transport(None, (), None, ("P2P/CUMEM", "SHM", "P2P/direct"))),
    # Nothing NCCL said about its transport: gloo's run, or NCCL_DEBUG unset.
    ("nothing", ["NCCL version 2.21.5+cuda12.4", P + "cudaDriverVersion 12040",
                 P + "Bootstrap : Using eth0:172.17.0.2<0>"], None),
]


@pytest.mark.parametrize("lines,expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_transport_from_nccls_lines(lines: list[str], expected: Transport | None) -> None:
    assert parse_transport(lines) == expected


@pytest.mark.parametrize("transport,line,over_tcp", [
    (Transport("Socket", ("eth0",)), "Socket (eth0)", True),
    (Transport("IB", ("mlx5_0:1/IB", "mlx5_1:1/IB"), None, ("P2P/IPC",)),
     "IB (mlx5_0:1/IB, mlx5_1:1/IB); ranks connected via P2P/IPC", False),
    (Transport("Libfabric", (), "efa"), "Libfabric (provider efa)", False),
    (Transport("AWS Libfabric", (), "tcp"), "AWS Libfabric (provider tcp)", True),
    (Transport(None, (), None, ("SHM",)), "no network named; ranks connected via SHM", False),
])
def test_transport_says_itself_in_one_line(transport: Transport, line: str, over_tcp: bool) -> None:
    assert transport.describe() == line
    assert line.startswith(transport.network_text())
    assert transport.over_tcp is over_tcp
    assert Transport.from_dict(transport.to_dict()) == transport


def test_nccl_workers_log_at_info_and_the_check_reports_their_transport(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in workers print what NCCL prints (and read the env NCCL would): the check's result
    carries the transport, and only NCCL's runs are asked to log."""
    require_module("torch", "the nccl check imports torch (.ci/setup --tests installs the CPU build)")
    from smoke_tests.checks import nccl
    from smoke_tests.child import RESULT_PREFIX

    worker = textwrap.dedent(f"""
        import json, os
        assert os.environ["NCCL_DEBUG"] == "INFO" and "NCCL_DEBUG_FILE" not in os.environ
        print({P!r} + "NET/Socket : Using [0]eth0:172.17.0.2<0>")
        print({P!r} + "Using network Socket")
        print({P!r} + "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")
        print({RESULT_PREFIX!r} + json.dumps({{"rank": 0, "mismatches": 0, "first_wrong": None,
                                             "seconds_per_iteration": 0.001}}))
    """)

    def stand_in(module: str, args: Any = ()) -> list[str]:
        return [sys.executable, "-c", worker]

    monkeypatch.setattr(nccl, "module_command", stand_in)
    monkeypatch.setenv("NCCL_DEBUG_FILE", "/tmp/nccl.%h.%p")  # would take the log off stdout
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    result = nccl.run_workers(nccl.Plan("nccl", 2, 2**20, 1), timeout=60)
    assert result.status == "pass", result.reason
    assert result.measurements["transport"] == {"network": "Socket", "devices": ["eth0"], "provider": None,
                                                 "channels": ["P2P/IPC"]}
    assert nccl.worker_env("nccl").items() >= DEBUG_ENV.items()
    assert "NCCL_DEBUG" not in nccl.worker_env("gloo")
