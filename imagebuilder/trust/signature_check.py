"""check_image(): is the digest a tag names signed by a key, and does its SBOM attestation verify
with that key and match the image's own SBOM (its sbom.digest label, labels.SBOM_DIGEST, in the
config the signature covers)? Read from the registry only: no container starts. A failure
says in one line which it is: not signed, re-tagged (the tag names an unsigned build while
a signed build of the same inputs is in the repository), signed by another key, no SBOM
attestation, or an SBOM that is not the image's. verify's side of signing.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from ..registry.api import RegistryError
from ..registry.manifests import INDEXES, pick_manifest
from ..registry.reference import parse_reference, pinned
from .cosign import Cosign, CosignFailed
from .labels import INPUTS_HASH, SBOM_DIGEST
from .signing import ATTESTATION_MANIFEST, has_signature, sbom_digest, signature_tag, torch_of

# check_image() statuses
VERIFIED, SIGNED, UNSIGNED, RETAGGED, OTHER_KEY, NO_ATTESTATION, SBOM_MISMATCH, NOT_PUBLISHED, NOT_CHECKED = (
    "verified", "signed", "unsigned", "re-tagged", "other key", "no attestation", "sbom mismatch",
    "not published", "not checked")
UNKNOWN = "unknown"


class Store(Protocol):
    """The registry reads check_image() needs (registry.client.HttpRegistry)."""

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
    signed = has_signature(store, target)
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
