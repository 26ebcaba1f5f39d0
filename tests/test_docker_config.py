"""A Docker config file with an unreadable `auth` entry (issue 45, part 5): warned about, naming
the file and the entry, and passed over as the docker CLI does; only that registry's credentials
fail, in one line."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.real_images import REPO_ROOT

STALE = "stale.example:5000"
GOOD = "127.0.0.1:5000"


def _config(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    auths = {STALE: {"auth": "not base64!"},
             "nocolon.example": {"auth": base64.b64encode(b"userpass").decode()},
             GOOD: {"auth": base64.b64encode(b"alice:s3cret").decode()}}
    (folder / "config.json").write_text(json.dumps({"auths": auths}))
    return folder


def test_a_command_that_opens_a_docker_client_warns_and_goes_on(tmp_path: Path) -> None:
    """It ended in an 87-line traceback from docker-py, even for a local image."""
    folder = _config(tmp_path / "docker")
    done = subprocess.run([sys.executable, "-m", "imagebuilder", "verify", "pytorch:2.6"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "DOCKER_CONFIG": str(folder),
                               "DOCKER_HOST": "unix:///nonexistent", "HOME": str(tmp_path)})
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 2, done.stderr
    assert all(str(folder / "config.json") in line for line in warnings)
    assert STALE in warnings[0] and "nocolon.example" in warnings[1]
    # ... and it went on to ask the daemon: the one failure is the world's (no daemon there), exit 1.
    errors = [line for line in lines if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1 and "could not reach the Docker daemon" in errors[0], done.stderr


def test_another_registrys_unreadable_entry_leaves_these_credentials_readable(tmp_path: Path, monkeypatch) -> None:
    from imagebuilder.registry.auth import CredentialsUnavailable, credentials_for, docker_config

    monkeypatch.setenv("DOCKER_CONFIG", str(_config(tmp_path)))
    config = docker_config()
    assert credentials_for(config, GOOD) == ("alice", "s3cret")
    assert credentials_for(config, "other.example") is None
    with pytest.raises(CredentialsUnavailable) as raised:
        credentials_for(config, STALE)
    message = str(raised.value)
    assert "\n" not in message and STALE in message and str(tmp_path / "config.json") in message, message


def test_the_docker_sdk_reads_the_config_without_the_unreadable_entries(tmp_path: Path, monkeypatch) -> None:
    import docker.api.client

    from imagebuilder.engine.docker_config import lenient_docker_config

    monkeypatch.setenv("DOCKER_CONFIG", str(_config(tmp_path)))
    with pytest.raises(ValueError):  # docker-py alone: what the traceback was
        docker.api.client.APIClient(base_url="unix:///nonexistent", version="1.44")
    with lenient_docker_config():
        client = docker.api.client.APIClient(base_url="unix:///nonexistent", version="1.44")
    auth = client._auth_configs  # type: ignore[attr-defined]  # (what docker-py pulls and pushes with)
    assert auth.resolve_authconfig(GOOD)["password"] == "s3cret"
    assert not auth.resolve_authconfig(STALE)  # a pull from there is anonymous
    # The SDK's own reader is back as it was after the client is made.
    from docker.utils import config as sdk_config
    assert sdk_config.load_general_config.__module__ == "docker.utils.config"


def test_clients_made_on_two_threads_at_once_give_the_sdk_its_own_reader_back() -> None:
    """A build's client and its cache export's are made at once: whichever ends first, the SDK's
    reader comes back (a swap saved by each user put the lenient one back for good: every later
    client warned, in CI's full run)."""
    from docker.utils import config as sdk_config

    from imagebuilder.engine.docker_config import lenient_docker_config

    original = sdk_config.load_general_config
    first, second = lenient_docker_config(), lenient_docker_config()
    first.__enter__()
    second.__enter__()
    assert sdk_config.load_general_config is not original
    first.__exit__(None, None, None)
    assert sdk_config.load_general_config is not original  # the second client is still being made
    second.__exit__(None, None, None)
    assert sdk_config.load_general_config is original
