"""cosign, the one program imagebuilder signs and checks with (Cosign): each command under a
timeout, never a prompt, a failure said in one line with what to do.

Offline by design: no transparency log (`--tlog-upload=false` / `--insecure-ignore-tlog`); the
key is the root of trust, as on a cluster that cannot reach the public log. Keys as cosign
takes them: a file (cosign.key to sign, cosign.pub to check), env://VAR, or a KMS URI; an
encrypted key's password comes from COSIGN_PASSWORD, as for cosign itself.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadRequest, ImageBuilderError
from ..registry.auth import is_insecure_by_default
from ..registry.reference import parse_reference
from ..registry.retry import HEARTBEAT_S

COSIGN_TIMEOUT = 300.0
"""Seconds one cosign command may take (a KMS round trip, a slow registry)."""
CYCLONEDX = "https://cyclonedx.org/bom"
"""The predicate type of `cosign attest --type cyclonedx`."""


class SigningError(ImageBuilderError):
    """cosign could not sign or check an image."""


class KeyUnusable(BadRequest):
    template = "{option} {key} cannot sign: {detail}{hint}"


class PublicKeyUnusable(BadRequest):
    template = "{option} {key} is not a public key cosign can read: {detail}; give the .pub of the signing key"


class CosignMissing(SigningError):
    template = ("cosign is not installed ({binary}: not found): install cosign >= 2.5 "
                "(Debian: apt-get install cosign; .ci/cosign-install.sh does it on Debian 12 too)")


class CosignFailed(SigningError):
    template = "cosign {action} {target} failed: {detail}{hint}"


class CosignTimedOut(SigningError):
    template = ("cosign {action} {target} did not finish within {timeout:.0f}s: "
                "is the registry (or the key's KMS) reachable?")


def _last_error(stderr: str) -> str:
    """cosign's own error line, without its `Error: ` and the transparency-log warning."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("Error: ") for line in lines if line.startswith("Error: ")]
    if errors:
        return errors[-1]
    meaningful = [line for line in lines if not line.startswith("WARNING")]
    return (meaningful or lines or ["no output"])[-1][:500]


def _hint(detail: str) -> str:
    if "reading key" in detail and ("ioctl" in detail or "password" in detail or "decrypt" in detail):
        return "; the key is encrypted: give its password in COSIGN_PASSWORD"
    if "no such file" in detail and "reading key" in detail:
        return "; give the key file's path, env://VAR or a KMS URI"
    return ""


