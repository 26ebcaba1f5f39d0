"""Registry faults said as what they are, and nothing claimed that did not happen (issue 45, parts
2 and 5, the registry's side): the tests' fault proxy (tests/fault_proxy.py) in front of a real
docker-registry, real cosign, and the CLI as a user runs it. Each asserts the exit code, the one
`error:` line, the --report and what the registry holds afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support.cleanup import local_tags
from support.real_images import REPO_ROOT, imagebuilder
from support.registry import put_blob, put_manifest
from fault_proxy import Fault, FaultProxy
from support.canned_publish import images

from imagebuilder.engine.api import BuildRequest
from imagebuilder.engine.classic import ClassicBuilder
from imagebuilder.engine.errors import PushFailed, push_cause
from imagebuilder.errors import BadRequest
from imagebuilder.publish.indexes import WRITE, WRITTEN, MergeIncomplete, plan_indexes, write_indexes
from imagebuilder.publish.ledger import Ledger
from imagebuilder.publish.plan import PUSHED, SKIPPED, Outcome, plan
from imagebuilder.publish.push import incomplete
from imagebuilder.publish.report import raise_if_failed
from imagebuilder.registry import retry as http_retry
from imagebuilder.registry.api import RegistryTimeout
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.registry.manifests import OCI_MANIFEST
from imagebuilder.registry.reference import pinned
from imagebuilder.registry.retry import RetryPolicy
from imagebuilder.trust.cosign import Cosign, CosignTimedOut
from imagebuilder.trust.signature_check import SIGNED, UNKNOWN, UNSIGNED, check_image
from imagebuilder.trust.signing import SIGNATURE_ANNOTATION, SIMPLE_SIGNING, signature_tag

if TYPE_CHECKING:
    from imagebuilder.engine.docker import DockerEngine

PLAN = ("publish", "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--os", "debian12",
        "--variant", "runtime", "--builder", "buildkit", "--dry-run")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# --------------------------------------------------------------------------- a failed push keeps its cause

STATE = "_state=" + "Zm9v" * 120  # an upload session's token, as the registry hands it out: ~500 characters
PUSH_ERRORS = {
    "a 500 after the upload URL": (
        f'failed to do request: Put "http://127.0.0.1:5000/v2/ns/pytorch/blobs/uploads/8f3c?{STATE}&digest=sha256:ab": '
        "received unexpected HTTP status: 500 Internal Server Error",
        "500 Internal Server Error", False),
    "a reset after the upload URL": (
        f'Patch "http://127.0.0.1:5000/v2/ns/pytorch/blobs/uploads/8f3c?{STATE}": read tcp 127.0.0.1:5000: '
        "connection reset by peer",
        "connection reset by peer", False),
    "a refusal": ("denied: requested access to the resource is denied", "denied", True),
    "a 401": ("unexpected status from HEAD request to http://r/v2/x/blobs/sha256:ab: 401 Unauthorized",
              "401 Unauthorized", True),
}


@pytest.mark.parametrize("name", list(PUSH_ERRORS))
def test_a_failed_push_keeps_its_status_or_reset_and_says_login_only_when_refused(name: str) -> None:
    said, cause, refused = PUSH_ERRORS[name]
    line = str(PushFailed(ref="127.0.0.1:5000/ns/pytorch:2.6", attempts=3, detail=push_cause(said)))
    assert cause in line and "_state" not in line and "\n" not in line, line
    assert ("logged in" in line) is refused, line
    if not refused:
        assert "rerun" in line


def _image(upstream: str, repository: str, tag: str, labels: dict[str, str] | None = None,
           architecture: str = "amd64") -> str:
    """A tiny image (a config and one layer) under REPOSITORY:TAG; its manifest digest."""
    config = put_blob(upstream, repository, json.dumps(
        {"architecture": architecture, "os": "linux", "config": {"Labels": labels or {}},
         "rootfs": {"type": "layers", "diff_ids": []}}).encode())
    layer = put_blob(upstream, repository, b"layer of " + tag.encode())
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {**config, "mediaType": "application/vnd.oci.image.config.v1+json"},
                           "layers": [{**layer, "mediaType": "application/vnd.oci.image.layer.v1.tar"}]}).encode()
    return put_manifest(upstream, repository, tag, manifest, OCI_MANIFEST)


def _tag_digest(upstream: str, repository: str, tag: str) -> str | None:
    """What the registry itself (not through the proxy) says the tag names."""
    return HttpRegistry(config={}).digest(f"{upstream}/{repository}:{tag}")


def _planned_tags(address: str, tmp_path: Path) -> list[str]:
    report = tmp_path / "plan.json"
    done = imagebuilder(*PLAN, "--registry", f"{address}/ns", "--report", str(report), timeout=300)
    assert done.returncode == 0, done.stderr
    return [ref.rsplit(":", 1)[1] for ref in json.loads(report.read_text())["planned"][0]["push"]]


@pytest.mark.registry
def test_an_unreadable_manifest_is_a_fault_in_the_plan_not_a_rebuild(upstream: str, proxy: FaultProxy,
                                                                        tmp_path: Path) -> None:
    primary = _planned_tags(proxy.address, tmp_path)[0]
    _image(upstream, "ns/pytorch", primary, {"io.imagebuilder.inputs-hash": "an older render"})
    proxy.inject(Fault("GET", r"/manifests/", garbage=True, times=None))
    report = tmp_path / "report.json"
    done = imagebuilder(*PLAN, "--registry", f"{proxy.address}/ns", "--report", str(report), timeout=300)
    assert done.returncode == 1, done.stderr
    (error,) = error_lines(done.stderr)
    assert f"unexpected answer from GET http://{proxy.address}/v2/ns/pytorch/manifests/sha256:" in error
    assert "not JSON" in error and "Traceback" not in done.stderr
    assert "no inputs-hash label" not in done.stdout + done.stderr and "to build" not in done.stdout
    document = json.loads(report.read_text())
    assert (document["ok"], document["state"], document["images"]) == (False, "ended", [])
    assert "not JSON" in document["error"]


NOT_FOUND = b'{"errors": [{"code": "BLOB_UNKNOWN"}]}'


@pytest.mark.registry
@pytest.mark.parametrize(("fault", "says"), [
    # The tag's HEAD names a digest; its manifest, asked for by that digest, is not there.
    (Fault("GET", r"/manifests/sha256:", status=404, body=b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}', times=None),
     "with no such manifest"),
    # The manifest names a config blob the registry does not have (what a proxy that 404s blobs does).
    (Fault("GET", r"/blobs/sha256:", status=404, body=NOT_FOUND, times=None), "(the config of "),
    # A config blob answered with other bytes (valid JSON, but not the digest the manifest names).
    (Fault("GET", r"/blobs/sha256:", status=200, body=b'{"config": {"Labels": {}}}', times=None),
     "bytes of another digest"),
], ids=["manifest-404", "config-404", "config-other-bytes"])
def test_what_the_registry_names_and_cannot_deliver_is_a_fault_in_the_plan_not_a_rebuild(
        upstream: str, proxy: FaultProxy, tmp_path: Path, fault: Fault, says: str) -> None:
    primary = _planned_tags(proxy.address, tmp_path)[0]
    _image(upstream, "ns/pytorch", primary, {"io.imagebuilder.inputs-hash": "an older render"})
    proxy.inject(fault)
    report = tmp_path / "report.json"
    done = imagebuilder(*PLAN, "--registry", f"{proxy.address}/ns", "--report", str(report), timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    (error,) = error_lines(done.stderr)
    assert "it advertises what it cannot deliver" in error and says in error and "Traceback" not in done.stderr
    assert "no inputs-hash label" not in done.stdout + done.stderr and "to build" not in done.stdout
    document = json.loads(report.read_text())
    assert (document["ok"], document["state"], document["images"]) == (False, "ended", [])
    assert document["error"] in error


@pytest.mark.registry
def test_a_run_ended_by_a_registry_fault_still_writes_its_report(proxy: FaultProxy, tmp_path: Path) -> None:
    proxy.inject(Fault("*", r"/manifests/", status=500, times=None))
    report = tmp_path / "report.json"
    done = imagebuilder(*PLAN, "--registry", f"{proxy.address}/ns", "--report", str(report), timeout=300)
    assert done.returncode == 1, done.stderr
    (error,) = error_lines(done.stderr)
    document = json.loads(report.read_text())
    assert document["ok"] is False and document["state"] == "ended"
    assert document["error"] in error and "HTTP 500" in document["error"]
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temp file beside it


@pytest.mark.registry
def test_ctrl_c_while_the_registry_stalls_writes_the_report_and_exits_130(proxy: FaultProxy, tmp_path: Path) -> None:
    proxy.inject(Fault("*", r"/manifests/", stall_s=30, times=None))
    report = tmp_path / "report.json"
    env = {**os.environ, "GITHUB_SHA": "0" * 40, "IMAGEBUILDER_BUILDER": "classic"}
    process = subprocess.Popen([sys.executable, "-m", "imagebuilder", *PLAN, "--registry", f"{proxy.address}/ns",
                                "--report", str(report)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not proxy.asked("HEAD", "/manifests/") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proxy.asked("HEAD", "/manifests/"), "the plan never asked the registry"
    sent = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert time.monotonic() - sent < 10 and "Traceback" not in stderr
    document = json.loads(report.read_text())
    assert (document["ok"], document["state"]) == (False, "ended") and "interrupted" in document["error"]


@pytest.mark.registry
def test_one_stall_on_the_first_lookup_is_retried_naming_the_request(proxy: FaultProxy) -> None:
    proxy.inject(Fault("HEAD", r"/manifests/", stall_s=4))
    done = imagebuilder(*PLAN, "--registry", f"{proxy.address}/ns", "--registry-timeout", "2", timeout=300)
    assert done.returncode == 0, done.stderr
    (retry,) = [line for line in done.stderr.splitlines() if "trying again" in line]
    assert retry.startswith(f"HEAD http://{proxy.address}/v2/ns/pytorch/manifests/") and "no answer within 2 s" in retry
    assert proxy.asked("HEAD", "/manifests/")[:2] == ["stalled", "passed"]


@pytest.mark.registry
def test_an_index_is_written_only_over_children_the_registry_has(upstream: str, proxy: FaultProxy) -> None:
    amd64 = _image(upstream, "ns/pytorch", "m-amd64")
    _image(upstream, "ns/pytorch", "m-arm64", architecture="arm64")
    ref = f"{proxy.address}/ns/pytorch:m"
    client = HttpRegistry(config={}, policy=RetryPolicy(first_wait_s=0.05))
    steps = plan_indexes(client, {ref: ["linux/amd64", "linux/arm64"]})
    assert [s.action for s in steps] == [WRITE]
    # Between the plan and the PUT the amd64 image goes (another job deleted it, the registry lost it).
    proxy.inject(Fault("HEAD", rf"/manifests/{amd64}$", status=404, times=None))
    (outcome,) = write_indexes(client, steps)
    assert outcome.status == SKIPPED and f"m-amd64 ({amd64}) is not in the registry" in outcome.reason
    assert proxy.asked("PUT", r"/manifests/m$") == [] and _tag_digest(upstream, "ns/pytorch", "m") is None
    with pytest.raises(MergeIncomplete):
        raise_if_failed((), (outcome,))
    # With the children there, the same plan writes it, and the registry has that very index.
    proxy.inject()
    (written,) = write_indexes(client, steps)
    assert written.status == WRITTEN and _tag_digest(upstream, "ns/pytorch", "m") == written.digest


@pytest.mark.registry
def test_only_a_whole_digest_is_signed(upstream: str, proxy: FaultProxy) -> None:
    amd64 = _image(upstream, "ns/pytorch", "w-amd64")
    arm64 = _image(upstream, "ns/pytorch", "w-arm64", architecture="arm64")
    client = HttpRegistry(config={}, policy=RetryPolicy(first_wait_s=0.05))
    ref = f"{proxy.address}/ns/pytorch:w"
    index = client.put_index(ref, client.index_for(ref, [(amd64, "linux/amd64"), (arm64, "linux/arm64")]))
    assert incomplete(client, pinned(ref, index)) is None
    proxy.inject(Fault("HEAD", rf"/manifests/{arm64}$", status=404, times=None))
    assert incomplete(client, pinned(ref, index)) == f"its index lists {arm64}, which the registry does not have"
    missing = "sha256:" + "0" * 64
    assert incomplete(client, pinned(ref, missing)) == f"the registry has no manifest {missing}"


# --------------------------------------------------------------------------- signatures


@pytest.fixture
def keys(signing_keys: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """conftest's key pairs (ours has an empty password, given as cosign takes it), and a garbled key."""
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    garbled = tmp_path / "garbled.key"
    garbled.write_text(signing_keys["key"].read_text().replace("A", "B"))
    return {**signing_keys, "garbled": garbled}


