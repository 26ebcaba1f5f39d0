"""One retry policy for every HTTP request imagebuilder makes itself (its registry client, the
package index reads of `matrix check --online` and `matrix add`): which faults pass, how long
to wait before the next try, how many tries, and what the user reads meanwhile.

- `RetryPolicy`: the numbers, frozen; the command builds one at the edge (--registry-timeout)
  and hands it to the client.
- `decide()`: pure: (policy, attempt, fault, headers) -> `Retry(wait, reason)` or `Stop(reason)`.
  429, 500, 502, 503, 504, a reset connection and a timeout pass; everything else (400, 401,
  403, 404, a refused connection, a TLS failure) stops at once, for the caller to say.
- `send()`: the thin wrapper that does the I/O: one try, the decision, a line on stderr per
  retry (and every 15 s while a request is unanswered), the wait; `HttpFault` when it stops.

A request that may have changed something when its answer was lost (a POST that starts an
upload or mounts a blob) is repeated only where the server said it did nothing (429, 503).
"""

from __future__ import annotations

import email.utils
import http.client
import random
import ssl
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypeVar

from .heartbeat import every

T = TypeVar("T")

TRANSIENT = frozenset({429, 500, 502, 503, 504})
NOT_PROCESSED = frozenset({429, 503})
"""The statuses by which a server says it did nothing: a POST answered so is safe to repeat."""
HEARTBEAT_S = 15.0
"""The longest imagebuilder stays silent while it waits on a registry or an index."""
DEFAULT_TIMEOUT_S = 300.0
"""How long a request may go without a byte of answer. The longest a healthy registry is silent
on imagebuilder's requests is while it hashes or copies a blob before it answers (a mount, a
manifest PUT that checks its blobs): 2 GB at 10 MB/s is 200 s."""

Fault = int | BaseException
"""What went wrong with one try: the HTTP status the server answered, or what the connection raised."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    """Tries in all, for a request that keeps meeting passing faults."""
    stalled_attempts: int = 2
    """Tries in all when they time out: each costs `timeout_s`, so a stall is tried once more."""
    first_wait_s: float = 1.0
    longest_wait_s: float = HEARTBEAT_S
    """The backoff doubles from `first_wait_s` up to this, each wait jittered down to half."""
    longest_retry_after_s: float = 120.0
    """A longer Retry-After is not waited for: the request stops and says so."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    timeout_option: str = "--registry-timeout"
    """The option that sets `timeout_s`, for the lines that name it ("" where none does)."""
    refused_passes: bool = False
    """A refused connection is tried again too: a lazy mount (squashfs/nbdkit_plugin.py) reads
    for hours and outlives a registry's restart; a command asks once and says so at once."""

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.stalled_attempts < 1:
            raise ValueError("a policy makes at least one attempt")
        if not 0 < self.first_wait_s <= self.longest_wait_s or self.timeout_s <= 0:
            raise ValueError("waits and the timeout are positive, the first no longer than the longest")


REGISTRY_POLICY = RetryPolicy()
"""The registry client's, where no --registry-timeout is given."""


@dataclass(frozen=True)
class Retry:
    wait_s: float
    reason: str


@dataclass(frozen=True)
class Stop:
    reason: str


def is_timeout(fault: Fault) -> bool:
    return isinstance(fault, TimeoutError) or (
        isinstance(fault, urllib.error.URLError) and isinstance(fault.reason, TimeoutError))


def _cause(fault: BaseException) -> BaseException:
    """What a connection fault was: urllib wraps the ones before the answer in a URLError."""
    reason = fault.reason if isinstance(fault, urllib.error.URLError) else fault
    return reason if isinstance(reason, BaseException) else fault


def _is_reset(error: BaseException) -> bool:
    """The connection broke under a request (RemoteDisconnected is a ConnectionResetError)."""
    return isinstance(error, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError,
                              http.client.IncompleteRead)) and not isinstance(error, ssl.SSLError)


def describe(fault: Fault, timeout_s: float) -> str:
    """`HTTP 503`, `no answer within 300 s`, `connection reset (...)`: the reason a line gives."""
    if isinstance(fault, int):
        return f"HTTP {fault}"
    if is_timeout(fault):
        return f"no answer within {timeout_s:g} s"
    error = _cause(fault)
    if isinstance(error, http.client.IncompleteRead):
        return "the connection closed in the middle of the answer"
    if isinstance(error, http.client.RemoteDisconnected):
        return "the connection closed without an answer"
    if _is_reset(error):
        return f"connection reset ({error})"
    return str(error) or type(error).__name__


