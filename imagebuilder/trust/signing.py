"""Signed, attested images: publish's side (sign_image(), through cosign.py), and what it shares
with the check (signature_check.py): key references, the SBOM's bytes, REPOSITORY@DIGEST and the
tags cosign writes.

sign_image(): once publish has verified and pushed an image, attach its SBOM (the CycloneDX
document the image carries at /opt/imagebuilder/sbom.cdx.json) as a signed attestation, then
sign the digest. In that order, so a signature marks a finished job: an image with an
attestation and no signature (signing failed half way) counts as unsigned, and the next
publish rebuilds and signs it. Only a digest is ever signed, never a tag.

BuildKit's provenance stays where BuildKit put it (an attestation manifest in the image index);
cosign's signature and attestation go beside it, under the sha256-HEX.sig and .att tags.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import BadRequest
from .cosign import Cosign, SigningError

KEY_SCHEMES = ("env://", "awskms://", "gcpkms://", "azurekms://", "hashivault://", "k8s://", "pkcs11:")
"""Key references cosign resolves itself; anything else is a key file."""
ATTESTATION_MANIFEST = "attestation-manifest"
"""BuildKit's provenance: an index entry whose vnd.docker.reference.type says so."""
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
"""The media type of a cosign signature layer (its payload names the signed digest)."""
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"


class KeyNotFound(BadRequest):
    template = ("{option} {key}: no such file; give a cosign key file, env://VAR or a KMS URI "
                "(awskms://, gcpkms://, azurekms://, hashivault://, k8s://)")


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


def signature_tag(target: str, suffix: str = "sig") -> str:
    """Where cosign keeps REPO@sha256:HEX's signature (.sig) or attestations (.att): the tag
    sha256-HEX.SUFFIX of the image's repository, or of $COSIGN_REPOSITORY when that is set."""
    repository, _, digest = target.partition("@")
    if not digest.startswith("sha256:"):
        raise ValueError(f"not a digest reference: {target}")
    return f"{os.environ.get('COSIGN_REPOSITORY') or repository}:sha256-{digest.removeprefix('sha256:')}.{suffix}"


class Manifests(Protocol):
    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None: ...


def has_signature(store: Manifests, target: str) -> bool:
    """Whether cosign's signature tag of `target` (REPOSITORY@DIGEST) holds a signature manifest
    with at least one signature layer: an answer under the tag is not enough (a proxy's page, an
    emptied manifest). An answer that cannot be read raises the registry's error, a fault said as
    one, never "not signed" nor "signed"."""
    found = store.manifest(signature_tag(target))
    if found is None:
        return False
    layers = found[0].get("layers")
    return isinstance(layers, list) and any(
        isinstance(layer, dict) and layer.get("mediaType") == SIMPLE_SIGNING
        and SIGNATURE_ANNOTATION in (layer.get("annotations") or {}) for layer in layers)


# --------------------------------------------------------------------------- publish's side


@dataclass(frozen=True)
class Signed:
    digest: str
    signature: str
    """The tag holding the signature."""
    attestation: str
    """The tag holding the attestations (the SBOM; a project image's provenance too)."""

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

    def sign(self, target: str, sbom: bytes | None, provenance: bytes | None = None) -> Signed:
        return sign_image(self.cosign, self.key, target, sbom, provenance)


def key_signer(key: str, option: str = "--sign-key", *, try_key: bool = False) -> KeySigner:
    """The signer for a --sign-key value: the key exists (or is a URI) and cosign is installed;
    with `try_key`, cosign has read the key (publish: before any build)."""
    signer = KeySigner(key_reference(key, option), Cosign().require())
    if try_key:
        signer.cosign.try_key(signer.key, option)
    return signer


def sign_image(cosign: Cosign, key: str, target: str, sbom: bytes | None, provenance: bytes | None = None) -> Signed:
    """Attest `target`'s SBOM (and SLSA v1 `provenance`, where given), then sign `target`
    (REPOSITORY@DIGEST): the signature last, so that it exists only when all are done."""
    if sbom is not None:
        cosign.attest_sbom(key, target, sbom)
    if provenance is not None:
        cosign.attest(key, target, "slsaprovenance1", provenance)
    cosign.sign(key, target)
    attested = sbom is not None or provenance is not None
    return Signed(target.partition("@")[2], signature_tag(target), signature_tag(target, "att") if attested else "")
