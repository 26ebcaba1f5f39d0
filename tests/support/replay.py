"""A smoke-test verdict read from the run that made it, where the suite would run it again.

The smoke suite on a real torch image takes 20-60 s (a gloo all-reduce, an Inductor compile).
A test whose image content another run already verified in this session (signed_publish's
publish, bk_published's) proves what it is about (the signature checked first, the provenance
read, the right digest run on the right engine) with everything real but the smoke-test
container: its output is that run's recorded verdict, and the test asserts which image and
command it was asked for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from imagebuilder.engine.api import RunResult
from imagebuilder.verify.labels import NAME as LABELS_CHECK


def smoke_output(verdict: Mapping[str, Any]) -> str:
    """What `python -m smoke_tests --json` printed for a verify report's JSON (VerifyReport.to_json,
    as publish's --report keeps it under each image's "verify")."""
    # verify's own labels check is not the smoke suite's: verify adds it again to what the suite printed.
    checks = [check for check in verdict["checks"] if check["name"] != LABELS_CHECK]
    return json.dumps({"ok": verdict["ok"], "torch": verdict["torch"], "gpu_count": verdict["gpu_count"],
                       "checks": checks})


def is_smoke_run(command: Sequence[str] | str) -> bool:
    """Whether a command is the smoke suite (`python3 -m smoke_tests ...`), as verify runs it."""
    words = command.split() if isinstance(command, str) else list(command)
    return words[1:3] == ["-m", "smoke_tests"]


class ReplayedSmokeRun:
    """A real engine (every call goes to it: the image's facts for preflight, pulls, inspects)
    except the smoke suite's container, whose output is `verdict`, recorded by the run that
    verified this image content. `asked` lists (image, command) of each smoke run it stood in for."""

    def __init__(self, engine: Any, verdict: Mapping[str, Any]) -> None:
        assert verdict["checks"], "a recorded verdict without checks proves nothing"
        self._engine = engine
        self._verdict = verdict
        self.asked: list[tuple[str, list[str]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def run(self, image: str, command: Sequence[str] | str, **options: Any) -> RunResult:
        if not is_smoke_run(command):
            result: RunResult = self._engine.run(image, command, **options)
            return result
        self.asked.append((image, list(command) if not isinstance(command, str) else command.split()))
        return RunResult(exit_code=0 if self._verdict["ok"] else 1, output=smoke_output(self._verdict),
                         timed_out=False, seconds=0.0)


def cli_replaying(monkeypatch: Any, verdict: Mapping[str, Any], *argv: str) -> tuple[Any, ReplayedSmokeRun]:
    """`imagebuilder ARGV` in this process (click's CliRunner), the engine it makes the real one
    (DOCKER_HOST and friends as the environment says) but for the smoke-test container, which
    answers with `verdict`: (click's result, that engine). The revision label is the tests'
    fixed one, as conftest's imagebuilder() gives the CLI in a subprocess."""
    from click.testing import CliRunner

    from imagebuilder.cli import cli
    from imagebuilder.engine import docker as docker_module

    engines: list[ReplayedSmokeRun] = []
    real = docker_module.DockerEngine

    def replaying(*args: Any, **kwargs: Any) -> ReplayedSmokeRun:
        engines.append(ReplayedSmokeRun(real(*args, **kwargs), verdict))
        return engines[-1]

    monkeypatch.setattr(docker_module, "DockerEngine", replaying)
    monkeypatch.setenv("GITHUB_SHA", "0" * 40)
    result = CliRunner().invoke(cli, list(argv))
    assert len(engines) == 1, f"imagebuilder {argv[0]} made {len(engines)} engines: {result.output[-2000:]}"
    return result, engines[0]


def verify_replaying(monkeypatch: Any, verdict: Mapping[str, Any], *argv: str) -> tuple[Any, ReplayedSmokeRun]:
    """`imagebuilder verify ARGV` through cli_replaying."""
    return cli_replaying(monkeypatch, verdict, "verify", *argv)
