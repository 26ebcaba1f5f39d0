"""Signed, attested images: the one module that runs cosign.

- sign_image(): once publish has verified and pushed an image, attach its SBOM (the CycloneDX
  document the image carries at /opt/imagebuilder/sbom.cdx.json) as a signed attestation, then
  sign the digest. In that order, so a signature marks a finished job: an image with an
  attestation and no signature (signing failed half way) counts as unsigned, and the next
  publish rebuilds and signs it. Only a digest is ever signed, never a tag.
- check_image(): is the digest a tag names signed by a key, and does its SBOM attestation verify
  with that key and match the image's own SBOM (its sbom.digest label, labels.SBOM_DIGEST, in the
  config the signature covers)? Read from the registry only: no container starts. A failure
  says in one line which it is: not signed, re-tagged (the tag names an unsigned build while
  a signed build of the same inputs is in the repository), signed by another key, no SBOM
  attestation, or an SBOM that is not the image's.

Offline by design: no transparency log (`--tlog-upload=false` / `--insecure-ignore-tlog`); the
key is the root of trust, as on a cluster that cannot reach the public log. Keys as cosign
takes them: a file (cosign.key to sign, cosign.pub to check), env://VAR, or a KMS URI; an
encrypted key's password comes from COSIGN_PASSWORD, as for cosign itself. BuildKit's
provenance stays where BuildKit put it (an attestation manifest in the image index); cosign's
signature and attestation go beside it, under the sha256-HEX.sig and .att tags.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .errors import BadRequest, ImageBuilderError
from .labels import INPUTS_HASH, SBOM_DIGEST
from .reference import parse_reference
from .manifests import INDEXES, pick_manifest
from .registry import RegistryError
from .registry_auth import is_insecure_by_default

COSIGN_TIMEOUT = 300.0
"""Seconds one cosign command may take (a KMS round trip, a slow registry)."""
KEY_SCHEMES = ("env://", "awskms://", "gcpkms://", "azurekms://", "hashivault://", "k8s://", "pkcs11:")
"""Key references cosign resolves itself; anything else is a key file."""
CYCLONEDX = "https://cyclonedx.org/bom"
"""The predicate type of `cosign attest --type cyclonedx`."""
ATTESTATION_MANIFEST = "attestation-manifest"
"""BuildKit's provenance: an index entry whose vnd.docker.reference.type says so."""

# check_image() statuses
VERIFIED, SIGNED, UNSIGNED, RETAGGED, OTHER_KEY, NO_ATTESTATION, SBOM_MISMATCH, NOT_PUBLISHED, NOT_CHECKED = (
    "verified", "signed", "unsigned", "re-tagged", "other key", "no attestation", "sbom mismatch",
    "not published", "not checked")
UNKNOWN = "unknown"


class SigningError(ImageBuilderError):
    """cosign could not sign or check an image."""


class KeyNotFound(BadRequest):
    template = ("{option} {key}: no such file; give a cosign key file, env://VAR or a KMS URI "
                "(awskms://, gcpkms://, azurekms://, hashivault://, k8s://)")


class KeyUnusable(BadRequest):
    template = "{option} {key} cannot sign: {detail}{hint}"


class CosignMissing(SigningError):
    template = ("cosign is not installed ({binary}: not found): install cosign >= 2.5 "
                "(Debian: apt-get install cosign; .ci/cosign-install.sh does it on Debian 12 too)")


class CosignFailed(SigningError):
    template = "cosign {action} {target} failed: {detail}{hint}"


class CosignTimedOut(SigningError):
    template = ("cosign {action} {target} did not finish within {timeout:.0f}s: "
                "is the registry (or the key's KMS) reachable?")


class SbomNotTheImages(SigningError):
    template = ("{target}: its SBOM ({path}) is {found}, but the image's {label} label says {labelled}: "
                "rebuild the image (--force)")


def key_reference(text: str, option: str) -> str:
    """A --sign-key / --key value as cosign takes it; a key file must exist (exit 2 if not)."""
    if text.startswith(KEY_SCHEMES):
        return text
    if not Path(text).is_file():
        raise KeyNotFound(option=option, key=text)
    return str(Path(text).resolve())