def _signed(upstream: str, keys: dict[str, Path], tag: str) -> str:
    """A tiny image signed for real with our key; its REPOSITORY@DIGEST on `upstream`."""
    target = pinned(f"{upstream}/ns/pytorch:{tag}", _image(upstream, "ns/pytorch", tag))
    Cosign().sign(str(keys["key"]), target)
    return target


@pytest.mark.registry
def test_verify_signature_only_says_an_unreadable_signature_is_a_fault(upstream: str, proxy: FaultProxy,
                                                                         keys: dict[str, Path]) -> None:
    target = _signed(upstream, keys, "s")
    tag = f"{proxy.address}/ns/pytorch:s"
    # The control: our key verifies it (it then lacks an SBOM attestation, which is another failure).
    done = imagebuilder("verify", tag, "--key", str(keys["pub"]), "--signature-only", timeout=300)
    assert done.returncode == 1 and "no SBOM attestation" in done.stdout + done.stderr, done.stdout + done.stderr
    proxy.inject(Fault("GET", r"\.sig$", garbage=True, times=None))
    done = imagebuilder("verify", tag, "--key", str(keys["pub"]), "--signature-only", timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    (error,) = error_lines(done.stderr)
    assert f"GET http://{proxy.address}/v2/ns/pytorch/manifests/{signature_tag(target).rsplit(':', 1)[1]}" in error
    assert "not JSON" in error and "another key" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.registry
def test_signed_needs_a_readable_signature_manifest_with_a_signature_layer(upstream: str, proxy: FaultProxy,
                                                                            keys: dict[str, Path]) -> None:
    target = _signed(upstream, keys, "t")
    client = HttpRegistry(config={}, policy=RetryPolicy(first_wait_s=0.05))
    tag = f"{proxy.address}/ns/pytorch:t"
    assert check_image(tag, key=None, store=client, cosign=Cosign()).status == SIGNED
    proxy.inject(Fault("GET", r"\.sig$", garbage=True, times=None))
    unreadable = check_image(tag, key=None, store=client, cosign=Cosign())
    assert unreadable.status == UNKNOWN and "not JSON" in unreadable.detail
    # cosign's own signature manifest has a signature layer; a manifest under the signature tag
    # without one (the registry answers 200 on the tag) is not a signature.
    real = client.manifest(signature_tag(target))
    assert real is not None and [layer["mediaType"] for layer in real[0]["layers"]] == [SIMPLE_SIGNING]
    assert SIGNATURE_ANNOTATION in real[0]["layers"][0]["annotations"]
    proxy.inject()
    other = pinned(tag, _image(upstream, "ns/pytorch", "u"))
    put_manifest(upstream, "ns/pytorch", signature_tag(other).rsplit(":", 1)[1],
                 json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": _empty_config(upstream),
                             "layers": []}).encode(), OCI_MANIFEST)
    assert _tag_digest(upstream, "ns/pytorch", signature_tag(other).rsplit(":", 1)[1]) is not None
    faked = check_image(f"{proxy.address}/ns/pytorch:u", key=None, store=client, cosign=Cosign())
    assert faked.status == UNSIGNED and "is not signed" in faked.detail


