"""A registry's TLS and credentials as dockerd and docker take them: loopback registries are
insecure by default, /etc/docker/certs.d/HOST/ca.crt is trusted, and the credentials are those
docker-py's `docker.auth` reads from ~/.docker/config.json and its credential helpers
(`credsStore`, `credHelpers`): the one `docker` import outside engine/."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..engine.docker_config import unreadable_auths, without_unreadable_auths
from .api import RegistryError
from .reference import DOCKER_HUB, DOCKER_HUB_API

DOCKER_HUB_AUTH_KEY = "https://index.docker.io/v1/"


def _hostname(host: str) -> str:
    """The name or address of HOST[:PORT], IPv6 in brackets included."""
    if host.startswith("["):
        return host[1:host.index("]")]
    return host.split(":")[0] if host.count(":") == 1 else host


def is_insecure_by_default(host: str) -> bool:
    """Loopback registries, which dockerd talks to over http when they do not speak https."""
    name = _hostname(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def daemon_ca(host: str, certs_root: Path = Path("/etc/docker/certs.d")) -> Path | None:
    """The CA dockerd trusts for `host` (/etc/docker/certs.d/HOST[:PORT]/ca.crt), if any."""
    ca = certs_root / host / "ca.crt"
    return ca if ca.is_file() else None


class RegistryTlsError(RegistryError):
    template = ("the registry at {url} presents a certificate this machine does not trust ({detail}); pass "
                "--registry-ca PATH, or install its CA as /etc/docker/certs.d/{host}/ca.crt as dockerd expects")


class CredentialsUnavailable(RegistryError):
    template = ("could not read the credentials docker stores for {host} ({detail}); check the credential "
                "helper named in your docker config (`credsStore`/`credHelpers`), or `docker login {host}` again")


def credentials_for(config: Mapping[str, Any], host: str) -> tuple[str, str] | None:
    """The (user, password) docker uses for `host`: the config's `auths`, or its credential
    helper (`credsStore`, `credHelpers`), resolved by docker-py exactly as docker does."""
    import docker.auth
    import docker.errors

    if host in (DOCKER_HUB, DOCKER_HUB_API):
        host = docker.auth.INDEX_NAME
    if host in unreadable_auths(config):  # another registry's unreadable entry is no matter (docker_config.py)
        raise CredentialsUnavailable(host=host, detail=f"its `auth` in {docker_config_path()} is not base64 of "
                                                       "user:password")
    try:
        found = docker.auth.load_config(config_dict=without_unreadable_auths(config)).resolve_authconfig(host)
    except docker.errors.DockerException as e:
        raise CredentialsUnavailable(host=host, detail=str(e)) from e
    if not found:
        return None
    user, password = found.get("username") or found.get("Username"), found.get("password") or found.get("Password")
    return (str(user), str(password)) if user and password else None


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="https://a/token",service="reg"` -> ("bearer", {"realm": ..., "service": ...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}
    return scheme.lower(), params


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def docker_config() -> dict[str, Any]:
    path = docker_config_path()
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}