def retry_after(headers: Mapping[str, str], now: datetime) -> float | None:
    """Retry-After in seconds from `now` (it gives seconds or an HTTP date); None when absent or unreadable."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


def decide(policy: RetryPolicy, attempt: int, fault: Fault, headers: Mapping[str, str], *,
           idempotent: bool, now: datetime, draw: float) -> Retry | Stop:
    """After try number `attempt` (1 for the first) met `fault`: wait and try again, or stop.
    `draw` in [0, 1) is the jitter's random number (handed in: the decision stays pure)."""
    reason = describe(fault, policy.timeout_s)
    if isinstance(fault, int):
        passing, did_nothing = fault in TRANSIENT, fault in NOT_PROCESSED
    else:
        refused = policy.refused_passes and isinstance(_cause(fault), ConnectionRefusedError)
        passing, did_nothing = is_timeout(fault) or _is_reset(_cause(fault)) or refused, refused
    if not passing:
        return Stop(reason)
    if not idempotent and not did_nothing:
        return Stop(f"{reason}, and the request is not repeated: the server may have acted on it")
    if attempt >= tries(policy, fault):
        return Stop(f"{reason}, {attempt} times" if attempt > 1 else reason)
    asked = retry_after(headers, now) if isinstance(fault, int) else None
    if asked is not None and asked > policy.longest_retry_after_s:
        return Stop(f"{reason}, and it asks to wait {asked:g} s, longer than {policy.longest_retry_after_s:g} s")
    backoff = min(policy.longest_wait_s, policy.first_wait_s * 2 ** (attempt - 1))
    wait = backoff * (0.5 + draw / 2)
    return Retry(max(wait, asked or 0.0), reason + (f" (Retry-After: {asked:g} s)" if asked is not None else ""))


def tries(policy: RetryPolicy, fault: Fault) -> int:
    """The most tries a request that meets `fault` gets: a stall costs a whole timeout each time."""
    return policy.stalled_attempts if is_timeout(fault) else policy.attempts


class HttpFault(Exception):
    """A request that stopped: the last try's fault, and how many tries there were. The caller
    turns it into its own error (a 404 into "not there", a 401 into a login)."""

    def __init__(self, request: str, fault: Fault, error: BaseException, attempts: int, reason: str) -> None:
        super().__init__(f"{request}: {reason}")
        self.request, self.fault, self.error, self.attempts, self.reason = request, fault, error, attempts, reason

    @property
    def status(self) -> int | None:
        return self.fault if isinstance(self.fault, int) else None

    @property
    def timed_out(self) -> bool:
        return is_timeout(self.fault)


def stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def send(once: Callable[[], T], *, request: str, policy: RetryPolicy, idempotent: bool,
         say: Callable[[str], None] = stderr, sleep: Callable[[float], None] = time.sleep,
         draw: Callable[[], float] = random.random) -> T:
    """`once()` (one try of `request`, e.g. "GET http://host/v2/x/manifests/y"), tried again
    on passing faults as `policy` says; HttpFault when it stops. Each retry is a line on `say`."""
    attempt = 1
    while True:
        try:
            with _heartbeat(request, policy, say):
                return once()
        except urllib.error.HTTPError as e:
            fault: Fault = e.code
            error: BaseException = e
            headers: Mapping[str, str] = dict(e.headers.items()) if e.headers else {}
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            fault, error, headers = e, e, {}
        verdict = decide(policy, attempt, fault, headers, idempotent=idempotent,
                         now=datetime.now(timezone.utc), draw=draw())
        if isinstance(verdict, Stop):
            raise HttpFault(request, fault, error, attempt, verdict.reason) from error
        say(f"{request}: {verdict.reason}; trying again in {verdict.wait_s:.1f} s "
            f"(attempt {attempt + 1} of {tries(policy, fault)})")
        _wait(verdict.wait_s, request, sleep, say)
        attempt += 1


def _wait(seconds: float, request: str, sleep: Callable[[float], None], say: Callable[[str], None]) -> None:
    """A Retry-After longer than the heartbeat is waited out with a line every HEARTBEAT_S."""
    while seconds > HEARTBEAT_S:
        sleep(HEARTBEAT_S)
        seconds -= HEARTBEAT_S
        say(f"{request}: still waiting to try again ({seconds:.0f} s to go)")
    sleep(seconds)


@contextmanager
def _heartbeat(request: str, policy: RetryPolicy, say: Callable[[str], None]) -> Iterator[None]:
    """A line every HEARTBEAT_S while one try is unanswered, so a slow registry is never silence."""
    if policy.timeout_s <= HEARTBEAT_S:
        yield
        return
    started = time.monotonic()
    option = f": {policy.timeout_option}" if policy.timeout_option else ""

    def beat() -> None:
        say(f"{request}: no answer yet after {time.monotonic() - started:.0f} s "
            f"(gives up at {policy.timeout_s:g} s{option})")

    with every(HEARTBEAT_S, beat, name="http-heartbeat"):
        yield
