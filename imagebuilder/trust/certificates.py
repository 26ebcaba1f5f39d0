"""Reading a CA file a user gives (--ca-bundle, --registry-ca): its bytes, refused unless
OpenSSL reads PEM certificates in it."""

from __future__ import annotations

import ssl
from pathlib import Path

from ..errors import BadRequest


class CertificateError(BadRequest):
    """A CA file (--ca-bundle, --registry-ca) that cannot be read, or holds no certificate OpenSSL reads."""


PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


def read_certificates(path: Path, option: str, advice: str) -> bytes:
    """The bytes of a CA file (--ca-bundle, --registry-ca), refused (exit 2) unless OpenSSL reads
    PEM certificates in it: an empty or wrong file, or BEGIN/END lines around anything else, would
    otherwise surface later as a TLS failure (minutes into a build, or as a registry "not answering")."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CertificateError(f"cannot read {option} {path}: {e.strerror}; {advice}") from e
    if PEM_CERTIFICATE not in data:
        raise CertificateError(f"{option} {path} holds no PEM certificate ({PEM_CERTIFICATE.decode()} ...); {advice}")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii", "replace"))
    except ssl.SSLError as e:
        raise CertificateError(f"{option} {path} holds a PEM block that is not a certificate OpenSSL can read "
                          f"({e.reason or e.strerror or e}); {advice}") from e
    return data


def read_ca_bundle(path: Path) -> bytes:
    return read_certificates(path, "--ca-bundle", "pass the proxy's CA bundle, e.g. $SSL_CERT_FILE")
