"""VerifyReport: what verify found, for people (format) and machines (to_json); Live prints
it while it is made. `raise_if_failed()` turns a failure into VerificationFailed (exit 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from smoke_tests.nccl_log import Transport
from smoke_tests.report import check_line, format_table, read_progress, summary
from smoke_tests.result import Result

from ..errors import BadRequest, ImageBuilderError
from ..trust.provenance import BuiltFrom
from ..trust.signature_check import SignatureCheck
from .preflight import PreflightItem
from .rdma import RdmaFacts, rdma_warnings



class VerificationFailed(ImageBuilderError):
    """The image (or this environment) did not pass; `failures` is (name, reason) pairs."""

    target: str
    failures: Sequence[tuple[str, str]]

    def describe(self) -> str:
        what = "; ".join(f"{name}: {reason}" for name, reason in self.fields["failures"])
        return f"{self.fields['target']} failed verification: {what}"


class NotVerifiable(VerificationFailed, BadRequest):
    """Nothing to verify as asked: the image exists nowhere, or is not a PyTorch image (exit 2)."""



# --------------------------------------------------------------------------- report


NOT_RUN = "not run: preflight failed"
SIGNATURE_ONLY = "signature"
"""The mode of a report that checked the image's signature and started no container."""


# The live lines' name column: smoke_tests.checks (which imports torch) names them; the longest is 11.
CHECK_WIDTH = len("environment")


@dataclass
class Live:
    """verify's report while it is made, for people: the header and the preflight at once, then
    a line per check as it ends (the smoke tests' progress lines); format(live) prints the rest.
    An image whose smoke tests print no progress (an older build) gets its table at the end."""

    echo: Callable[[str], None]
    head_shown: bool = False
    checks_shown: int = 0

    def head(self, report: VerifyReport) -> None:
        for line in [*report.head_lines(), ""]:
            self.echo(line)
        self.head_shown = True

    def output(self, line: str) -> None:
        result = read_progress(line)
        if result is not None:
            if not self.checks_shown:
                self.echo(f"{'CHECK':<{CHECK_WIDTH}}  STATUS  REASON")
            self.echo(check_line(result, CHECK_WIDTH))
            self.checks_shown += 1