def sbom_bytes(document: Any) -> bytes:
    """The SBOM as the image's sbom.py writes it (sorted keys, indent 1, a final newline), so
    that an attested document hashes to the image's sbom.digest label (labels.SBOM_DIGEST)."""
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def sbom_digest(document: Any) -> str:
    return "sha256:" + hashlib.sha256(sbom_bytes(document)).hexdigest()


def torch_of(document: Mapping[str, Any]) -> str | None:
    """The torch version an SBOM lists (None: none)."""
    for component in document.get("components") or []:
        if component.get("name") == "torch" and str(component.get("purl", "")).startswith("pkg:pypi/"):
            return str(component.get("version"))
    return None


def repository_of(ref: str) -> str:
    r = parse_reference(ref)
    return f"{r.host}/{r.repository}"


def pinned(ref: str, digest: str) -> str:
    """REPOSITORY@DIGEST: what cosign signs and checks (never a tag)."""
    return f"{repository_of(ref)}@{digest}"


def signature_tag(target: str, suffix: str = "sig") -> str:
    """Where cosign keeps REPO@sha256:HEX's signature (.sig) or attestations (.att): the tag
    sha256-HEX.SUFFIX of the image's repository, or of $COSIGN_REPOSITORY when that is set."""
    repository, _, digest = target.partition("@")
    if not digest.startswith("sha256:"):
        raise ValueError(f"not a digest reference: {target}")
    return f"{os.environ.get('COSIGN_REPOSITORY') or repository}:sha256-{digest.removeprefix('sha256:')}.{suffix}"


# --------------------------------------------------------------------------- cosign


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
            done = subprocess.run(command, capture_output=True, text=True, errors="replace",
                                  timeout=self.timeout, stdin=subprocess.DEVNULL, check=False)
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
            done = subprocess.run([self.binary, "public-key", "--key", key], capture_output=True, text=True,
                                  errors="replace", timeout=self.timeout, stdin=subprocess.DEVNULL, check=False)
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

    # -- the four commands imagebuilder uses

    def sign(self, key: str, target: str) -> None:
        self.run("sign", target, ["--key", key, "--tlog-upload=false", "--yes"])

    def attest_sbom(self, key: str, target: str, sbom: bytes) -> None:
        with tempfile.TemporaryDirectory(prefix="imagebuilder-sbom-") as tmp:
            predicate = Path(tmp) / "sbom.cdx.json"
            predicate.write_bytes(sbom)
            self.run("attest", target, ["--key", key, "--type", "cyclonedx", "--predicate", str(predicate),
                                        "--tlog-upload=false", "--yes"])

    def verify(self, key: str, target: str) -> list[dict[str, Any]]:
        """The verified signatures' payloads (cosign exits non-zero when none verifies)."""
        out = self.run("verify", target, ["--key", key, "--insecure-ignore-tlog=true", "--output", "json"])
        return list(json.loads(out or "[]"))

    def verified_sbom(self, key: str, target: str) -> dict[str, Any]:
        """The CycloneDX document of `target`'s attestation that verifies with `key`."""
        out = self.run("verify-attestation", target, ["--key", key, "--type", "cyclonedx",
                                                      "--insecure-ignore-tlog=true"])
        digest = target.partition("@")[2].removeprefix("sha256:")
        for line in out.splitlines():
            if not line.strip():
                continue
            statement = json.loads(base64.b64decode(json.loads(line)["payload"]))
            subjects = {s.get("digest", {}).get("sha256") for s in statement.get("subject") or []}
            if statement.get("predicateType") == CYCLONEDX and digest in subjects:
                return dict(statement["predicate"])
        raise CosignFailed(action="verify-attestation", target=target, hint="",
                           detail="no CycloneDX statement about this digest among the verified attestations")


# --------------------------------------------------------------------------- publish's side


@dataclass(frozen=True)
class Signed:
    digest: str
    signature: str
    """The tag holding the signature."""
    attestation: str
    """The tag holding the SBOM attestation."""

    def to_json(self) -> dict[str, str]:
        return {"digest": self.digest, "signature": self.signature, "attestation": self.attestation}


class Signer(Protocol):
    """What publish signs with: one call per pushed digest."""

    def sign(self, target: str, sbom: bytes | None) -> Signed:
        """Sign REPOSITORY@DIGEST, with `sbom` attested (None: an index over platform images,
        whose SBOMs are its images' own)."""


