"""The retry policy every imagebuilder HTTP request follows (imagebuilder/registry/retry.py): the
decision as a table; then the registry client and the package index behind the tests' own
fault-injecting proxy (tests/fault_proxy.py) in front of a real docker-registry and a real
HTTP server, and `publish --dry-run` (the plan's lookups, no image built) through it."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import threading
import time
import urllib.error
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from support.real_images import imagebuilder
from support.registry import put_blob, put_manifest
from fault_proxy import Fault, FaultProxy

from imagebuilder.lock.index import PackageIndex
from imagebuilder.registry.api import RegistryDenied, RegistryFailing, RegistryProtocolError, RegistryTimeout
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.registry.manifests import OCI_MANIFEST
from imagebuilder.registry.retry import HttpFault, Retry, RetryPolicy, Stop, decide, retry_after, send

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=timezone.utc)
POLICY = RetryPolicy()
TIMEOUT = TimeoutError("timed out")
RESET = urllib.error.URLError(ConnectionResetError(104, "Connection reset by peer"))
REFUSED = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

# name: (attempt, fault, headers, idempotent, draw, expected: ("retry", wait) or ("stop", reason part))
DECISIONS: dict[str, tuple[int, Any, dict[str, str], bool, float, tuple[str, Any]]] = {
    "503, first try, no jitter": (1, 503, {}, True, 1.0, ("retry", 1.0)),
    "503, first try, most jitter": (1, 503, {}, True, 0.0, ("retry", 0.5)),
    "500 doubles": (3, 500, {}, True, 1.0, ("retry", 4.0)),
    "502 capped at the heartbeat": (4, 502, {}, True, 1.0, ("retry", 8.0)),
    "504 on the last try stops": (5, 504, {}, True, 1.0, ("stop", "HTTP 504, 5 times")),
    "429 waits its Retry-After": (1, 429, {"Retry-After": "7"}, True, 0.0, ("retry", 7.0)),
    "Retry-After as an HTTP date": (1, 503, {"retry-after": "Fri, 04 Dec 2026 12:00:03 GMT"}, True, 0.0, ("retry", 3.0)),
    "a backoff longer than Retry-After wins": (3, 429, {"Retry-After": "1"}, True, 1.0, ("retry", 4.0)),
    "Retry-After past the longest wait stops": (1, 503, {"Retry-After": "3600"}, True, 0.0,
                                                ("stop", "asks to wait 3600 s")),
    "400 stops": (1, 400, {}, True, 0.0, ("stop", "HTTP 400")),
    "401 stops (the caller logs in)": (1, 401, {}, True, 0.0, ("stop", "HTTP 401")),
    "403 stops": (1, 403, {}, True, 0.0, ("stop", "HTTP 403")),
    "404 stops (the caller reads it as absent)": (1, 404, {}, True, 0.0, ("stop", "HTTP 404")),
    "a reset is retried": (1, RESET, {}, True, 1.0, ("retry", 1.0)),
    "a timeout is retried once": (1, TIMEOUT, {}, True, 1.0, ("retry", 1.0)),
    "a second timeout stops, said as one": (2, TIMEOUT, {}, True, 1.0, ("stop", f"no answer within {POLICY.timeout_s:g} s, 2 times")),
    "a refused connection stops": (1, REFUSED, {}, True, 1.0, ("stop", "Connection refused")),
    "a POST answered 503 did nothing: retried": (1, 503, {}, False, 1.0, ("retry", 1.0)),
    "a POST answered 500 may have acted: stops": (1, 500, {}, False, 1.0, ("stop", "not repeated")),
    "a POST whose connection reset may have acted: stops": (1, RESET, {}, False, 1.0, ("stop", "not repeated")),
}


@pytest.mark.parametrize("name", list(DECISIONS))
def test_the_decision(name: str) -> None:
    attempt, fault, headers, idempotent, draw, (kind, expected) = DECISIONS[name]
    verdict = decide(POLICY, attempt, fault, headers, idempotent=idempotent, now=NOW, draw=draw)
    if kind == "retry":
        assert isinstance(verdict, Retry), verdict
        assert verdict.wait_s == pytest.approx(expected)
    else:
        assert isinstance(verdict, Stop), verdict
        assert expected in verdict.reason


@pytest.mark.parametrize("value, seconds", [("0", 0.0), ("12", 12.0), ("Fri, 04 Dec 2026 11:59:00 GMT", 0.0),
                                            ("soon", None), ("", None)])
def test_retry_after(value: str, seconds: float | None) -> None:
    assert retry_after({"Retry-After": value} if value else {}, NOW) == seconds


def test_every_retry_is_a_line_and_a_stop_carries_the_tries() -> None:
    lines: list[str] = []
    waits: list[float] = []
    answers: Iterator[str | Exception] = iter([urllib.error.HTTPError("http://r/v2/x", 503, "busy", {}, None),  # type: ignore[arg-type]
                    urllib.error.HTTPError("http://r/v2/x", 503, "busy", {}, None),  # type: ignore[arg-type]
                    "done"])

    def once() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert send(once, request="GET http://r/v2/x", policy=POLICY, idempotent=True, say=lines.append,
                sleep=waits.append, draw=lambda: 1.0) == "done"
    assert waits == [1.0, 2.0]
    assert lines == ["GET http://r/v2/x: HTTP 503; trying again in 1.0 s (attempt 2 of 5)",
                     "GET http://r/v2/x: HTTP 503; trying again in 2.0 s (attempt 3 of 5)"]

    def always() -> str:
        raise urllib.error.HTTPError("http://r/v2/x", 500, "broken", {}, None)  # type: ignore[arg-type]

    with pytest.raises(HttpFault) as stopped:
        send(always, request="GET http://r/v2/x", policy=POLICY, idempotent=True, say=lines.append,
             sleep=waits.append, draw=lambda: 1.0)
    assert (stopped.value.status, stopped.value.attempts) == (500, 5)
    assert sum(waits[2:]) <= 4 * POLICY.longest_wait_s


def test_a_long_retry_after_is_waited_out_with_a_line_every_15_s() -> None:
    lines: list[str] = []
    answers = iter(["429", "ok"])

    def once() -> str:
        if next(answers) == "429":
            _raise_429()
        return "ok"

    assert send(once, request="GET u", policy=POLICY, idempotent=True, say=lines.append,
                sleep=lambda s: None, draw=lambda: 0.0) == "ok"
    assert lines[0] == "GET u: HTTP 429 (Retry-After: 40 s); trying again in 40.0 s (attempt 2 of 5)"
    assert lines[1:] == ["GET u: still waiting to try again (25 s to go)", "GET u: still waiting to try again (10 s to go)"]


def _raise_429() -> None:
    raise urllib.error.HTTPError("u", 429, "slow down", {"Retry-After": "40"}, None)  # type: ignore[arg-type]


def _image(upstream: str, repository: str, tag: str) -> str:
    """A tiny image (a config and one layer) under REPOSITORY:TAG; its manifest digest."""
    config = put_blob(upstream, repository, json.dumps(
        {"architecture": "amd64", "os": "linux", "config": {"Labels": {"made-by": "test_http_retry"}},
         "rootfs": {"type": "layers", "diff_ids": []}}).encode())
    layer = put_blob(upstream, repository, b"layer of " + tag.encode())
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {**config, "mediaType": "application/vnd.oci.image.config.v1+json"},
                           "layers": [{**layer, "mediaType": "application/vnd.oci.image.layer.v1.tar"}]}).encode()
    return put_manifest(upstream, repository, tag, manifest, OCI_MANIFEST)


def _client(lines: list[str], **policy: Any) -> HttpRegistry:
    # The policy's own waits, shortened: what is tested is which faults pass and what is said.
    return HttpRegistry(config={}, policy=RetryPolicy(**{"first_wait_s": 0.05, **policy}), say=lines.append)


@pytest.mark.registry
def test_one_503_on_a_manifest_lookup_is_survived_and_said(upstream: str, proxy: FaultProxy) -> None:
    digest = _image(upstream, "ml/pytorch", "a")
    proxy.inject(Fault("HEAD", r"/manifests/a$", status=503))
    lines: list[str] = []
    assert _client(lines).digest(f"{proxy.address}/ml/pytorch:a") == digest
    assert proxy.asked("HEAD", "/manifests/a$") == ["HTTP 503", "passed"]
    (line,) = lines
    assert line.startswith(f"HEAD http://{proxy.address}/v2/ml/pytorch/manifests/a: HTTP 503; trying again in ")


@pytest.mark.registry
def test_a_429_waits_its_retry_after(upstream: str, proxy: FaultProxy) -> None:
    _image(upstream, "ml/pytorch", "b")
    proxy.inject(Fault("GET", r"/manifests/b$", status=429, headers={"Retry-After": "1"}))
    lines: list[str] = []
    started = time.monotonic()
    assert _client(lines).labels(f"{proxy.address}/ml/pytorch:b") == {"made-by": "test_http_retry"}
    assert time.monotonic() - started >= 1.0
    assert proxy.asked("GET", "/manifests/b$") == ["HTTP 429", "passed"]
    assert "HTTP 429 (Retry-After: 1 s)" in lines[0]


@pytest.mark.registry
def test_a_reset_and_a_503_on_index_puts_are_survived(upstream: str, proxy: FaultProxy) -> None:
    child = _image(upstream, "ml/pytorch", "c-amd64")
    ref = f"{proxy.address}/ml/pytorch:c"
    proxy.inject(Fault("GET", rf"/manifests/{child}$", reset=True), Fault("PUT", r"/manifests/c$", status=503))
    lines: list[str] = []
    client = _client(lines)
    body = client.index_for(ref, [(child, "linux/amd64")])
    assert client.put_index(ref, body) == "sha256:" + hashlib.sha256(body).hexdigest()
    assert proxy.asked("GET", rf"/manifests/{child}$") == ["reset", "passed"]
    assert proxy.asked("PUT", r"/manifests/c$") == ["HTTP 503", "passed"]
    assert len(lines) == 2 and "connection" in lines[0] and "HTTP 503" in lines[1]


@pytest.mark.registry
def test_a_mount_post_is_not_repeated_after_a_500(upstream: str, proxy: FaultProxy) -> None:
    """A POST that may have opened an upload session is not sent again; the push uploads the blob."""
    blob = put_blob(upstream, "ml/cache", b"cached layer")
    proxy.inject(Fault("POST", r"/blobs/uploads/", status=500, times=None))
    lines: list[str] = []
    client = _client(lines)
    with pytest.raises(RegistryFailing):
        client.mount(f"{proxy.address}/ml/pytorch:d", str(blob["digest"]), f"{proxy.address}/ml/cache:k")
    assert proxy.asked("POST", "/blobs/uploads/") == ["HTTP 500"] and lines == []


@pytest.mark.registry
@pytest.mark.parametrize("fault, error, words", [
    (Fault("GET", r"/manifests/e$", status=403, times=None), RegistryDenied,
     ["refused GET http://{proxy}/v2/ml/pytorch/manifests/e", "HTTP 403", "may read and push"]),
    (Fault("GET", r"/manifests/e$", status=400, times=None), RegistryProtocolError,
     ["GET http://{proxy}/v2/ml/pytorch/manifests/e", "HTTP 400"]),
    (Fault("GET", r"/manifests/e$", garbage=True, times=None), RegistryProtocolError,
     ["GET http://{proxy}/v2/ml/pytorch/manifests/e", "not JSON"]),
], ids=["403", "400", "not JSON"])
def test_a_permanent_fault_stops_at_once_in_one_line(upstream: str, proxy: FaultProxy, fault: Fault,
                                                      error: type[Exception], words: list[str]) -> None:
    _image(upstream, "ml/pytorch", "e")
    proxy.inject(fault)
    lines: list[str] = []
    with pytest.raises(error) as stopped:
        _client(lines).labels(f"{proxy.address}/ml/pytorch:e")
    message = str(stopped.value)
    assert "\n" not in message and all(w.format(proxy=proxy.address) in message for w in words), message
    assert len(proxy.asked("GET", r"/manifests/e$")) == 1 and lines == []


@pytest.mark.registry
def test_a_stall_ends_at_the_timeout_said_as_a_timeout(upstream: str, proxy: FaultProxy) -> None:
    proxy.inject(Fault("HEAD", r"/manifests/f$", stall_s=3, times=None))
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(RegistryTimeout) as stopped:
        _client(lines, timeout_s=1).digest(f"{proxy.address}/ml/pytorch:f")
    assert time.monotonic() - started < 5
    assert proxy.asked("HEAD", r"/manifests/f$") == ["stalled", "stalled"]
    assert str(stopped.value) == (f"the registry at http://{proxy.address}/v2/ did not answer HEAD "
                                  "/v2/ml/pytorch/manifests/f within 1 s (2 tries): a timeout; check that it runs, "
                                  "or give it longer with --registry-timeout")


# --------------------------------------------------------------------------- the CLI: publish's plan


PLAN = ("publish", "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--os", "debian12",
        "--variant", "runtime", "--builder", "buildkit", "--dry-run")


@pytest.mark.registry
def test_publish_survives_one_503_on_its_first_manifest_lookup(proxy: FaultProxy) -> None:
    proxy.inject(Fault("*", r"/manifests/", status=503))
    done = imagebuilder(*PLAN, "--registry", f"{proxy.address}/ns", timeout=300)
    assert done.returncode == 0, done.stderr
    (first, *_) = [what for _, path, what in proxy.seen if "/manifests/" in path]
    assert first == "HTTP 503"
    assert ": HTTP 503; trying again in " in done.stderr


@pytest.mark.registry
def test_a_persistent_500_ends_publish_in_one_line_naming_the_request(proxy: FaultProxy) -> None:
    proxy.inject(Fault("*", r"/manifests/", status=500, times=None))
    done = imagebuilder(*PLAN, "--registry", f"{proxy.address}/ns", timeout=300)
    assert done.returncode == 1, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"the registry at http://{proxy.address}/v2/ answered HEAD /v2/ns/pytorch/manifests/" in error
    assert "with HTTP 500" in error and "on all 5 tries" in error and "try again later" in error
    assert len([line for line in done.stderr.splitlines() if "trying again" in line]) == 4
    assert "Traceback" not in done.stderr


@pytest.mark.registry
def test_a_403_ends_publish_at_once(proxy: FaultProxy) -> None:
    proxy.inject(Fault("*", r"/manifests/", status=403, times=None))
    done = imagebuilder(*PLAN, "--registry", f"{proxy.address}/ns", timeout=300)
    assert done.returncode == 1, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "the registry refused HEAD" in error and "HTTP 403" in error
    assert len(proxy.asked("HEAD", "/manifests/")) == 1 and "trying again" not in done.stderr


@pytest.mark.registry
def test_registry_timeout_ends_a_stalled_publish_as_a_timeout(proxy: FaultProxy) -> None:
    proxy.inject(Fault("*", r"/manifests/", stall_s=5, times=None))
    started = time.monotonic()
    done = imagebuilder(*PLAN, "--registry", f"{proxy.address}/ns", "--registry-timeout", "1", timeout=300)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 30
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "did not answer HEAD /v2/ns/pytorch/manifests/" in error and "within 1 s (2 tries): a timeout" in error


# --------------------------------------------------------------------------- the package index behind the proxy


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    page = tmp_path / "simple" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text('<a href="torch-2.6.0-cp311-cp311-manylinux_2_28_x86_64.whl">torch</a>\n')
    handler = functools.partial(_Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize("fault, outcome", [
    (Fault("GET", "/simple/torch/", status=502), "passed"),
    (Fault("GET", "/simple/torch/", reset=True), "passed"),
    (Fault("GET", "/simple/torch/", status=503, times=None), "IndexUnavailable"),
    (Fault("GET", "/simple/torch/", status=401, times=None), "BadIndexAnswer"),
], ids=["502 once", "a reset", "503 for good", "401"])
def test_the_package_index_follows_the_same_rules(index: str, fault: Fault, outcome: str) -> None:
    lines: list[str] = []
    with FaultProxy(index) as proxy:
        proxy.inject(fault)
        reader = PackageIndex(f"http://{proxy.address}/simple/", policy=RetryPolicy(first_wait_s=0.05, timeout_s=10),
                              say=lines.append)
        if outcome == "passed":
            assert [f.filename for f in reader.files("torch")] == ["torch-2.6.0-cp311-cp311-manylinux_2_28_x86_64.whl"]
            assert len(lines) == 1 and lines[0].startswith(f"GET http://{proxy.address}/simple/torch/: ")
            return
        with pytest.raises(Exception) as stopped:
            reader.files("torch")
        assert type(stopped.value).__name__ == outcome
        assert "/simple/torch/" in str(stopped.value) and "\n" not in str(stopped.value)
        assert len(proxy.asked("GET", "/simple/torch/")) == (5 if outcome == "IndexUnavailable" else 1)