def _empty_config(upstream: str) -> dict[str, Any]:
    return {**put_blob(upstream, "ns/pytorch", b"{}"), "mediaType": "application/vnd.oci.image.config.v1+json"}


@pytest.mark.parametrize("which, password, words", [
    ("locked", "wrong", ["--sign-key", "cannot sign"]),
    ("locked", "", ["--sign-key", "COSIGN_PASSWORD"]),
    ("pub", None, ["--sign-key", "cannot sign"]),
    ("garbled", None, ["--sign-key", "cannot sign"]),
], ids=["wrong password", "no password", "the .pub", "garbled"])
def test_the_dry_run_refuses_a_key_the_run_would_refuse(keys: dict[str, Path], tmp_path: Path, which: str,
                                                        password: str | None, words: list[str]) -> None:
    # Port 1: nothing listens; the key is refused before any registry is asked.
    done = imagebuilder(*PLAN, "--registry", "127.0.0.1:1/ns", "--sign-key", str(keys[which]),
                        "--report", str(tmp_path / "r.json"), timeout=120,
                        env_extra={"COSIGN_PASSWORD": password or ""})
    assert done.returncode == 2, done.stdout + done.stderr
    (error,) = error_lines(done.stderr)
    assert all(w in error for w in words), error
    assert "Traceback" not in done.stderr and done.stdout == "" and not (tmp_path / "r.json").exists()


