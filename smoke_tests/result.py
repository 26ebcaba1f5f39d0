"""The one value every check returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping

PASS = "pass"
FAIL = "fail"
SKIP = "skip"
STATUSES = (PASS, FAIL, SKIP)


@dataclass(frozen=True)
class Result:
    """Outcome of one check.

    measurements holds JSON-ready values only (str, int, float, bool, None, lists),
    because the result travels out of the image as JSON and is read back by
    imagebuilder on a host that may have no torch.
    """

    name: str
    status: str
    reason: str = ""
    measurements: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "measurements": dict(self.measurements),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Result":
        return cls(
            name=str(data["name"]),
            status=str(data["status"]),
            reason=str(data.get("reason", "")),
            measurements=dict(data.get("measurements") or {}),
        )


def passed(name: str, reason: str, **measurements: Any) -> Result:
    return Result(name, PASS, reason, measurements)


def failed(name: str, reason: str, **measurements: Any) -> Result:
    return Result(name, FAIL, reason, measurements)


def skipped(name: str, reason: str, **measurements: Any) -> Result:
    return Result(name, SKIP, reason, measurements)
