"""Pure version arithmetic for the versions torch reports.

packaging.version would be the house choice, but smoke_tests runs inside images that
carry only the standard library and torch, so the little it needs lives here.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence, Tuple, Union

Release = Tuple[int, ...]

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(.*)$")


def parse_release(text: str) -> Release:
    """'2.6.0+cu124' -> (2, 6, 0); '550.54.15' -> (550, 54, 15)."""
    match = _RELEASE.match(text)
    if match is None:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def pre_release(text: str) -> str:
    """What follows the release, minus the local part: '2.6.0a0+git1' -> 'a0'.

    Kept so that a nightly or source build (2.6.0a0) does not pass for the release.
    """
    match = _RELEASE.match(text.split("+", 1)[0])
    if match is None:
        raise ValueError(f"not a version: {text!r}")
    return match.group(2).strip()


def release_matches(expected: Sequence[int], measured: Sequence[int]) -> bool:
    """True when measured agrees with every component that expected names.

    The manifest pins as precisely as it writes: '12.4' matches CUDA 12.4 and
    '3.11' matches Python 3.11.9; missing measured components count as 0.
    """
    padded = tuple(measured) + (0,) * max(0, len(expected) - len(measured))
    return padded[: len(expected)] == tuple(expected)


def torch_matches(expected: str, measured: str) -> bool:
    """'2.6.0' matches '2.6.0+cu124' (the local part names the wheel's CUDA only)."""
    return release_matches(parse_release(expected), parse_release(measured)) and (
        pre_release(expected) == pre_release(measured)
    )


def decode_cudnn(code: int) -> Release:
    """torch.backends.cudnn.version() -> (major, minor, patch).

    cuDNN 9 encodes major*10000 + minor*100 + patch (9.1.0 -> 90100); cuDNN 8 and
    earlier used major*1000 + minor*100 + patch (8.9.7 -> 8907). No cuDNN 8 value
    reaches 10000, so the size tells the encodings apart.
    """
    if code >= 10000:
        return (code // 10000, code % 10000 // 100, code % 100)
    return (code // 1000, code % 1000 // 100, code % 100)


def decode_nccl(value: Union[int, Sequence[int]]) -> Release:
    """torch.cuda.nccl.version() -> (major, minor, patch).

    torch returns a tuple today; old builds returned NCCL_VERSION_CODE, an int that
    NCCL >= 2.9 encodes as major*10000 + minor*100 + patch (2.7.8 was 2708).
    """
    if isinstance(value, int):
        if value >= 10000:
            return (value // 10000, value % 10000 // 100, value % 100)
        return (value // 1000, value % 1000 // 100, value % 100)
    return tuple(int(part) for part in value)


def format_release(release: Optional[Sequence[int]]) -> Optional[str]:
    return None if release is None else ".".join(str(part) for part in release)