@dataclass(frozen=True)
class KeySigner:
    """Signs with a cosign key (a file, env://VAR or a KMS URI)."""

    key: str
    cosign: Cosign = Cosign()

    def sign(self, target: str, sbom: bytes | None) -> Signed:
        return sign_image(self.cosign, self.key, target, sbom)


def key_signer(key: str, option: str = "--sign-key", *, try_key: bool = False) -> KeySigner:
    """The signer for a --sign-key value: the key exists (or is a URI) and cosign is installed;
    with `try_key`, cosign has read the key (publish: before any build)."""
    signer = KeySigner(key_reference(key, option), Cosign().require())
    if try_key:
        signer.cosign.try_key(signer.key, option)
    return signer


def sign_image(cosign: Cosign, key: str, target: str, sbom: bytes | None) -> Signed:
    """Attest `target`'s SBOM, then sign `target` (REPOSITORY@DIGEST): the signature last, so
    that it exists only when both are done."""
    if sbom is not None:
        cosign.attest_sbom(key, target, sbom)
    cosign.sign(key, target)
    return Signed(target.partition("@")[2], signature_tag(target), signature_tag(target, "att") if sbom else "")


# --------------------------------------------------------------------------- verify's side


class Store(Protocol):
    """The registry reads check_image() needs (http_registry.HttpRegistry)."""

    def digest(self, ref: str) -> str | None: ...

    def labels(self, ref: str) -> dict[str, str] | None: ...

    def tags(self, ref: str) -> list[str]: ...

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None: ...


@dataclass(frozen=True)
class SignatureCheck:
    ref: str
    """The tag asked about."""
    status: str
    detail: str
    """The one line that says it."""
    digest: str | None = None
    """The digest the tag names in the registry."""
    key: str | None = None
    """The key checked against; None: only whether a signature exists was asked."""
    signed_digest: str | None = None
    """RETAGGED: the signed build of the same inputs."""
    sbom_digest: str | None = None
    torch: str | None = None
    """The torch version the attested SBOM lists."""
    provenance: bool | None = None
    """BuildKit provenance beside the image in its index; None: not looked at."""

    @property
    def ok(self) -> bool:
        """With a key: signed by it, with a matching SBOM attestation. Without: always (it informs)."""
        return self.key is None or self.status == VERIFIED

    @property
    def pinned(self) -> str | None:
        return pinned(self.ref, self.digest) if self.digest else None

    def line(self) -> str:
        return f"signature: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "status": self.status, "detail": self.detail, "ref": self.ref,
                "digest": self.digest, "key": self.key, "signed_digest": self.signed_digest,
                "sbom_digest": self.sbom_digest, "torch": self.torch, "provenance": self.provenance}


def names_a_registry(ref: str) -> bool:
    """`ref` starts with a registry host (ghcr.io/..., 127.0.0.1:5000/...), as a published
    image's reference does; `pytorch:2.6-runtime` names a local image."""
    first, sep, _ = ref.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def has_provenance(manifest: tuple[dict[str, Any], str] | None) -> bool | None:
    if manifest is None:
        return None
    if not _is_index(manifest):
        return False
    return any((entry.get("annotations") or {}).get("vnd.docker.reference.type") == ATTESTATION_MANIFEST
               for entry in manifest[0].get("manifests") or [])


def check_image(ref: str, *, key: str | None, store: Store, cosign: Cosign) -> SignatureCheck:
    """Is the image `ref` names in its registry signed (by `key`, with a matching SBOM attestation)?
    Without a key it only informs: a registry that does not answer makes it UNKNOWN, not an error."""
    if key is not None:
        return _check(ref, key, store, cosign)
    if not names_a_registry(ref):
        return SignatureCheck(ref, NOT_CHECKED, f"not checked: {ref} names no registry (HOST/REPOSITORY:TAG)")
    try:
        return _check(ref, key, store, cosign)
    except RegistryError as e:
        return SignatureCheck(ref, UNKNOWN, f"unknown: {e}")