@dataclass(frozen=True)
class VerifyReport:
    target: str
    """The image reference, or "local <python>"."""
    mode: str
    """"docker" or "local"."""
    preflight: tuple[PreflightItem, ...]
    checks: tuple[Result, ...] = ()
    error: str | None = None
    """Why the smoke tests gave no verdict (not run, timed out, crashed); None when they did."""
    output_tail: tuple[str, ...] = ()
    """The run's last output lines when it went wrong, for the reader to see why."""
    torch: str | None = None
    gpu_count: int | None = None
    seconds: float = 0.0
    require_gpu: bool = True
    notices: tuple[str, ...] = ()
    """What the reader should know about how the image was judged (lent smoke tests)."""
    built_from: BuiltFrom | None = None
    """Where the image was built from, per its registry provenance attestation."""
    signature: SignatureCheck | None = None
    """The signature check of the digest the tag names (signature_check.check_image); None: not asked."""
    bad_request: bool = False
    """The failure is the request's (the image exists nowhere, is not a PyTorch image): exit 2."""
    rdma: RdmaFacts | None = None
    """The host's RDMA devices and what the smoke tests' container was given; None: not read."""

    @property
    def transport(self) -> Transport | None:
        """The transport NCCL named in the nccl check's run; None: it did not run or said nothing."""
        for check in self.checks:
            said = check.measurements.get("transport") if check.name == "nccl" else None
            if isinstance(said, dict):
                return Transport.from_dict(said)
        return None

    @property
    def warnings(self) -> tuple[str, ...]:
        """What does not fail the image but a multi-node job would meet (rdma.rdma_warnings)."""
        return rdma_warnings(self.rdma, self.transport)

    @property
    def ok(self) -> bool:
        if self.signature is not None and not self.signature.ok:
            return False
        if self.mode == SIGNATURE_ONLY:
            return self.signature is not None
        return (self.error is None and bool(self.checks)
                and not any(item.failed for item in self.preflight)
                and not any(check.failed for check in self.checks))

    @property
    def failures(self) -> tuple[tuple[str, str], ...]:
        """(name, reason) of every failed preflight item and check, and of a run that died."""
        found = [(item.name, item.detail) for item in self.preflight if item.failed]
        if self.signature is not None and not self.signature.ok:
            found.append(("signature", self.signature.detail))
        if self.mode == SIGNATURE_ONLY:
            return tuple(found)
        if self.error is not None and self.error != NOT_RUN:
            found.append(("smoke tests", self.error))
        found += [(check.name, check.reason) for check in self.checks if check.failed]
        if not found and not self.checks:
            found.append(("smoke tests", "no check ran"))
        return tuple(found)

    def raise_if_failed(self) -> None:
        if not self.ok:
            error = NotVerifiable if self.bad_request else VerificationFailed
            raise error(target=self.target, failures=tuple(self.failures))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "target": self.target,
            "mode": self.mode,
            "require_gpu": self.require_gpu,
            "torch": self.torch,
            "gpu_count": self.gpu_count,
            "seconds": round(self.seconds, 2),
            "preflight": [item.to_dict() for item in self.preflight],
            "checks": [check.to_dict() for check in self.checks],
            "error": self.error,
            "output_tail": list(self.output_tail),
            "notices": list(self.notices),
            "built_from": self.built_from.to_json() if self.built_from else None,
            "signature": self.signature.to_json() if self.signature is not None else None,
            "nccl_transport": transport.to_dict() if (transport := self.transport) is not None else None,
            "rdma": self.rdma.to_json() if self.rdma is not None else None,
            "warnings": list(self.warnings),
        }

    def head_lines(self) -> list[str]:
        """What is known before the smoke tests start: the header and the preflight table."""
        width = max([len("PREFLIGHT")] + [len(item.name) for item in self.preflight])
        lines = [f"verify {self.target} ({self.mode}"
                 f"{', GPUs required' if self.require_gpu else ', CPU mode allowed'})"]
        if self.signature is not None:
            lines.append(self.signature.line())
        lines.append(f"{'PREFLIGHT':<{width}}  STATUS  DETAIL")
        return lines + [f"{item.name:<{width}}  {item.status.upper():<6}  {item.detail}" for item in self.preflight]

    def format(self, live: Live | None = None) -> str:
        """For people: the preflight table, then the checks' table (or why there is none).
        After `live` showed the head and a line per check, the rest: the summary, the verdict."""
        verdict = f"{'OK' if self.ok else 'FAILED'}: {self.target} ({self.seconds:.1f}s)"
        if self.mode == SIGNATURE_ONLY:
            return "\n".join([self.signature.line() if self.signature else "signature: not checked", verdict])
        lines = [] if live is not None and live.head_shown else self.head_lines()
        if self.built_from is not None:
            lines += self.built_from.lines()
        if self.checks and not (live is not None and live.checks_shown == len(self.checks)):
            # The smoke tests' table without its own OK line: the verdict below is the one.
            lines += ["", *format_table(list(self.checks)).splitlines()[:-1]]
        lines.append(f"checks: {summary(list(self.checks))}" if self.checks else "")
        if (transport := self.transport) is not None:
            lines.append(f"nccl transport: {transport.describe()}")
        lines += [f"warning: {warning}" for warning in self.warnings]
        if self.error is not None:
            lines.append(f"smoke tests: {self.error}")
        if self.output_tail:
            lines.append(f"last {len(self.output_tail)} lines of output:")
            lines += [f"  | {line}" for line in self.output_tail]
        lines.append(verdict)
        return "\n".join(lines)


