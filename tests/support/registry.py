"""The one way the tests run a registry: Debian's docker-registry on 127.0.0.1:PORT (LocalRegistry),
no Docker engine needed; and writes to one through its HTTP API.

A test that needs a registry for its length takes conftest's `registry` fixture (or
throwaway_registry for a block); one that stops the registry and starts it again with its
storage, or serves it over TLS or behind a login, makes a LocalRegistry. .ci/registry.sh is the
same registry for a shell (bench/, a developer); the tests do not go through it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .unavailable import _unavailable

REGISTRY_BIN = Path("/usr/bin/docker-registry")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ACCESS_LOGS: dict[str, Path] = {}
"""Each running LocalRegistry's access log, by address (127.0.0.1:PORT)."""


def access_log(address: str) -> Path:
    """The access log of the LocalRegistry serving `address` (tests read which requests it got)."""
    return ACCESS_LOGS[address]


class LocalRegistry:
    """Debian's docker-registry on 127.0.0.1:PORT, its config and storage under `root`, that can
    be stopped and started again with its storage kept; over TLS (`tls`: certificate and key) or
    behind a login (`htpasswd`) where asked. Its access log is root/registry.log."""

    def __init__(self, root: Path, port: int, htpasswd: Path | None = None,
                 tls: tuple[Path, Path] | None = None) -> None:
        self.root = root
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.scheme = "https" if tls else "http"
        self.process: subprocess.Popen[bytes] | None = None
        (root / "data").mkdir(parents=True, exist_ok=True)
        auth = f"auth:\n  htpasswd: {{realm: imagebuilder-test, path: '{htpasswd}'}}\n" if htpasswd else ""
        tls_config = f", tls: {{certificate: '{tls[0]}', key: '{tls[1]}'}}" if tls else ""
        (root / "config.yml").write_text(
            f"version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {root / 'data'}}}\n"
            f"  delete: {{enabled: true}}\nhttp: {{addr: '{self.address}'{tls_config}}}\n{auth}")

    def start(self) -> None:
        """Serve, and return once it answers (skips, or fails in CI, without docker-registry)."""
        if not REGISTRY_BIN.exists():
            _unavailable(f"{REGISTRY_BIN} is missing: apt-get install docker-registry (.ci/setup --tests does)")
        log = open(self.root / "registry.log", "ab")  # noqa: SIM115 - the child keeps it open
        ACCESS_LOGS[self.address] = self.root / "registry.log"
        self.process = subprocess.Popen([str(REGISTRY_BIN), "serve", str(self.root / "config.yml")],
                                        stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2).close()
                return
            except urllib.error.HTTPError:
                return  # it answers (401 when it wants a login; 400 when it speaks only TLS)
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    pytest.fail(f"docker-registry did not answer on {self.address}: "
                                f"{(self.root / 'registry.log').read_text()[-2000:]}")
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop serving; the storage stays (start() serves it again)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def remove(self) -> None:
        """Stop, and remove the storage (a torch image's blobs are GBs; pytest keeps a run's
        temporary directories)."""
        self.stop()
        shutil.rmtree(self.root / "data", ignore_errors=True)


@contextlib.contextmanager
def running_registry(root: Path | None = None, *, htpasswd: Path | None = None,
                     tls: tuple[Path, Path] | None = None) -> Iterator[LocalRegistry]:
    """A LocalRegistry on a free port, serving for as long as the block runs, its storage
    removed after (with `root`, under it; else in a temporary directory of its own)."""
    folder = root if root is not None else Path(tempfile.mkdtemp(prefix="imagebuilder-test-registry-"))
    registry = LocalRegistry(folder, _free_port(), htpasswd=htpasswd, tls=tls)
    registry.start()
    try:
        yield registry
    finally:
        registry.remove()
        if root is None:
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def throwaway_registry() -> Iterator[str]:
    """A registry on 127.0.0.1:PORT for as long as the block runs; yields that address; its
    storage is removed after."""
    with running_registry() as registry:
        yield registry.address


def put_blob(host: str, repository: str, blob: bytes) -> dict[str, object]:
    """Upload `blob` into REPOSITORY of the registry at HOST (loopback http, no auth) in one
    monolithic PUT; its descriptor's digest and size."""
    import hashlib
    import urllib.parse
    import urllib.request

    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    start = urllib.request.Request(f"http://{host}/v2/{repository}/blobs/uploads/", method="POST")
    with urllib.request.urlopen(start, timeout=30) as answer:
        location = urllib.parse.urljoin(f"http://{host}/", answer.headers["Location"])
    sep = "&" if "?" in location else "?"
    put = urllib.request.Request(f"{location}{sep}digest={digest}", data=blob, method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    urllib.request.urlopen(put, timeout=30).close()
    return {"digest": digest, "size": len(blob)}


def put_manifest(host: str, repository: str, reference: str, manifest: bytes, media_type: str) -> str:
    """PUT `manifest` as REPOSITORY:REFERENCE on the registry at HOST; the digest it answers."""
    import urllib.request

    put = urllib.request.Request(f"http://{host}/v2/{repository}/manifests/{reference}", data=manifest,
                                 method="PUT", headers={"Content-Type": media_type})
    with urllib.request.urlopen(put, timeout=30) as answer:
        return str(answer.headers["Docker-Content-Digest"])