@dataclass(frozen=True)
class Cosign:
    """cosign on PATH (or `binary`), each command under `timeout` seconds, never a prompt."""

    binary: str = "cosign"
    timeout: float = COSIGN_TIMEOUT
    say: Callable[[str], None] | None = None
    """Told every HEARTBEAT_S while a command runs; None: nothing is said."""
    timeout_option: str = ""
    """The option that set `timeout`, for the lines that name it (verify: --registry-timeout)."""

    def require(self) -> Cosign:
        """Fail now, before an hour of building, when there is no cosign to sign with."""
        if shutil.which(self.binary) is None:
            raise CosignMissing(binary=self.binary)
        return self

    def run(self, action: str, target: str, args: Sequence[str]) -> str:
        if "@sha256:" not in target:
            raise ValueError(f"cosign {action} takes a digest, not a tag: {target}")
        host = parse_reference(target).host
        # A loopback registry without TLS, as dockerd allows it; every other one is https.
        insecure = ["--allow-http-registry", "--allow-insecure-registry"] if is_insecure_by_default(host) else []
        command = [self.binary, action, *args, *insecure, target]
        try:
            done = self._bounded(command, f"cosign {action} {target}")
        except FileNotFoundError as e:
            raise CosignMissing(binary=self.binary) from e
        except subprocess.TimeoutExpired as e:
            raise CosignTimedOut(action=action, target=target, timeout=self.timeout) from e
        if done.returncode != 0:
            detail = _last_error(done.stderr)
            raise CosignFailed(action=action, target=target, detail=detail, hint=_hint(detail),
                               exit_code_cosign=done.returncode)
        return done.stdout

    def try_key(self, key: str, option: str) -> None:
        """Read the private key as signing would (its password, its KMS), and sign nothing:
        a wrong key or COSIGN_PASSWORD fails here, not after hours of building and pushing."""
        try:
            done = self._bounded([self.binary, "public-key", "--key", key], f"cosign public-key --key {key}")
        except FileNotFoundError as e:
            raise CosignMissing(binary=self.binary) from e
        except subprocess.TimeoutExpired as e:
            raise CosignTimedOut(action="public-key", target=key, timeout=self.timeout) from e
        if done.returncode != 0:
            detail = _last_error(done.stderr)
            asked = any(word in detail for word in ("ioctl", "decrypt", "password"))
            hint = ("; give the private key (not the .pub) and its password in COSIGN_PASSWORD" if asked
                    else _hint(detail))
            raise KeyUnusable(option=option, key=key, detail=detail, hint=hint)

    def try_public_key(self, key: str, option: str) -> None:
        """Read the public key as verifying would, offline: a check of a made-up signature of an
        empty blob, which fails on the signature where cosign could read the key."""
        with tempfile.TemporaryDirectory(prefix="imagebuilder-key-") as folder:
            blob, signature = Path(folder) / "blob", Path(folder) / "signature"
            blob.write_bytes(b"")
            signature.write_text(base64.b64encode(b"\0" * 64).decode())
            try:
                done = self._bounded([self.binary, "verify-blob", "--key", key, "--signature", str(signature),
                                      "--insecure-ignore-tlog=true", str(blob)], f"cosign verify-blob --key {key}")
            except FileNotFoundError as e:
                raise CosignMissing(binary=self.binary) from e
            except subprocess.TimeoutExpired as e:
                raise CosignTimedOut(action="verify-blob", target=key, timeout=self.timeout) from e
        detail = _last_error(done.stderr)
        if done.returncode != 0 and "public key" in detail:
            raise PublicKeyUnusable(option=option, key=key, detail=detail)

    def _bounded(self, command: Sequence[str], what: str) -> subprocess.CompletedProcess[str]:
        """Run `command` without a prompt, saying every HEARTBEAT_S that it still runs (a stalled
        registry is never silence); TimeoutExpired past `timeout`; killed on Ctrl-C too."""
        process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   errors="replace", stdin=subprocess.DEVNULL)
        started = time.monotonic()
        try:
            while True:
                left = self.timeout - (time.monotonic() - started)
                try:
                    out, err = process.communicate(timeout=max(0.01, min(HEARTBEAT_S, left)))
                    return subprocess.CompletedProcess(list(command), process.returncode, out, err)
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed >= self.timeout:
                        raise
                    if self.say is not None:
                        self.say(f"{what}: still running after {elapsed:.0f} s (gives up at {self.timeout:g} s"
                                 f"{self.timeout_option and ': ' + self.timeout_option})")
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()

    # -- the commands imagebuilder uses

    def sign(self, key: str, target: str) -> None:
        self.run("sign", target, ["--key", key, "--tlog-upload=false", "--yes"])

    def attest_sbom(self, key: str, target: str, sbom: bytes) -> None:
        self.attest(key, target, "cyclonedx", sbom)

    def attest(self, key: str, target: str, kind: str, predicate: bytes) -> None:
        """Attach `predicate` to `target` as a signed in-toto statement of cosign's `--type` `kind`
        (cyclonedx: CYCLONEDX; slsaprovenance1: provenance.SLSA_V1)."""
        with tempfile.TemporaryDirectory(prefix="imagebuilder-attest-") as tmp:
            path = Path(tmp) / "predicate.json"
            path.write_bytes(predicate)
            self.run("attest", target, ["--key", key, "--type", kind, "--predicate", str(path),
                                        "--tlog-upload=false", "--yes"])

    def verify(self, key: str, target: str) -> list[dict[str, Any]]:
        """The verified signatures' payloads (cosign exits non-zero when none verifies)."""
        out = self.run("verify", target, ["--key", key, "--insecure-ignore-tlog=true", "--output", "json"])
        return list(json.loads(out or "[]"))

    def verified_sbom(self, key: str, target: str) -> dict[str, Any]:
        """The CycloneDX document of `target`'s attestation that verifies with `key`."""
        return self.verified_predicate(key, target, "cyclonedx", CYCLONEDX)

    def verified_predicate(self, key: str, target: str, kind: str, predicate_type: str) -> dict[str, Any]:
        """The predicate of `target`'s attestation of cosign's `--type` `kind` (`predicate_type`)
        that verifies with `key`."""
        out = self.run("verify-attestation", target, ["--key", key, "--type", kind, "--insecure-ignore-tlog=true"])
        digest = target.partition("@")[2].removeprefix("sha256:")
        for line in out.splitlines():
            if not line.strip():
                continue
            statement = json.loads(base64.b64decode(json.loads(line)["payload"]))
            subjects = {s.get("digest", {}).get("sha256") for s in statement.get("subject") or []}
            if statement.get("predicateType") == predicate_type and digest in subjects:
                return dict(statement["predicate"])
        raise CosignFailed(action="verify-attestation", target=target, hint="",
                           detail=f"no {predicate_type} statement about this digest among the verified attestations")