# --------------------------------------------------------------------------- silence


@pytest.fixture
def silent() -> Iterator[str]:
    """A server that accepts connections and never answers: HOST:PORT."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for connection in held:
            connection.close()


def test_a_registry_that_never_answers_is_never_silence(silent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_retry, "HEARTBEAT_S", 0.5)
    lines: list[str] = []
    client = HttpRegistry(config={}, policy=RetryPolicy(timeout_s=1.5, first_wait_s=0.05), say=lines.append)
    with pytest.raises(RegistryTimeout) as stopped:
        client.digest(f"{silent}/ns/pytorch:x")
    assert "HEAD /v2/ns/pytorch/manifests/x within 1.5 s" in str(stopped.value)
    # The TLS probe of a loopback registry too: a line while it waits, naming it.
    assert any(line.startswith(f"GET https://{silent}/v2/: no answer yet") for line in lines), lines
    assert any(line.startswith(f"HEAD http://{silent}/v2/ns/pytorch/manifests/x: no answer yet") for line in lines)


@pytest.mark.registry
def test_cosign_reading_a_stalled_registry_says_so_and_stops_at_the_timeout(silent: str, keys: dict[str, Path],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("imagebuilder.trust.cosign.HEARTBEAT_S", 0.5)
    lines: list[str] = []
    cosign = Cosign(timeout=2, say=lines.append, timeout_option="--registry-timeout")
    target = f"{silent}/ns/pytorch@sha256:" + hashlib.sha256(b"x").hexdigest()
    started = time.monotonic()
    with pytest.raises(CosignTimedOut):
        cosign.verify(str(keys["pub"]), target)
    assert time.monotonic() - started < 5
    assert lines and all(line.startswith(f"cosign verify {target}: still running after ") for line in lines)
    assert lines[-1].endswith("(gives up at 2 s: --registry-timeout)")


# --------------------------------------------------------------------------- the report, part way


def test_the_report_records_each_images_last_state_when_ctrl_c_ends_the_run(tmp_path: Path) -> None:
    steps = plan(images(variant=None), {})
    report = tmp_path / "report.json"
    ledger = Ledger(report, "127.0.0.1:5999/ml", push=True, planned=steps)
    with pytest.raises(KeyboardInterrupt), ledger.kept():
        ledger.began("build", steps[0])
        ledger.record(Outcome(steps[0], PUSHED, "built", pushed={steps[0].image.ref: "sha256:a"}))
        written = json.loads(report.read_text())
        assert (written["state"], written["ok"], len(written["images"])) == ("running", False, 1)
        ledger.began("push", steps[1])
        raise KeyboardInterrupt
    document = json.loads(report.read_text())
    assert (document["ok"], document["state"], document["error"]) == (False, "ended", "interrupted (Ctrl-C)")
    statuses = [(i["ref"], i["status"]) for i in document["images"]]
    assert statuses == [(steps[0].image.ref, "pushed"), (steps[1].image.ref, "interrupted"),
                        *[(s.image.ref, "not run") for s in steps[2:]]]
    assert document["images"][1]["reason"] == "interrupted during push: interrupted (Ctrl-C)"
    assert document["images"][1]["pushed"] == {}  # nothing the registry did not confirm


# --------------------------------------------------------------------------- the daemon behind the proxy


@pytest.mark.docker
@pytest.mark.registry
def test_a_push_whose_blob_upload_fails_says_the_status_not_a_login(docker_engine: DockerEngine, base_image: str,
                                                                     image_repo: str, upstream: str,
                                                                     proxy: FaultProxy, tmp_path: Path) -> None:
    ref = f"{proxy.address}/{image_repo}:1"
    (tmp_path / "Dockerfile").write_text(f"FROM {base_image}\nRUN echo {image_repo} > /pushed\n")
    ClassicBuilder(docker_engine).build(BuildRequest(tmp_path, (ref,), {}))
    # Every blob upload's last request (the PUT that names the digest, or the PATCH before it) fails.
    proxy.inject(Fault("PUT", r"/blobs/uploads/", status=500, times=None),
                 Fault("PATCH", r"/blobs/uploads/", status=500, times=None))
    with pytest.raises(PushFailed) as failed:
        docker_engine.push_counted(ref, retries=1)
    line = str(failed.value)
    assert "500" in line and "_state" not in line and "logged in" not in line and "\n" not in line, line
    assert _tag_digest(upstream, image_repo, "1") is None  # nothing landed under the tag


@pytest.mark.docker
@pytest.mark.registry
def test_a_registry_that_cannot_deliver_what_it_advertises_is_exit_1(docker_engine: DockerEngine, upstream: str,
                                                                      proxy: FaultProxy, image_repo: str) -> None:
    _image(upstream, image_repo, "v")
    ref = f"{proxy.address}/{image_repo}:v"
    proxy.inject(Fault("GET", r"/blobs/sha256:", status=404, body=b'{"errors": [{"code": "BLOB_UNKNOWN"}]}',
                       times=None))
    done = imagebuilder("verify", ref, "--allow-no-gpu", timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    (error,) = error_lines(done.stderr)
    assert ref in error and "could not deliver it" in error and "Traceback" not in done.stderr
    assert proxy.asked("HEAD", r"/manifests/v$")  # the registry named a digest under the tag
    assert not docker_engine.image_exists(ref)


def test_a_wrong_request_found_during_the_run_writes_no_report(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    ledger = Ledger(report, "127.0.0.1:5999/ml", push=True, planned=plan(images(), {}))
    with pytest.raises(BadRequest), ledger.kept():
        raise BadRequest("--base-image says debian12, --os ubuntu22.04")  # (read through the daemon, in the plan)
    assert not report.exists() and list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- Ctrl-C while indexes are written and signed

NS = "interrupted"  # a namespace of their own: the module's registry holds other tests' images under ns/
MERGE = ("publish", "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--os", "debian12", "--variant", "runtime",
         "--platform", "linux/amd64,linux/arm64", "--merge-only")


def _merge_stand_ins(upstream: str, address: str) -> list[str]:
    """Each platform's tiny image under every tag of the runtime image `publish MERGE` merges, as
    the per-platform jobs would have pushed them; the tags (no repository)."""
    from support.published_images import BOTH, merge_images, platform_ref

    from imagebuilder.registry.reference import parse_reference

    refs = [ref for image in merge_images(f"{address}/{NS}") if image.spec.variant == "runtime" for ref in image.refs]
    for ref in refs:
        for platform in BOTH:
            _image(upstream, f"{NS}/pytorch", parse_reference(platform_ref(ref, platform)).reference,
                   architecture=platform.rpartition("/")[2])
    return [parse_reference(ref).reference for ref in refs]


def _interrupt_when(proxy: FaultProxy, method: str, pattern: str, argv: list[str],
                    launcher: tuple[str, ...] = ("-m", "imagebuilder"),
                    env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """Run `imagebuilder ARGV` (`python LAUNCHER ARGV`) in its own process group, send that group
    SIGINT once the proxy has held a `method` request on `pattern`; (exit status, stderr, seconds
    from SIGINT to exit). Afterwards no process of the group is left (cosign's included)."""
    process = subprocess.Popen([sys.executable, *launcher, *argv], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    deadline = time.monotonic() + 180
    while "stalled" not in proxy.asked(method, pattern) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert "stalled" in proxy.asked(method, pattern), f"never reached {method} {pattern}: {process.communicate()}"
    sent = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    took = time.monotonic() - sent
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # nothing of the run is left running
    return process.returncode, stderr, took


@pytest.mark.registry
def test_ctrl_c_while_an_index_is_written_exits_130_and_claims_no_index(upstream: str, proxy: FaultProxy,
                                                                         tmp_path: Path) -> None:
    tags = _merge_stand_ins(upstream, proxy.address)
    proxy.inject(Fault("PUT", r"/manifests/", stall_s=120, times=None))
    report = tmp_path / "report.json"
    code, stderr, took = _interrupt_when(proxy, "PUT", r"/manifests/",
                                         [*MERGE, "--registry", f"{proxy.address}/{NS}", "--report", str(report)])
    assert code == 130 and took < 10 and "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if "interrupted" in line] == ["interrupted"], stderr
    assert all(_tag_digest(upstream, f"{NS}/pytorch", tag) is None for tag in tags)  # no index under any tag
    document = json.loads(report.read_text())
    assert (document["ok"], document["state"]) == (False, "ended") and "interrupted" in document["error"]
    assert not [i for i in document["indexes"] if i.get("status") == "written"]
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


@pytest.mark.registry
def test_ctrl_c_while_an_index_is_signed_exits_130_and_leaves_no_signature(upstream: str, proxy: FaultProxy,
                                                                            keys: dict[str, Path], tmp_path: Path) -> None:
    tags = _merge_stand_ins(upstream, proxy.address)
    proxy.inject(Fault("PUT", r"/manifests/sha256-[0-9a-f]+\.sig$", stall_s=120, times=None))
    report = tmp_path / "report.json"
    code, stderr, took = _interrupt_when(proxy, "PUT", r"\.sig$",
                                         [*MERGE, "--registry", f"{proxy.address}/{NS}", "--sign-key", str(keys["key"]),
                                          "--report", str(report)])
    assert code == 130 and took < 10 and "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if "interrupted" in line] == ["interrupted"], stderr
    indexes = [digest for tag in tags if (digest := _tag_digest(upstream, f"{NS}/pytorch", tag)) is not None]
    assert indexes, "the run was interrupted while signing, so it had written an index"
    reader = HttpRegistry(config={})
    assert [d for d in indexes if reader.digest(signature_tag(f"{upstream}/{NS}/pytorch@{d}")) is not None] == []
    document = json.loads(report.read_text())
    assert (document["ok"], document["state"]) == (False, "ended") and "interrupted" in document["error"]


# --------------------------------------------------------------------------- Ctrl-C while the image is pushed

# `imagebuilder publish` as cli.main() runs it, but for two phases a torch image would take
# minutes for: the build is a small image FROM the tests' base image, made by the real classic
# builder under the image's tags, and verify is a passing report. The plan, the run, the push
# (the daemon's, through the fault proxy), the --report and Ctrl-C are the CLI's own.
SMALL_PUBLISH = """
import sys, tempfile
from pathlib import Path
from imagebuilder import cli
from imagebuilder.build.run import Built
from imagebuilder.engine.api import BuildRequest
from imagebuilder.engine.classic import ClassicBuilder
from imagebuilder.publish import run
from imagebuilder.verify.report import VerifyReport
from imagebuilder.verify.preflight import PASS, PreflightItem
from smoke_tests.result import Result

base = sys.argv.pop(1)

def small_build(image, engine, builder, registry, options, local, on_progress):
    with tempfile.TemporaryDirectory() as context:
        Path(context, "Dockerfile").write_text(f"FROM {base}\\nRUN echo {image.ref} > /published\\n")
        result = ClassicBuilder(engine).build(BuildRequest(Path(context), image.refs, {}))
    return Built(image, result, image.refs), None

def passed(engine, ref, **options):
    return VerifyReport(ref, "docker", (PreflightItem("image", PASS, "present locally"),), (Result("compile", PASS),))

run._build = small_build
run.verify_image = passed
cli.main()
"""
SMALL = ("publish", "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--os", "debian12", "--variant", "runtime",
         "--builder", "classic", "--allow-no-gpu")


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.parametrize("held", ["a blob upload", "the image manifest"])
def test_ctrl_c_while_the_image_is_pushed_exits_130_claims_nothing_and_the_rerun_completes(
        held: str, docker_engine: DockerEngine, base_image: str, image_repo: str, upstream: str, proxy: FaultProxy,
        empty_security_mirror: str,
        tmp_path: Path) -> None:
    method, pattern = ("PUT", r"/blobs/uploads/") if held == "a blob upload" else ("PUT", r"/pytorch/manifests/[^/]+$")
    proxy.inject(Fault(method, pattern, stall_s=120, times=None))
    client = docker_engine.client
    containers = {c.id for c in client.containers.list(all=True)}  # (the Docker lock: no other test's run)
    scratch = tmp_path / "tmp"  # the run's TMPDIR: whatever temp folder it makes is seen here
    scratch.mkdir()
    report = tmp_path / "report.json"
    # The base named, as its security fixes are read from it (from a local mirror without any: no network).
    argv = [base_image, *SMALL, "--base-image", base_image, "--registry", f"{proxy.address}/{image_repo}",
            "--report", str(report)]
    env = {**os.environ, "GITHUB_SHA": "0" * 40, "TMPDIR": str(scratch), "IMAGEBUILDER_SECURITY_MIRROR": empty_security_mirror}
    code, stderr, took = _interrupt_when(proxy, method, pattern, argv, ("-c", SMALL_PUBLISH), env)
    assert code == 130 and took < 10 and "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if "interrupted" in line] == ["interrupted"], stderr
    document = json.loads(report.read_text())
    assert (document["ok"], document["state"]) == (False, "ended") and "interrupted" in document["error"]
    (image,) = document["images"]
    assert (image["status"], image["pushed"]) == ("interrupted", {}), image
    assert image["reason"] == "interrupted during push: interrupted (Ctrl-C)", image
    tags = [ref.rsplit(":", 1)[1] for ref in document["planned"][0]["push"]]
    assert tags and all(_tag_digest(upstream, f"{image_repo}/pytorch", tag) is None for tag in tags)
    assert {c.id for c in client.containers.list(all=True)} <= containers  # the build's step containers removed
    # The image built stays under its tags, as after any publish, and nothing else of the run does.
    local = set(local_tags(image_repo))
    assert local and local <= set(document["planned"][0]["push"]), local
    assert list(scratch.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "tmp"]

    proxy.inject()  # the registry answers again: the rerun pushes what the interrupted run did not
    rerun = subprocess.run([sys.executable, "-c", SMALL_PUBLISH, *argv], cwd=REPO_ROOT, env=env, text=True,
                           capture_output=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    document = json.loads(report.read_text())
    assert document["ok"] is True and [i["status"] for i in document["images"]] == ["pushed"], document["images"]
    assert all(_tag_digest(upstream, f"{image_repo}/pytorch", tag) == document["images"][0]["pushed"][ref]
               for ref, tag in zip(document["planned"][0]["push"], tags))
    assert list(scratch.iterdir()) == []
