"""The connection to a Docker daemon: the SDK's client made as docker makes it (DOCKER_HOST, a TLS
daemon verified by DOCKER_CERT_PATH's CA only, ssh://), a daemon that takes the connection and
never answers said within seconds and given up on, and the one-line form of the SDK's errors."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .docker_config import lenient_docker_config
from .errors import BadDaemonAddress, DaemonUnavailable, daemon_address_problem

if TYPE_CHECKING:
    import docker

DEFAULT_SOCKET = "unix:///var/run/docker.sock"


def client_from_env(timeout: int) -> docker.DockerClient:
    """docker.from_env, with a TLS daemon (DOCKER_TLS_VERIFY=1) verified by DOCKER_CERT_PATH's CA.

    requests lets REQUESTS_CA_BUNDLE (or CURL_CA_BUNDLE), which proxy setups export, replace the
    CA docker-py gives it: verifying the daemon then failed with "unable to get local issuer
    certificate". The docker CLI verifies a TLS daemon with DOCKER_CERT_PATH/ca.pem only; so does
    this client (requests' environment is not read for it: trust_env off)."""
    import docker
    from docker.constants import MINIMUM_DOCKER_API_VERSION
    from docker.utils import kwargs_from_env

    kwargs = kwargs_from_env()
    tls = kwargs.get("tls")
    if not (tls and tls.verify and tls.ca_cert):
        return docker.from_env(timeout=timeout)
    # The API version is asked for as docker-py would, by a client that already ignores it.
    probe = docker.APIClient(timeout=timeout, version=MINIMUM_DOCKER_API_VERSION, **kwargs)
    probe.trust_env = False
    try:
        version = probe.version(api_version=False)["ApiVersion"]
    finally:
        probe.close()
    client = docker.DockerClient(timeout=timeout, version=version, **kwargs)
    client.api.trust_env = False
    return client


ANSWER_TIMEOUT = 30  # seconds the daemon has to answer its first call (GET /version)
SAY_AFTER = 10.0  # seconds of waiting on it before that is said


@contextmanager
def said_while_waiting(base_url: str, timeout: int) -> Iterator[None]:
    """A line on stderr if the daemon has not answered after SAY_AFTER s (no silence over 15 s)."""
    import sys

    where = "" if os.environ.get("DOCKER_HOST") != base_url else " (DOCKER_HOST)"
    timer = threading.Timer(SAY_AFTER, lambda: print(
        f"waiting for the Docker daemon at {base_url}{where} to answer (giving up after {timeout} s)",
        file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def connect(base_url: str, explicit_url: str | None, api_timeout: float) -> docker.DockerClient:
    """The SDK's client for the daemon at `base_url` (`explicit_url` when given, else the
    environment's, as docker does it), its first answer awaited aloud and for ANSWER_TIMEOUT at most."""
    import docker

    # (ssh://: the SDK logs in as it is made: no route, an unknown host key, a refused key)
    problem = daemon_address_problem(base_url)
    if problem is not None:
        raise BadDaemonAddress(base_url=base_url, reason=problem)
    unreachable: tuple[type[Exception], ...] = (docker.errors.DockerException, *ssh_errors(base_url))
    # The first call asks the daemon's API version: a daemon answers it at once, so a
    # socket that takes the connection and says nothing is told within seconds and given
    # up on after ANSWER_TIMEOUT, not after the long calls' timeout.
    first = min(int(api_timeout), ANSWER_TIMEOUT)
    try:
        with lenient_docker_config(), said_while_waiting(base_url, first):
            if explicit_url:
                client = docker.DockerClient(base_url=explicit_url, timeout=first)
            else:
                client = client_from_env(first)
    except unreachable as e:
        reason = short(e)
        if "timed out" in reason:
            where = "" if explicit_url else " (DOCKER_HOST)"
            reason = (f"it took the connection but gave no answer in {first} s: a hung daemon, or no Docker "
                      f"daemon at that address{where}")
        raise DaemonUnavailable(base_url=base_url, reason=reason) from e
    client.api.timeout = int(api_timeout)
    return client


def ssh_errors(base_url: str) -> tuple[type[Exception], ...]:
    """What docker-py's ssh transport (paramiko, the `docker[ssh]` extra) raises when the far
    side cannot be reached or refuses the login; nothing for other daemons."""
    if not base_url.startswith("ssh://"):
        return ()
    import paramiko

    return (paramiko.SSHException, OSError)


def short_text(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(e: BaseException) -> str:
    return short_text(str(e) or type(e).__name__)
