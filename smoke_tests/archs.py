"""Pure: does a torch build's CUDA arch list cover a GPU's compute capability?

CUDA's rules, as torch.cuda.get_arch_list() spells the entries:
- sm_XY is a cubin: it runs on capability X.Z for every Z >= Y (same major only:
  an sm_80 cubin runs on sm_86, never on sm_90).
- sm_XYa is arch-specific (sm_90a): it runs on exactly X.Y.
- sm_XYf is family-specific (CUDA 12.9+, sm_100f): same major, minor >= Y.
- compute_XY is PTX: the driver JIT-compiles it for any capability >= X.Y, newer
  majors included (compute_XYa / compute_XYf follow the cubin rules above).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from .versions import parse_release

Capability = Tuple[int, int]

# The last digit is the minor version: sm_86 -> 8.6, sm_120 -> 12.0, sm_100a -> 10.0.
_ENTRY = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")


@dataclass(frozen=True)
class ArchEntry:
    kind: str  # "sm" (cubin) or "compute" (PTX)
    capability: Capability
    suffix: str  # "", "a" or "f"

    def runs_on(self, device: Capability) -> bool:
        if self.suffix == "a":
            return self.capability == device
        if self.suffix == "f" or self.kind == "sm":
            return self.capability[0] == device[0] and self.capability[1] <= device[1]
        return self.capability <= device


def parse_entry(entry: str) -> Optional[ArchEntry]:
    match = _ENTRY.match(entry.strip())
    if match is None:
        return None
    kind, major, minor, suffix = match.groups()
    return ArchEntry(kind, (int(major), int(minor)), suffix)


@dataclass(frozen=True)
class Coverage:
    covered: bool
    via: Optional[str]  # the arch-list entry that provides the kernels
    jit: bool  # only PTX covers the device: the driver must JIT-compile it

    def describe(self, device: Capability) -> str:
        arch = sm_name(device)
        if not self.covered:
            return f"no kernels for {arch}"
        if self.jit:
            return f"{arch} via {self.via} PTX (driver JIT)"
        return f"{arch} via {self.via} cubin"


def sm_name(capability: Capability) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def coverage(device: Capability, arch_list: Sequence[str]) -> Coverage:
    """Best way this arch list runs on device: exact cubin, then a compatible cubin
    (the newest one, as the CUDA runtime picks), then PTX (the newest)."""
    entries = [(text, parse_entry(text)) for text in arch_list]
    cubins = [(e.capability, t) for t, e in entries if e and e.kind == "sm" and e.runs_on(device)]
    if cubins:
        return Coverage(True, max(cubins)[1], jit=False)
    ptx = [(e.capability, t) for t, e in entries if e and e.kind == "compute" and e.runs_on(device)]
    if ptx:
        return Coverage(True, max(ptx)[1], jit=True)
    return Coverage(False, None, jit=False)


def ptx_jit_impossible(covered: Coverage, driver_cuda: Optional[str], torch_cuda: Optional[str]) -> bool:
    """PTX built by a newer toolkit than the driver supports cannot be JIT-compiled, and
    minor-version compatibility does not extend to PTX. Unknown versions decide nothing."""
    if not covered.jit or driver_cuda is None or torch_cuda is None:
        return False
    return parse_release(driver_cuda) < parse_release(torch_cuda)
