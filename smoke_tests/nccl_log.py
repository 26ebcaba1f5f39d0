"""Pure: NCCL's own log (NCCL_DEBUG=INFO) -> the transport it chose.

NCCL never fails for want of a fast network: without libibverbs, /dev/infiniband or a
working plugin it falls back to TCP sockets and only says so at INFO level. The lines read
here are the ones it prints at every communicator's start (subsystems INIT and NET):

    ... NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>
    ... NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>
    ... NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)
    ... NCCL INFO Using network IB
    ... NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read

"Using network X" names the network NCCL picked for traffic between nodes (its net plugin's
name: IB, Socket, IBext, Libfabric); the Channel lines say how each pair of ranks is connected:
within a node (P2P, SHM) or through that network (NET/...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
"""What the all-reduce's workers run with: INIT has "Using network" and the Channel lines, NET
the device lists. NCCL_DEBUG_FILE is unset for them, so that the log reaches their stdout."""

SOCKET = "Socket"
TCP_PROVIDERS = ("tcp", "sockets", "tcp;ofi_rxm")
"""libfabric providers that are TCP underneath: an OFI plugin over them is no faster than Socket."""

_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_NET_USING = re.compile(r"NCCL INFO NET/(IB|Socket) : Using (.*)$")
_NUMBERED = re.compile(r"\[\d+\](\S+)")
_PROVIDER = re.compile(r"NCCL INFO NET/OFI Selected Provider is (\S+)")
_VIA = re.compile(r"NCCL INFO (?:Channel|Ring) \d+(?:/\d+)? : .* via (.+?)\s*$")
_VIA_NET = re.compile(r"NET/(.+?)/\d+")
_VIA_LOCAL = re.compile(r"P2P/[A-Za-z]+|SHM")


@dataclass(frozen=True)
class Transport:
    """What NCCL said it uses. Every field is what a line said; None or empty: no line said it."""

    network: Optional[str] = None
    """The network for traffic between nodes: "IB", "Socket", "IBext", "Libfabric", ..."""
    devices: Tuple[str, ...] = ()
    """That network's devices: "mlx5_0:1/IB" for IB, the interface ("eth0") for Socket."""
    provider: Optional[str] = None
    """The libfabric provider an OFI plugin selected ("efa")."""
    channels: Tuple[str, ...] = ()
    """How the run's ranks were connected: "P2P/IPC", "P2P/CUMEM", "SHM" within a node, or a
    network ("NET/IB"), which NCCL also uses within a node where the GPUs cannot reach each other."""

    @property
    def over_tcp(self) -> bool:
        """The network is TCP: NCCL's Socket transport, or an OFI plugin over a TCP provider."""
        return self.network == SOCKET or (self.provider is not None and self.provider in TCP_PROVIDERS)

    def network_text(self) -> str:
        """The network and what it runs over: "Socket (eth0)", "Libfabric (provider efa)"."""
        named = self.network or "no network named"
        said = list(self.devices) + ([f"provider {self.provider}"] if self.provider else [])
        return f"{named} ({', '.join(said)})" if said else named

    def describe(self) -> str:
        """One line: "Socket (eth0); ranks connected via P2P/IPC"."""
        text = self.network_text()
        return f"{text}; ranks connected via {', '.join(self.channels)}" if self.channels else text

    def to_dict(self) -> Dict[str, Any]:
        return {"network": self.network, "devices": list(self.devices), "provider": self.provider,
                "channels": list(self.channels)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Transport":
        provider = data.get("provider")
        network = data.get("network")
        return cls(network=str(network) if network is not None else None,
                   devices=tuple(str(d) for d in data.get("devices") or ()),
                   provider=str(provider) if provider is not None else None,
                   channels=tuple(str(v) for v in data.get("channels") or ()))


def parse_transport(lines: Sequence[str]) -> Optional[Transport]:
    """The transport NCCL's INFO lines (of one or more ranks) name; None when none does."""
    network: Optional[str] = None
    devices: Dict[str, List[str]] = {}
    provider: Optional[str] = None
    via: List[str] = []
    for line in lines:
        found = _NETWORK.search(line)
        if found:
            network = found.group(1)
            continue
        found = _NET_USING.search(line)
        if found:
            listed = _NUMBERED.findall(found.group(2).split(";")[0])
            if found.group(1) == SOCKET:
                listed = [entry.split(":")[0] for entry in listed]  # eth0:10.0.0.2<0> -> eth0
            devices.setdefault(found.group(1), [])
            devices[found.group(1)] += [d for d in listed if d not in devices[found.group(1)]]
            continue
        found = _PROVIDER.search(line)
        if found:
            provider = found.group(1)
            continue
        found = _VIA.search(line)
        if found:
            kind = _kind(found.group(1))
            if kind not in via:
                via.append(kind)
    if network is None:
        # NCCL before 2.5 prints no "Using network" line; its NET/IB line means IB was taken.
        network = "IB" if "IB" in devices else SOCKET if SOCKET in devices else None
    if network is None and provider is None and not via:
        return None
    # IBext (the SHARP plugin) lists its HCAs as NET/IB too.
    listed = devices.get("IB" if network in ("IB", "IBext") else network or "", [])
    return Transport(network, tuple(listed), provider, tuple(via))


def _kind(via: str) -> str:
    """ "P2P/IPC/read" -> "P2P/IPC", "SHM/direct/direct" -> "SHM", "NET/IB/0/GDRDMA" -> "NET/IB"."""
    found = _VIA_NET.match(via)
    if found:
        return f"NET/{found.group(1)}"
    found = _VIA_LOCAL.match(via)
    return found.group(0) if found else via.split()[0]
