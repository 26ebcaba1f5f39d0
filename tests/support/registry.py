"""A local registry for a test (Debian's docker-registry), and writes to one through its HTTP API."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator

from .real_images import REPO_ROOT
from .unavailable import _unavailable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

@contextlib.contextmanager
def throwaway_registry() -> Iterator[str]:
    """A registry (Debian's docker-registry) on 127.0.0.1:PORT for as long as the block runs;
    yields that address; its storage is removed after."""
    script = REPO_ROOT / ".ci" / "registry.sh"
    port = str(_free_port())
    started = subprocess.run([str(script), "start", port], capture_output=True, text=True,
                             timeout=90)
    if started.returncode != 0:
        _unavailable(f"could not start a local registry with {script}: {started.stderr.strip()}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(script), "stop", port], capture_output=True, timeout=30, check=False)

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
