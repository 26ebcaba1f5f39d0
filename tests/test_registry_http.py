"""The registry HTTP client publish and verify use (imagebuilder.registry: client, auth,
reference): references and targets as tables, docker's credentials and CA trust, challenges, and
against a real local registry (Debian's docker-registry, support.registry) or a stand-in HTTP
server: a login, blob mounts, a redirected HEAD, a registry that does not answer. No engine.

Split from tests/test_publish.py, which keeps the planner and publish end to end.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.real_images import imagebuilder
from support.registry import running_registry
from support.unavailable import require_module

from imagebuilder.errors import BadRequest, ImageBuilderError
from imagebuilder.registry.api import RegistryUnavailable
from imagebuilder.registry.auth import credentials_for, parse_challenge, is_insecure_by_default
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.registry.manifests import pick_manifest
from imagebuilder.registry.reference import parse_reference
from imagebuilder.registry.reference import RegistryTarget

REPO_ROOT = Path(__file__).resolve().parent.parent
SMALL = REPO_ROOT / "tests" / "data" / "matrix-small.yaml"



# --------------------------------------------------------------------------- registry tables


@pytest.mark.parametrize("ref, expected", [
    ("127.0.0.1:5000/ml/pytorch:2.6-runtime", ("127.0.0.1:5000", "ml/pytorch", "2.6-runtime")),
    ("ghcr.io/acme/pytorch", ("ghcr.io", "acme/pytorch", "latest")),
    ("localhost/pytorch@sha256:" + "a" * 64, ("localhost", "pytorch", "sha256:" + "a" * 64)),
    ("localhost/pytorch:1@sha256:" + "a" * 64, ("localhost", "pytorch", "sha256:" + "a" * 64)),
    ("pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime", ("docker.io", "pytorch/pytorch", "2.6.0-cuda12.4-cudnn9-runtime")),
    ("ubuntu:22.04", ("docker.io", "library/ubuntu", "22.04")),
])
def test_parse_reference(ref: str, expected: tuple[str, str, str]) -> None:
    r = parse_reference(ref)
    assert (r.host, r.repository, r.reference) == expected


@pytest.mark.parametrize("text, expected, base", [
    ("127.0.0.1:5000/ib", RegistryTarget("127.0.0.1:5000", "ib"), "127.0.0.1:5000/ib"),
    ("ghcr.io/acme/ml/", RegistryTarget("ghcr.io", "acme/ml"), "ghcr.io/acme/ml"),
    ("localhost:5000", RegistryTarget("localhost:5000", ""), "localhost:5000"),
    ("acme", BadRequest, None),  # a Docker Hub user: not a host
    ("https://ghcr.io/acme", BadRequest, None),
    ("ghcr.io/Acme", BadRequest, None),
])
def test_registry_target(text: str, expected: Any, base: str | None) -> None:
    if expected is BadRequest:
        with pytest.raises(BadRequest, match="--cache-from-registry .* HOST\\[:PORT\\]/NAMESPACE"):
            RegistryTarget.parse(text, "--cache-from-registry")
    else:
        target = RegistryTarget.parse(text)
        assert target == expected and target.base == base and target.repository("pytorch") == f"{base}/pytorch"


@pytest.mark.parametrize("host, scheme", [
    ("127.0.0.1:5000", "http"), ("127.8.0.1", "http"), ("localhost:5000", "http"), ("[::1]:5000", "http"),
    ("ghcr.io", "https"), ("10.0.0.5:5000", "https"), ("registry.local:443", "https"),
])
def test_scheme(host: str, scheme: str) -> None:
    """Loopback registries may fall back to http, as dockerd lets them; all others are https only."""
    assert ("http" if is_insecure_by_default(host) else "https") == scheme


def _auth(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize("config, host, expected", [
    ({"auths": {"ghcr.io": _auth("bot", "s3:cret")}}, "ghcr.io", ("bot", "s3:cret")),
    ({"auths": {"https://reg.example:5000": _auth("a", "b")}}, "reg.example:5000", ("a", "b")),
    ({"auths": {"https://index.docker.io/v1/": _auth("hub", "pw")}}, "docker.io", ("hub", "pw")),
    ({}, "ghcr.io", None),
])
def test_credentials_for(config: dict[str, Any], host: str, expected: tuple[str, str] | None) -> None:
    assert credentials_for(config, host) == expected


def test_credentials_come_from_the_credential_helper_docker_would_run(tmp_path: Path, monkeypatch: Any) -> None:
    """A real credential helper (the docker-credential-* protocol: `get`, server on stdin)."""
    helper = tmp_path / "docker-credential-ibtest"
    helper.write_text('#!/bin/sh\n[ "$1" = get ] || exit 1\nread server\n'
                      'printf \'{"ServerURL":"%s","Username":"robot","Secret":"from-helper"}\' "$server"\n')
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert credentials_for({"credsStore": "ibtest"}, "reg.example:5000") == ("robot", "from-helper")
    assert credentials_for({"credHelpers": {"ghcr.io": "ibtest"}}, "ghcr.io") == ("robot", "from-helper")
    with pytest.raises(ImageBuilderError, match="credential helper"):
        credentials_for({"credsStore": "not-installed-anywhere"}, "ghcr.io")


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "registry.crt", tmp_path / "registry.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.mark.registry
def test_https_on_loopback_with_the_ca_dockerd_would_trust(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    with running_registry(tmp_path / "registry", tls=(cert, key)) as reg:
        ref = f"{reg.address}/ml/pytorch:2.6-runtime"
        with pytest.raises(ImageBuilderError, match="does not trust") as e:
            HttpRegistry(config={}).digest(ref)
        assert "--registry-ca" in str(e.value) and f"/etc/docker/certs.d/{reg.address}/ca.crt" in str(e.value)
        assert HttpRegistry(config={}, ca_file=cert).digest(ref) is None  # it answered over https: no such tag
        certs = tmp_path / "certs.d" / reg.address
        certs.mkdir(parents=True)
        (certs / "ca.crt").write_bytes(cert.read_bytes())
        assert HttpRegistry(config={}, certs_root=tmp_path / "certs.d").digest(ref) is None


def test_parse_challenge_and_pick_manifest() -> None:
    assert parse_challenge('Bearer realm="https://a.io/token",service="a.io",scope="repository:x:pull"') == (
        "bearer", {"realm": "https://a.io/token", "service": "a.io", "scope": "repository:x:pull"})
    index = {"manifests": [{"digest": "sha256:arm", "platform": {"os": "linux", "architecture": "arm64"}},
                           {"digest": "sha256:amd", "platform": {"os": "linux", "architecture": "amd64"}}]}
    assert pick_manifest(index) == "sha256:amd"
    assert pick_manifest({"manifests": index["manifests"][:1]}) == "sha256:arm"


@pytest.mark.registry
def test_basic_auth_with_docker_login_credentials(tmp_path: Path) -> None:
    # docker-registry's htpasswd accepts bcrypt entries only; the bcrypt package comes with
    # paramiko (docker[ssh], imagebuilder's own dependency). Python 3.13 has no crypt module.
    bcrypt = require_module("bcrypt", "it makes the registry's bcrypt htpasswd entry")
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(f"bot:{bcrypt.hashpw(b's3cret', bcrypt.gensalt()).decode()}\n")
    with running_registry(tmp_path / "registry", htpasswd=htpasswd) as reg:
        ref = f"{reg.address}/ml/pytorch:2.6-runtime"
        with pytest.raises(ImageBuilderError, match=f"docker login {reg.address}"):
            HttpRegistry(config={}).digest(ref)
        logged_in = HttpRegistry(config={"auths": {reg.address: _auth("bot", "s3cret")}})
        assert logged_in.digest(ref) is None and logged_in.labels(ref) is None  # in, and nothing there
        with pytest.raises(ImageBuilderError, match="HTTP 401"):
            HttpRegistry(config={"auths": {reg.address: _auth("bot", "wrong")}}).digest(ref)


@pytest.mark.registry
def test_a_blob_is_mounted_from_another_repository_not_uploaded(tmp_path: Path) -> None:
    """publish mounts the layers its cache export uploaded into the image's repository; a blob
    the source repository does not have is not mounted, and the upload session the registry
    opened instead is cancelled."""
    with running_registry(tmp_path / "registry") as reg:
        blob = os.urandom(4096)
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        base = f"http://{reg.address}/v2/ml"
        started = urllib.request.urlopen(urllib.request.Request(f"{base}/imagebuilder-cache/blobs/uploads/",
                                                                method="POST", data=b""))
        location = started.headers["Location"]
        put = f"{location}{'&' if '?' in location else '?'}digest={digest}"
        urllib.request.urlopen(urllib.request.Request(
            put if put.startswith("http") else f"http://{reg.address}{put}", method="PUT", data=blob,
            headers={"Content-Type": "application/octet-stream"}))

        def has(repository: str, what: str) -> bool:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{base}/{repository}/blobs/{what}", method="HEAD"))
                return True
            except urllib.error.HTTPError:
                return False

        registry = HttpRegistry(config={})
        cache = f"{reg.address}/ml/imagebuilder-cache:k"
        image = f"{reg.address}/ml/pytorch:2.6-runtime"
        assert not has("pytorch", digest)
        # has_blob (what the report's layers ask before a push) answers for one repository.
        assert (registry.has_blob(image, digest), registry.has_blob(cache, digest)) == (False, True)
        assert registry.mount(image, digest, cache) is True
        assert has("pytorch", digest) and registry.has_blob(image, digest)
        other = "sha256:" + "0" * 64
        assert registry.mount(f"{reg.address}/ml/pytorch:2.6-runtime", other, cache) is False
        assert not has("pytorch", other)
        # The refused mount's upload session is cancelled: docker-registry drops its start time
        # and data (it keeps an empty hash state), so it is no session any more.
        sessions = list((tmp_path / "registry" / "data").rglob("_uploads/*/startedat"))
        assert sessions == [], sessions


def test_a_blob_head_that_the_registry_redirects_stays_a_head() -> None:
    """A registry may answer a blob's HEAD with a redirect to its storage (S3, a CDN); urllib
    follows a redirected HEAD with a GET, so has_blob would download the blob (GBs of a torch
    layer) to learn that it exists."""
    import http.server
    import threading

    asked: list[tuple[str, str]] = []

    class Storage(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            asked.append(("HEAD", self.path))
            if self.path.startswith("/v2/"):
                self.send_response(307)
                self.send_header("Location", "/storage/blob")
            else:
                self.send_response(200)
                self.send_header("Content-Length", "1000000")
            self.end_headers()

        def do_GET(self) -> None:
            asked.append(("GET", self.path))
            self.send_response(404 if self.path.startswith("/v2/") else 200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Storage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        digest = "sha256:" + "a" * 64
        assert HttpRegistry(config={}).has_blob(f"127.0.0.1:{server.server_port}/ml/pytorch:x", digest) is True
    finally:
        server.shutdown()
        server.server_close()
    assert asked == [("HEAD", f"/v2/ml/pytorch/blobs/{digest}"), ("HEAD", "/storage/blob")]


def test_an_unreachable_registry_is_reported_before_anything_is_built(free_port: int) -> None:
    done = imagebuilder("--matrix", str(SMALL), "publish", "--torch", "2.6", "--cuda", "12.4",
                         "--registry", f"127.0.0.1:{free_port}/ml", "--dry-run")
    assert done.returncode == 1
    assert f"http://127.0.0.1:{free_port}/v2/" in done.stderr and "did not answer" in done.stderr
    with pytest.raises(RegistryUnavailable):
        HttpRegistry(config={}).digest(f"127.0.0.1:{free_port}/ml/pytorch:x")