def _check(ref: str, key: str | None, store: Store, cosign: Cosign) -> SignatureCheck:
    reference = parse_reference(ref).reference
    digest = reference if reference.startswith("sha256:") else store.digest(ref)
    if digest is None:
        return SignatureCheck(ref, NOT_PUBLISHED, f"not published: the registry has no {ref}", key=key)
    target = pinned(ref, digest)
    manifest = store.manifest(target)
    provenance = has_provenance(manifest)
    signed = store.digest(signature_tag(target)) is not None
    found = SignatureCheck(ref, SIGNED if signed else UNSIGNED, "", digest, key, provenance=provenance)

    def judged(status: str, detail: str, **more: Any) -> SignatureCheck:
        return SignatureCheck(**{**found.__dict__, "status": status, "detail": detail, **more})

    if key is None:
        return judged(found.status, f"{ref} ({digest}) is signed (not checked: give --key PUB)" if signed
                      else f"{ref} ({digest}) is not signed")
    if not signed:
        other = _signed_build_of_same_inputs(target, key, store, cosign)
        if other is not None:
            return judged(RETAGGED, f"re-tagged: {ref} names {digest}, an unsigned build; the build of the same "
                                    f"inputs signed by {key} is {other}", signed_digest=other)
        return judged(UNSIGNED, f"not signed: {ref} names {digest}, which has no signature")
    try:
        cosign.verify(key, target)
    except CosignFailed as e:
        return judged(OTHER_KEY, f"signed by another key: {ref} ({digest}) has a signature, but none verifies "
                                 f"with {key} ({e.fields['detail']})")
    try:
        sbom, labels = _attested_sbom(target, manifest, key, store, cosign)
    except CosignFailed as e:
        return judged(NO_ATTESTATION, f"no SBOM attestation: {ref} ({digest}) is signed by {key}, but has no "
                                      f"CycloneDX attestation that verifies with it ({e.fields['detail']})")
    attested, labelled = sbom_digest(sbom), labels.get(SBOM_DIGEST)
    if attested != labelled:
        return judged(SBOM_MISMATCH, f"SBOM mismatch: {ref} ({digest}) is signed by {key}, but its attested SBOM "
                                     f"is {attested} and the image's own ({SBOM_DIGEST}) is {labelled or 'unlabelled'}",
                      sbom_digest=attested)
    torch = torch_of(sbom)
    return judged(VERIFIED, f"{ref} ({digest}) is signed by {key}; its SBOM attestation verifies and is the "
                            f"image's own SBOM (torch {torch or 'not listed'})", sbom_digest=attested, torch=torch)


def _attested_sbom(target: str, manifest: tuple[dict[str, Any], str] | None, key: str, store: Store,
                   cosign: Cosign) -> tuple[dict[str, Any], dict[str, str]]:
    """The verified SBOM attestation and the labels of the image it describes: `target`'s own,
    or, for an index over platform images (`publish --platform`), its linux/amd64 image's."""
    try:
        return cosign.verified_sbom(key, target), store.labels(target) or {}
    except CosignFailed:
        if manifest is None or not _is_index(manifest):
            raise
        child = pinned(target, pick_manifest(manifest[0]))
        return cosign.verified_sbom(key, child), store.labels(child) or {}


def _is_index(manifest: tuple[dict[str, Any], str]) -> bool:
    document, media_type = manifest
    return media_type in INDEXES or document.get("mediaType") in INDEXES


SIGNATURE_TAG = re.compile(r"sha256-([0-9a-f]{64})\.sig")


def _signed_build_of_same_inputs(target: str, key: str, store: Store, cosign: Cosign) -> str | None:
    """Another digest of the repository with the same inputs-hash label, signed by `key`: the
    tag was moved from it to an unsigned build of the same image."""
    inputs = (store.labels(target) or {}).get(INPUTS_HASH)
    if not inputs:
        return None
    own = target.partition("@")[2]
    for tag in store.tags(signature_tag(target).rsplit(":", 1)[0]):
        match = SIGNATURE_TAG.fullmatch(tag)
        if match is None or f"sha256:{match.group(1)}" == own:
            continue
        candidate = pinned(target, f"sha256:{match.group(1)}")
        if (store.labels(candidate) or {}).get(INPUTS_HASH) != inputs:
            continue
        try:
            cosign.verify(key, candidate)
        except CosignFailed:
            continue
        return candidate.partition("@")[2]
    return None
