"""A fault-injecting HTTP proxy for the tests: it stands in front of a real server (the local
docker-registry, a package index) and passes every request through, streaming the answer,
except those a test switched a fault on for: a status (with headers and body), a reset
connection, a stall, or a body that is not JSON. Each fault matches a method and a path
pattern and fires a number of times (or for good), or a body corrupted in passing; `seen` records what was asked and what it got.

    with FaultProxy("127.0.0.1:5000") as proxy:
        proxy.inject(Fault("HEAD", r"/manifests/", status=503))
        HttpRegistry(config={}).digest(f"{proxy.address}/ml/pytorch:2.6")

Request bodies are read whole (imagebuilder sends manifests and empty POSTs, with a
Content-Length); answers are streamed in chunks as they arrive.
"""

from __future__ import annotations

import http.client
import http.server
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

CHUNK = 64 * 1024
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclass
class Fault:
    method: str
    """The request method it matches ("*": any)."""
    path: str
    """A regular expression searched in the request's path (and query)."""
    status: int | None = None
    """Answer with this status instead of passing the request on."""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    reset: bool = False
    """Close the connection at once, with a TCP reset, without an answer."""
    stall_s: float = 0.0
    """Say nothing for this long, then close the connection."""
    garbage: bool = False
    """Pass the request on, and answer 200 with a body that is not JSON."""
    corrupt: bool = False
    """Pass the request on, and the answer with each byte of its body flipped (same length, same headers)."""
    times: int | None = 1
    """How many matching requests it fires on; None: every one."""
    overlapping: tuple[int, int] | None = None
    """Only a request for a byte in [first, last] (by its Range; one without asks for every byte)."""

    def matches(self, method: str, path: str, range_header: str | None = None) -> bool:
        return ((self.times is None or self.times > 0) and self.method in ("*", method)
                and bool(re.search(self.path, path)) and self._overlaps(range_header))

    def _overlaps(self, range_header: str | None) -> bool:
        if self.overlapping is None or range_header is None:  # (no Range: the whole blob)
            return True
        first, last = self.overlapping
        spans = re.findall(r"(\d+)-(\d*)", range_header or "")
        return any(int(a) <= last and (not b or int(b) >= first) for a, b in spans)


class FaultProxy:
    def __init__(self, upstream: str, port: int = 0) -> None:
        self.upstream = upstream
        self.faults: list[Fault] = []
        self.seen: list[tuple[str, str, str]] = []
        """(method, path, what happened: "passed", "HTTP 503", "reset", "stalled", "garbage")."""
        self.ranges: list[tuple[str, str, str | None]] = []
        """(method, path, its Range header or None) of every request, in the order they came."""
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.server_port}"

    def inject(self, *faults: Fault) -> None:
        with self._lock:
            self.faults = list(faults)
            self.seen.clear()

    def asked(self, method: str, pattern: str) -> list[str]:
        """What each request of `method` whose path matches `pattern` got, in order."""
        return [what for m, path, what in self.seen if m == method and re.search(pattern, path)]

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, method: str, path: str, range_header: str | None = None) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path, range_header):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
            return None

    def _record(self, method: str, path: str, what: str) -> None:
        with self._lock:
            self.seen.append((method, path, what))

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def handle(self) -> None:
                # A TLS handshake (dockerd's and containerd's first try at a registry) is answered as
                # a Go registry answers one: in plain HTTP, which makes them fall back to http.
                if self.connection.recv(1, socket.MSG_PEEK) == b"\x16":
                    self.connection.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n"
                                            b"Client sent an HTTP request to an HTTPS server.\n")
                    return
                super().handle()

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    proxy.ranges.append((self.command, self.path, self.headers.get("Range")))
                fault = proxy._take(self.command, self.path, self.headers.get("Range"))
                if fault is not None and fault.reset:
                    proxy._record(self.command, self.path, "reset")
                    # SO_LINGER 0: close() sends a RST, as a load balancer that drops the connection does.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault is not None and fault.stall_s:
                    proxy._record(self.command, self.path, "stalled")
                    time.sleep(fault.stall_s)
                    self.close_connection = True
                    return
                if fault is not None and fault.status is not None:
                    proxy._record(self.command, self.path, f"HTTP {fault.status}")
                    self.send_response(fault.status)
                    for name, value in fault.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(fault.body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(fault.body)
                    return
                self._pass(body, garbage=fault is not None and fault.garbage,
                           corrupt=fault is not None and fault.corrupt)

            def _pass(self, body: bytes, garbage: bool, corrupt: bool = False) -> None:
                upstream = http.client.HTTPConnection(proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    answer = upstream.getresponse()
                    if garbage:
                        answer.read()
                        proxy._record(self.command, self.path, "garbage")
                        page = b"<html><body>502 Bad Gateway (a proxy's page)</body></html>"
                        self.send_response(200)
                        for name, value in answer.getheaders():
                            if name.lower() not in HOP_BY_HOP | {"content-length"}:
                                self.send_header(name, value)
                        self.send_header("Content-Length", str(len(page)))
                        self.end_headers()
                        self.wfile.write(page)
                        return
                    proxy._record(self.command, self.path, "corrupted" if corrupt else "passed")
                    self.send_response(answer.status, answer.reason)
                    length = answer.getheader("Content-Length")
                    for name, value in answer.getheaders():
                        if name.lower() not in HOP_BY_HOP:
                            self.send_header(name, value)
                    if length is None and self.command != "HEAD":
                        self.send_header("Connection", "close")  # the end of the body is the end of the connection
                        self.close_connection = True
                    self.end_headers()
                    if self.command == "HEAD":
                        return
                    while chunk := answer.read(CHUNK):
                        self.wfile.write(bytes(byte ^ 0xFF for byte in chunk) if corrupt else chunk)
                        self.wfile.flush()
                finally:
                    upstream.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any

        return Handler
