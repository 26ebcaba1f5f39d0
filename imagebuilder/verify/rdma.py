"""Pure: the RDMA devices of the daemon's host, what verify's container is given of them, and
what to warn about once NCCL has said which transport it chose.

NCCL falls back to TCP sockets without failing when a container cannot use the host's
InfiniBand, RoCE or EFA devices (no /dev/infiniband, a small memlock limit, no CAP_IPC_LOCK, no
libibverbs in the image): a multi-node job then trains at a fraction of the fabric's speed. So
verify gives its container the devices when the host has them, as a multi-node job's container
needs them, and says so when it could not, or when NCCL chose sockets all the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smoke_tests.nccl_log import Transport

from ..engine.api import NO_ACCESS, HostAccess, RunResult

RDMA_ACCESS = HostAccess(devices=("/dev/infiniband",), ulimits=(("memlock", -1),), capabilities=("IPC_LOCK",))
"""What a container needs to use the host's RDMA devices: the verbs devices, pinned memory
without limit, and the right to pin it."""

PROBE_TIMEOUT = 30.0
_MARK = "rdma-probe"
PROBE = ("sh", "-c", f'for d in /sys/class/infiniband/* /sys/class/infiniband_verbs/uverbs*; do '
                     f'[ -e "$d" ] && echo "{_MARK} $d"; done; echo "{_MARK} end"')
"""Read in a container of the image on the daemon's host, which may be another machine: a
container sees the RDMA devices its network namespace may use (all of them unless the host put
the RDMA subsystem in exclusive mode), which is what NCCL in a container can use. Marked lines,
as an image's entrypoint may print too."""


@dataclass(frozen=True)
class RdmaFacts:
    devices: tuple[str, ...] = ()
    """/sys/class/infiniband's entries: mlx5_0 (InfiniBand, RoCE), efa_0 (AWS EFA), ..."""
    verbs: tuple[str, ...] = ()
    """/sys/class/infiniband_verbs's uverbsN: each a /dev/infiniband/uverbsN to give (ib_uverbs loaded)."""
    error: str | None = None
    """Why the devices could not be read; None: read."""
    given: HostAccess = NO_ACCESS
    """What verify gives the smoke tests' container (access_for), or gave once the daemon refused it."""
    refused: str | None = None
    """The daemon's words when it refused to start the container with RDMA_ACCESS."""

    @property
    def missing(self) -> HostAccess:
        return self.given.lacks(RDMA_ACCESS)

    def to_json(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "verbs": list(self.verbs), "error": self.error,
                "given": self.given.flags(), "refused": self.refused}


def read_rdma_probe(outcome: RunResult) -> RdmaFacts:
    lines = [line.split(" ", 1)[1] for line in outcome.output.splitlines() if line.startswith(f"{_MARK} ")]
    if outcome.timed_out or "end" not in lines:
        said = " ".join(outcome.output.split())[:200] or "no output"
        return RdmaFacts(error=f"listing /sys/class/infiniband in the image failed ({said})")
    names = [line.rpartition("/")[2] for line in lines if line != "end"]
    return RdmaFacts(devices=tuple(n for n in names if not n.startswith("uverbs")),
                     verbs=tuple(n for n in names if n.startswith("uverbs")))


def access_for(rdma: RdmaFacts) -> HostAccess:
    """Give the container the host's RDMA devices when it has them and there are verbs devices to
    give (`--device /dev/infiniband` of a host without them is refused by the daemon)."""
    return RDMA_ACCESS if rdma.devices and rdma.verbs else NO_ACCESS


def rdma_warnings(rdma: RdmaFacts | None, transport: Transport | None) -> tuple[str, ...]:
    """What a person must know: RDMA devices the container was not given, or NCCL on TCP although
    it was given them. `transport` is what NCCL said, None when it did not run or said nothing:
    then no sentence says what NCCL chose."""
    if rdma is None or rdma.error is not None or not rdma.devices:
        return ()
    names = ", ".join(rdma.devices)
    tcp = transport is not None and transport.over_tcp
    if rdma.missing:
        if rdma.refused is not None:
            why = f"the daemon refused `{rdma.missing.flags()}` ({rdma.refused}), so the smoke tests ran without them"
        elif not rdma.verbs:
            why = ("there is no /dev/infiniband/uverbs* to give it (/sys/class/infiniband_verbs lists none: "
                   "load ib_uverbs, `modprobe ib_uverbs`)")
        else:
            why = f"add `{rdma.missing.flags()}`"
        chose = (f"NCCL chose {transport.network_text()}" if tcp and transport is not None
                 else "NCCL in such a container falls back to TCP sockets between nodes")
        return (f"the host has RDMA devices ({names}) the container was not given: {chose}; {why}; "
                f"a multi-node job's container needs `{RDMA_ACCESS.flags()}`",)
    if tcp and transport is not None:
        return (f"NCCL chose {transport.network_text()} although the container was given the host's RDMA devices "
                f"({names}) with `{rdma.given.flags()}`: the image's NCCL found no usable verbs library "
                "(libibverbs.so.1 and a provider: rdma-core's libibverbs1 and ibverbs-providers) or no active "
                "port (`ibstat` on the host); multi-node jobs would run over TCP",)
    return ()
