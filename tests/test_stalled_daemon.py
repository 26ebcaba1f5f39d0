"""A DOCKER_HOST socket that takes the connection and never answers (issue 45, part 5): it gave
121 s of nothing. Now what is waited on is said within seconds, and the wait ends after a bounded
timeout in one line naming DOCKER_HOST. A real socket that stalls; the two delays shortened."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagebuilder.engine import docker as engine_docker
from imagebuilder.engine import docker_client
from imagebuilder.engine.errors import DaemonUnavailable


@pytest.fixture
def stalled_socket(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])  # taken, and never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"unix://{path}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_daemon_that_never_answers_is_said_and_given_up_on(stalled_socket, monkeypatch, capsys) -> None:
    monkeypatch.setattr(docker_client, "SAY_AFTER", 0.5)
    monkeypatch.setattr(docker_client, "ANSWER_TIMEOUT", 3)
    monkeypatch.setenv("DOCKER_HOST", stalled_socket)
    engine = engine_docker.DockerEngine()
    started = time.monotonic()
    with pytest.raises(DaemonUnavailable) as raised:
        engine.ping()
    took = time.monotonic() - started
    assert 2.5 < took < 15, took
    said = capsys.readouterr().err
    assert said == (f"waiting for the Docker daemon at {stalled_socket} (DOCKER_HOST) to answer "
                    "(giving up after 3 s)\n"), said
    message = str(raised.value)
    assert "\n" not in message and raised.value.exit_code == 1
    assert message.startswith(f"could not reach the Docker daemon at {stalled_socket}: it took the connection but "
                              "gave no answer in 3 s"), message
    assert "(DOCKER_HOST)" in message


def test_a_daemon_that_answers_at_once_is_not_waited_on_aloud(monkeypatch, capsys) -> None:
    """The line is for a wait: a refused socket fails at once, and says nothing about waiting."""
    monkeypatch.setattr(docker_client, "SAY_AFTER", 0.5)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(DaemonUnavailable):
        engine_docker.DockerEngine().ping()
    time.sleep(1)  # past SAY_AFTER: the timer was cancelled
    assert "waiting for" not in capsys.readouterr().err
