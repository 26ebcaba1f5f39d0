"""The Docker config file (~/.docker/config.json) as the docker CLI takes it: an `auths` entry
whose `auth` cannot be read (not base64, no `user:password` in it: a stale entry for some other
registry) is warned about, naming the file and the entry, and read as an entry without
credentials; only a pull or push that needs that registry's credentials then fails. docker-py
instead stops every client it makes with a traceback, even one for a local image."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
import threading
from contextlib import contextmanager
from typing import Any, TextIO

_warned: set[tuple[str, str]] = set()


def unreadable_auths(config: Mapping[str, Any]) -> list[str]:
    """The registries whose `auths` entry has an `auth` docker-py cannot decode."""
    import docker.auth

    auths = config.get("auths")
    if not isinstance(auths, Mapping):
        return []
    bad = []
    for host, entry in auths.items():
        if isinstance(entry, Mapping) and "auth" in entry and "identitytoken" not in entry:
            try:
                docker.auth.decode_auth(entry["auth"])
            except (ValueError, TypeError, AttributeError):  # binascii.Error, no colon, not UTF-8, not a string
                bad.append(str(host))
    return bad


def without_unreadable_auths(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with each unreadable entry emptied (docker-py's "no credentials here": kept, so
    that a config of bad entries only is not read again from the file, as an empty one is)."""
    bad = set(unreadable_auths(config))
    if not bad:
        return dict(config)
    return {**config, "auths": {host: {} if host in bad else entry for host, entry in config["auths"].items()}}


def warn_once(path: str, hosts: list[str], stream: TextIO | None = None) -> None:
    for host in hosts:
        if (path, host) not in _warned:
            _warned.add((path, host))
            print(f"warning: ignoring the credentials of {host!r} in {path}: its `auth` is not base64 of "
                  f"user:password; `docker login {host}` again if this run needs them", file=stream or sys.stderr)


_SWAP = threading.Lock()
_USERS = 0
_ORIGINAL: Any = None


@contextmanager
def lenient_docker_config() -> Iterator[None]:
    """While docker-py makes a client: the config file read as above (docker-py reads it then).
    Clients are made on several threads at once (a build beside its cache export): the SDK's
    reader is swapped by the first user and put back by the last, so it is always the SDK's own
    that comes back."""
    global _USERS, _ORIGINAL
    from docker.utils import config as docker_utils_config

    with _SWAP:
        if _USERS == 0:
            _ORIGINAL = docker_utils_config.load_general_config
            original = _ORIGINAL

            def load(config_path: Any = None) -> dict[str, Any]:
                found = original(config_path)
                bad = unreadable_auths(found)
                if bad:
                    warn_once(str(docker_utils_config.find_config_file(config_path)), bad)
                return without_unreadable_auths(found)

            docker_utils_config.load_general_config = load
        _USERS += 1
    try:
        yield
    finally:
        with _SWAP:
            _USERS -= 1
            if _USERS == 0:
                docker_utils_config.load_general_config = _ORIGINAL
