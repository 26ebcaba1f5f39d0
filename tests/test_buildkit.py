"""The BuildKit builder: its progress parser on canned `--progress=plain` output, the choice
of builder, the BuildKit templates, and real BuildKit builds on the shared daemon."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import certifi
import pytest

from imagebuilder.build.install_steps import CA_CONTEXT, CA_SECRET_PATH
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.engine.api import BuildRequest, Progress
from imagebuilder.engine.buildkit import BuildKitBuilder, BuildKitCli
from imagebuilder.engine.buildkit_progress import PlainProgress, dockerfile_stages
from imagebuilder.engine.classic import ClassicBuilder
from imagebuilder.engine.docker import DockerEngine
from imagebuilder.engine.errors import BaseImageMissing, BuildFailed, EngineError
from imagebuilder.engine.export import Compression, Export
from imagebuilder.engine.select import NoBuildKit, decide, detect_buildkit, make_builder
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve

from support.build_cache import family_build, released_after_last_use
from support.cleanup import remove_local_tags
from support.real_images import REPO_ROOT, TEST_REPOSITORY_PREFIX, imagebuilder, session_ca

HERE = Path(__file__).parent
M = load_matrix(HERE / "data" / "matrix-small.yaml")
GOLDEN = HERE / "golden"

TWO_STAGES = """\
ARG BASE=imagebuilder-base:bookworm
FROM ${BASE} AS a
ENV X=1
RUN echo hello; \\
    echo world
FROM ${BASE}
COPY --from=a /etc/hostname /x
LABEL a=b
RUN echo bad >&2; exit 3
"""

# What Debian's docker 20.10 CLI printed for TWO_STAGES (sha256 lines trimmed).
FAILED_OUTPUT = """\
#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 218B 0.0s done
#1 DONE 0.1s

#3 [internal] load metadata for docker.io/library/imagebuilder-base:bookworm
#3 DONE 0.0s

#4 [stage-1 1/3] FROM docker.io/library/imagebuilder-base:bookworm
#4 DONE 0.0s

#5 [a 2/2] RUN echo hello;     echo world
#5 0.992 hello
#5 1.997 world
#5 DONE 3.4s

#6 [stage-1 2/3] COPY --from=a /etc/hostname /x
#6 CACHED

#7 [stage-1 3/3] RUN --mount=type=secret,id=ca,target=/run/secrets/ca echo bad >&2; exit 3
#7 0.511 bad
#7 0.512 pip: Could not fetch URL https://pypi.example/simple/torch/
#7 ERROR: executor failed running [/bin/sh -c echo bad >&2; exit 3]: exit code: 3
------
 > [stage-1 3/3] RUN echo bad >&2; exit 3:
------
executor failed running [/bin/sh -c echo bad >&2; exit 3]: exit code: 3
"""

CACHED_OUTPUT = """\
#3 [internal] load metadata for docker.io/library/imagebuilder-base:bookworm
#3 DONE 0.0s

#4 [stage-0 1/6] FROM docker.io/library/imagebuilder-base:bookworm
#4 CACHED

#3 [internal] load metadata for docker.io/library/imagebuilder-base:bookworm
#3 DONE 0.0s

#5 [a 2/2] RUN echo hello;     echo world
#5 CACHED

#6 [stage-1 2/3] COPY --from=a /etc/hostname /x
#6 CACHED

#7 [stage-1 3/3] RUN echo fine
#7 CACHED

#8 exporting to image
#8 exporting layers done
#8 writing image sha256:06accd0653c8568307f63d43bc3e46ece6147af3d45cb72e323ff35ce3e5ec5f done
#8 DONE 0.0s
"""

MISSING_BASE_OUTPUT = """\
#3 [internal] load metadata for docker.io/library/no-such-image:1
#3 ERROR: pull access denied, repository does not exist or may require authorization
------
 > [internal] load metadata for docker.io/library/no-such-image:1:
------
failed to solve: no-such-image:1: pull access denied
"""


def parse(output: str, dockerfile: str = TWO_STAGES) -> tuple[PlainProgress, list[Progress]]:
    events: list[Progress] = []
    state = PlainProgress(dockerfile, time.monotonic(), events.append)
    for line in output.splitlines(keepends=True):
        state.feed(line)
    return state, events


@pytest.mark.parametrize("dockerfile, stages", [
    (TWO_STAGES, (("a", 2), ("stage-1", 3))),
    ("FROM x\nRUN a\nENV b=1\nWORKDIR /w\nCOPY . .\nCMD [\"x\"]\n", (("stage-0", 4),)),
    ("# c\nARG B\nFROM --platform=linux/arm64 x AS wheels\nRUN a\nFROM wheels\nADD f /\n",
     (("wheels", 2), ("stage-1", 2))),
])
def test_stages_count_the_steps_buildkit_counts(dockerfile, stages):
    assert dockerfile_stages(dockerfile) == stages


def test_plain_progress_numbers_steps_over_the_whole_dockerfile():
    state, events = parse(FAILED_OUTPUT)
    starts = [(e.step, e.total, e.instruction, e.cached) for e in events if e.line is None]
    assert starts == [
        (3, 5, "FROM docker.io/library/imagebuilder-base:bookworm", False),
        (2, 5, "RUN echo hello;     echo world", False),
        (4, 5, "COPY --from=a /etc/hostname /x", False),
        (4, 5, "COPY --from=a /etc/hostname /x", True),
        (5, 5, "RUN echo bad >&2; exit 3", False),  # the mount flags are not shown
    ]
    assert [(e.step, e.line) for e in events if e.line is not None][:2] == [(2, "hello"), (2, "world")]
    assert state.cached_steps == 1 and state.executed_steps == 1


def test_a_failed_step_is_a_build_failed_with_its_last_lines_and_cause():
    state, _ = parse(FAILED_OUTPUT)
    error = state.error(1, Path("/tmp/x.log"))
    assert isinstance(error, BuildFailed)
    assert (error.step, error.total, error.step_exit_code) == (5, 5, 3)
    assert error.tail == ("bad", "pip: Could not fetch URL https://pypi.example/simple/torch/")
    assert error.cause == "network"
    assert str(error).startswith("step 5/5 `RUN echo bad >&2; exit 3` failed: exit code 3;")
    assert "full log: /tmp/x.log" in str(error)


def test_a_fully_cached_build_counts_its_cached_steps():
    state, events = parse(CACHED_OUTPUT)
    assert state.cached_steps == 4 and state.executed_steps == 0
    assert sorted(e.step for e in events if e.cached) == [1, 2, 4, 5]
    assert state.failed is None


EXPORT_OUTPUT = """\
#7 [stage-1 3/3] RUN echo fine
#7 DONE 1.0s

#8 exporting to image
#8 exporting layers
#8 exporting layers 212.6s done
#8 exporting manifest sha256:0e7135e5c799e2ed78d4a780eaf377a9cc2301d556c868c8129e167e9a4e6548 0.0s done
#8 unpacking to docker.io/library/x:1
#8 unpacking to docker.io/library/x:1 51.3s done
#8 DONE 264.1s
"""


def test_the_export_is_announced_and_its_seconds_counted():
    events: list[Progress] = []
    state = PlainProgress(TWO_STAGES, time.monotonic(), events.append, export_note="zstd")
    lines = EXPORT_OUTPUT.splitlines(keepends=True)
    for line in lines[:5]:
        state.feed(line)
    assert state.activity == "exporting layers (zstd)"
    assert [e.activity for e in events if e.activity] == ["exporting to image", "exporting layers (zstd)"]
    for line in lines[5:8]:
        state.feed(line)
    assert state.activity == "unpacking to docker.io/library/x:1"
    for line in lines[8:]:
        state.feed(line)
    assert state.activity is None
    assert state.export_seconds == pytest.approx(212.6 + 51.3)


def test_silence_gets_a_heartbeat_naming_what_is_still_going(monkeypatch):
    from imagebuilder.engine import buildkit_progress

    events: list[Progress] = []
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    state = PlainProgress(TWO_STAGES, 1000.0, events.append, export_note="zstd")
    state.feed("#5 [a 2/2] RUN sleep 100\n")  # a step without output
    quiet = buildkit_progress.QUIET_FOR
    clock[0] += quiet * 0.9
    state.heartbeat()
    assert len(events) == 1  # not yet
    clock[0] += quiet * 0.2
    state.heartbeat()
    assert (events[-1].step, events[-1].activity) == (2, None) and events[-1].elapsed == pytest.approx(quiet * 1.1)
    for line in ("#5 DONE 12.0s\n", "#8 exporting to image\n", "#8 exporting layers\n"):
        state.feed(line)
    clock[0] += quiet
    state.heartbeat()
    assert events[-1].activity == "exporting layers (zstd)" and events[-1].elapsed == pytest.approx(quiet * 2.1)
    said = len(events)
    state.heartbeat()
    assert len(events) == said  # said just now


def test_a_missing_base_image_is_named():
    state, _ = parse(MISSING_BASE_OUTPUT, "FROM no-such-image:1\nRUN true\n")
    error = state.error(1, None)
    assert isinstance(error, BaseImageMissing) and error.image == "no-such-image:1"
    assert "pull access denied" in error.detail


def test_a_cli_that_died_without_output_still_says_so():
    state, _ = parse("")
    error = state.error(125, None)
    assert isinstance(error, BuildFailed) and "exited with code 125" in str(error)


# A build whose records another job's `docker builder prune` removed on a shared daemon: every
# step and the export done, then BuildKit's bare "not found" (round five).
LOST_RECORD_OUTPUT = CACHED_OUTPUT + "ERROR: failed to solve: not found\n"


class Inspector:
    """The builder's reads of the image store, answered as dockerd does for the built image."""

    def ping(self) -> None:
        pass

    def inspect_image(self, ref: str) -> dict[str, object]:
        return {"Id": "sha256:" + "a" * 64, "Size": 7}


def _lost_record_cli(tmp_path: Path, fail: int) -> BuildKitCli:
    """A docker CLI that loses its records `fail` times, then builds: its output and --iidfile as buildx's."""
    (tmp_path / "output").write_text(LOST_RECORD_OUTPUT)
    script = (f'n=$(cat {tmp_path}/tries 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/tries\n'
              f'if [ "$n" -lt {fail} ]; then cat {tmp_path}/output; exit 1; fi\n'
              'while [ $# -gt 0 ]; do [ "$1" = --iidfile ] && echo sha256:1 > "$2"; shift; done\n'
              f'echo "{CACHED_OUTPUT.splitlines()[-1]}"\n')
    return BuildKitCli(("sh", "-c", script, "sh"))


def test_a_record_lost_to_another_jobs_prune_is_named_and_the_build_tried_once_more(tmp_path):
    state, _ = parse(LOST_RECORD_OUTPUT)
    error = state.error(1, None)
    assert isinstance(error, BuildFailed) and error.cause == "lost-record"
    assert str(error).startswith("the build failed: not found; BuildKit lost a record of this build under it, "
                                 "twice (on a shared daemon another job's `docker builder prune`")
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(TWO_STAGES)
    events: list[Progress] = []
    req = BuildRequest(context=tmp_path / "ctx", tags=("r:a",), log_path=tmp_path / "build.log")
    result = BuildKitBuilder(_lost_record_cli(tmp_path, fail=1), Inspector()).build(req, events.append)
    assert result.image_id == "sha256:" + "a" * 64 and (tmp_path / "tries").read_text() == "2\n"
    assert any(e.activity and e.activity.startswith("BuildKit lost a record of this build") for e in events)
    log = (tmp_path / "build.log").read_text()  # both tries, the retry said between them
    assert "ERROR: failed to solve: not found" in log and "[imagebuilder] BuildKit lost a record" in log
    # Lost twice: the error, after two tries only.
    (tmp_path / "tries").unlink()
    with pytest.raises(BuildFailed, match="BuildKit lost a record of this build under it, twice"):
        BuildKitBuilder(_lost_record_cli(tmp_path, fail=2), Inspector()).build(req)
    assert (tmp_path / "tries").read_text() == "2\n"
    # A step's own failure is not retried.
    (tmp_path / "output").write_text(FAILED_OUTPUT)
    (tmp_path / "tries").unlink()
    script = f'echo 1 >> {tmp_path}/tries; cat {tmp_path}/output; exit 1'
    with pytest.raises(BuildFailed, match="exit code 3"):
        BuildKitBuilder(BuildKitCli(("sh", "-c", script, "sh")), Inspector()).build(req)
    assert (tmp_path / "tries").read_text() == "1\n"


def test_the_command_line_carries_tags_labels_secrets_and_platform(tmp_path):
    builder = BuildKitBuilder(BuildKitCli(("docker", "buildx", "build")), DockerEngine())
    req = BuildRequest(context=tmp_path, tags=("r:a", "r:b"), labels={"k": "v"},
                       secrets={"ca": tmp_path / "ca.pem"}, platform="linux/arm64", nocache=True)
    argv = builder.command(req, tmp_path / "iid")
    assert argv[:5] == ["docker", "buildx", "build", "--load", "--progress=plain"]
    joined = " ".join(argv)
    for part in ("--tag r:a --tag r:b", "--label k=v", f"--secret id=ca,src={tmp_path}/ca.pem",
                 "--platform linux/arm64", "--no-cache", f"--iidfile {tmp_path}/iid"):
        assert part in joined
    assert argv[-1] == str(tmp_path)


def test_a_cache_only_build_names_no_image_and_reads_no_image_id(tmp_path):
    builder = BuildKitBuilder(BuildKitCli(("docker", "buildx", "build")), DockerEngine())
    export = Export(Compression("zstd"), cache_to="127.0.0.1:5000/ml/imagebuilder-cache:k", image=False)
    argv = builder.command(BuildRequest(context=tmp_path, tags=("r:a",), export=export), None)
    assert "--tag" not in argv and "--iidfile" not in argv
    assert argv[argv.index("--output") + 1] == "type=cacheonly"


def _background(tmp_path, script: str, timeout: float = 60):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    builder = BuildKitBuilder(BuildKitCli(("sh", "-c", script, "sh")), DockerEngine())
    log = tmp_path / "logs" / "k-cache.log"
    req = BuildRequest(context=tmp_path, tags=("r:a",), log_path=log, timeout=timeout,
                       export=Export(Compression("zstd"), cache_to="127.0.0.1:5000/ml/imagebuilder-cache:k",
                                     image=False))
    return builder, req, log


def test_a_background_build_runs_beside_its_caller_into_its_log(tmp_path):
    builder, req, log = _background(tmp_path, 'echo "exporting cache to registry"; sleep 0.5; exit 3')
    assert builder.can_start()
    running = builder.start(req)
    assert running.wait(0.01) is None  # still running: the caller goes on
    assert running.wait() == 3
    time.sleep(0.1)  # (its watcher stamps the end as the process ends)
    assert running.ended_at is not None and running.ended_at <= time.monotonic()
    lines = log.read_text().splitlines()
    assert lines[0].startswith("$ sh -c") and "--output type=cacheonly" in lines[0]
    assert "exporting cache to registry" in lines


def test_a_background_build_is_stopped_when_asked_and_past_its_timeout(tmp_path):
    builder, req, _ = _background(tmp_path, "exec sleep 30")
    running = builder.start(req)
    started = time.monotonic()
    running.stop()
    assert running.wait(5) not in (None, 0) and time.monotonic() - started < 5
    builder, req, _ = _background(tmp_path, "exec sleep 30", timeout=0.3)
    running = builder.start(req)
    assert running.wait() not in (None, 0) and time.monotonic() - started < 10


def test_the_builtin_buildkit_of_an_old_cli_starts_nothing_in_the_background(tmp_path):
    old = BuildKitBuilder(BuildKitCli(("docker", "build"), buildkit_env=True), DockerEngine())
    assert not old.can_start()


# --- choosing a builder -----------------------------------------------------------------


def _fake_docker(folder: Path, *, buildx: bool, buildkit: bool, context: str | None = None) -> None:
    folder.mkdir(parents=True)
    script = folder / "docker"
    script.write_text(
        "#!/bin/sh\n"
        + (f'if [ "$1 $2 $3" = "context inspect {context}" ]; then exit 0; fi\n' if context else "")
        +
        f'if [ "$1" = buildx ]; then {"echo github.com/docker/buildx v0.99 x; exit 0" if buildx else "echo unknown command: docker buildx >&2; exit 1"}; fi\n'
        f'if [ "$1" = build ]; then {"exit 0" if buildkit else "echo ERROR: BuildKit is enabled but the buildx component is missing or broken. >&2; exit 1"}; fi\n'
        "exit 1\n"
    )
    script.chmod(0o755)


@pytest.mark.parametrize("clis, choice, expected", [
    # docker 23+ without buildx first on PATH, Debian's 20.10 CLI behind it: that one.
    ([("new", False, False), ("old", False, True)], "auto", ("old/docker", "build")),
    ([("new", True, False)], "auto", ("new/docker", "buildx", "build")),
    ([("new", False, False)], "auto", "classic"),
    ([("new", False, False)], "classic", "classic"),
    ([("new", True, True)], "classic", "classic"),
])
def test_auto_detects_a_buildkit_cli_and_falls_back_to_classic(tmp_path, monkeypatch, clis, choice, expected):
    for name, buildx, buildkit in clis:
        _fake_docker(tmp_path / name, buildx=buildx, buildkit=buildkit)
    monkeypatch.setenv("PATH", os.pathsep.join(str(tmp_path / name) for name, _, _ in clis))
    monkeypatch.delenv("BUILDX_BUILDER", raising=False)
    detect_buildkit.cache_clear()
    decision = decide(choice)
    builder = make_builder(decision, DockerEngine())
    assert builder.kind == decision.kind == ("classic" if expected == "classic" else "buildkit")
    if expected == "classic":
        assert isinstance(builder, ClassicBuilder)
    else:
        assert isinstance(builder, BuildKitBuilder)
        assert builder.cli.command == tuple(str(tmp_path / p) if i == 0 else p for i, p in enumerate(expected))
    detect_buildkit.cache_clear()


def test_buildkit_without_a_buildkit_cli_is_a_bad_request(tmp_path, monkeypatch):
    _fake_docker(tmp_path / "new", buildx=False, buildkit=False)
    monkeypatch.setenv("PATH", str(tmp_path / "new"))
    detect_buildkit.cache_clear()
    with pytest.raises(NoBuildKit, match="install the buildx plugin") as e:
        decide("buildkit")
    assert e.value.exit_code == 2 and "buildx component is missing" in str(e.value)
    detect_buildkit.cache_clear()


def test_a_buildx_builder_instance_goes_to_buildx(tmp_path, monkeypatch):
    _fake_docker(tmp_path / "new", buildx=True, buildkit=False)
    monkeypatch.setenv("PATH", str(tmp_path / "new"))
    detect_buildkit.cache_clear()
    decision = decide("auto", buildx_builder="k8s")
    assert decision.kind == "buildkit" and decision.cli is not None
    assert decision.cli.command[-2:] == ("--builder", "k8s")
    detect_buildkit.cache_clear()


def test_a_docker_contexts_builder_is_reached_through_that_context(tmp_path, monkeypatch):
    """buildx refuses `--builder CONTEXT` for a context's own (docker driver) builder."""
    _fake_docker(tmp_path / "new", buildx=True, buildkit=False, context="gpu-host")
    monkeypatch.setenv("PATH", str(tmp_path / "new"))
    detect_buildkit.cache_clear()
    decision = decide("auto", buildx_builder="gpu-host")
    assert decision.cli is not None
    assert decision.cli.command == (str(tmp_path / "new" / "docker"), "--context", "gpu-host", "buildx", "build")
    detect_buildkit.cache_clear()


# --- BuildKit templates -------------------------------------------------------------------

BUILDKIT_GOLDEN = {
    "buildkit-runtime-2.6-cuda12.1-ca.Dockerfile": (Request("2.6", "12.1"), True),
    "buildkit-runtime-2.6-cuda12.4-py3.12.Dockerfile": (Request("2.6", "12.4", python="3.12"), False),
    "buildkit-jupyter-2.6-cuda12.4-ca.Dockerfile": (Request("2.6", "12.4", variant="jupyter"), True),
}
# A certificate OpenSSL reads (--ca-bundle refuses BEGIN/END lines around anything else): the
# first of certifi's bundle; what it certifies does not matter to rendering.
_BUNDLE = Path(certifi.where()).read_bytes()
FAKE_CA = (_BUNDLE[_BUNDLE.index(b"-----BEGIN CERTIFICATE-----"):_BUNDLE.index(b"-----END CERTIFICATE-----")]
           + b"-----END CERTIFICATE-----\n")


@pytest.mark.parametrize("name", sorted(BUILDKIT_GOLDEN))
def test_buildkit_golden_dockerfiles(name, tmp_path):
    """Set UPDATE_GOLDEN=1 to rewrite them after an intended template change; review the diff."""
    request, with_ca = BUILDKIT_GOLDEN[name]
    ca = tmp_path / "ca.pem"
    ca.write_bytes(FAKE_CA)
    # What buildx renders (the CA from its named context); an old CLI's BuildKit: the secret, tested below.
    image = render(resolve(M, request), M, RenderOptions(buildkit=True, ca_bundle=ca.read_bytes() if with_ca else None, ca_context=True))
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(image.dockerfile)
    assert image.dockerfile == path.read_text()


@pytest.mark.parametrize("variant", ["runtime", "devel", "jupyter"])
def test_buildx_bind_mounts_the_ca_from_a_named_context_in_one_stage(tmp_path, variant):
    """Through buildx the CA bundle is a named build context, bind-mounted read-only by each RUN
    that downloads (a secret mount delays each such RUN by seconds: docs/benchmarks.md): in the
    context's own folder, which no COPY takes, and outside the inputs hash."""
    ca = tmp_path / "ca.pem"
    ca.write_bytes(FAKE_CA)
    spec = resolve(M, Request("2.6", "12.4", variant=variant))
    image = render(spec, M, RenderOptions(buildkit=True, ca_bundle=ca.read_bytes(), ca_context=True))
    text = image.dockerfile
    assert text.count("\nFROM ") == 1 and "type=secret" not in text
    mount = f"--mount=type=bind,from={CA_CONTEXT},source=ca.pem,target={CA_SECRET_PATH}"
    assert text.count(mount) == text.count("--mount=type=cache,id=imagebuilder-uv") >= 1
    assert image.contexts == (CA_CONTEXT,) and image.secrets == {}
    assert image.files[f"{CA_CONTEXT}/ca.pem"] == FAKE_CA and "ca-bundle.pem" not in image.files
    copied = [line.split()[-2] for line in text.splitlines() if line.startswith("COPY") and "--from" not in line]
    assert copied and not [c for c in copied if c.startswith((CA_CONTEXT, ".", "/"))], copied
    assert not any(line.startswith(("ENV", "COPY")) and CA_SECRET_PATH in line for line in text.splitlines())
    other = tmp_path / "other.pem"
    other.write_bytes(FAKE_CA + b"# another\n")
    again = render(spec, M, RenderOptions(buildkit=True, ca_bundle=other.read_bytes(), ca_context=True))
    assert again.inputs_hash == image.inputs_hash and again.dockerfile == text


def test_the_builder_passes_named_contexts_and_an_old_cli_refuses_them(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    req = BuildRequest(context=tmp_path, tags=("r:a",), contexts={"imagebuilder-ca": tmp_path / "ca"})
    buildx = BuildKitBuilder(BuildKitCli(("docker", "buildx", "build")), DockerEngine())
    assert f"--build-context imagebuilder-ca={tmp_path}/ca" in " ".join(buildx.command(req, tmp_path / "iid"))
    old = BuildKitBuilder(BuildKitCli(("docker", "build"), buildkit_env=True), DockerEngine())
    with pytest.raises(EngineError, match="named build contexts; install the buildx plugin"):
        old.command(req, tmp_path / "iid")


@pytest.mark.parametrize("variant", ["runtime", "devel", "jupyter"])
def test_buildkit_without_buildx_mounts_the_ca_as_a_secret_in_one_stage(tmp_path, variant):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(FAKE_CA)
    image = render(resolve(M, Request("2.6", "12.4", variant=variant)), M, RenderOptions(buildkit=True, ca_bundle=ca.read_bytes()))
    text = image.dockerfile
    assert text.count("\nFROM ") == 1 and "# syntax=" not in text
    assert "ca-bundle.pem" not in image.files and image.secrets == {"ca": FAKE_CA}
    assert "--mount=type=secret,id=ca" in text and "--mount=type=cache,id=imagebuilder-uv" in text
    assert "UV_NO_CACHE" not in text
    # The bundle is named only inside the RUN that mounts it: no ENV, no COPY.
    assert not any(line.startswith(("ENV", "COPY")) and CA_SECRET_PATH in line for line in text.splitlines())


def test_buildkit_without_a_ca_trusts_the_system_store():
    text = render(resolve(M, Request("2.6", "12.4")), M, RenderOptions(buildkit=True)).dockerfile
    assert "type=secret" not in text and "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in text
    assert "--mount=type=cache,id=imagebuilder-apt" in text


# --- real BuildKit builds ----------------------------------------------------------------

# CUDA 13: devel gets nvcc from PyPI, so a devel image builds on the plain Debian base (a CUDA 12
# devel image needs nvidia/cuda's nvcc, and the build's nvcc check refuses a base without it).
E2E = ("--torch", "2.13", "--cuda", "13.0", "--os", "debian12")  # support.real_images' DEVEL_TORCH, DEVEL_CUDA


@pytest.fixture(scope="module")
def buildkit_cli(docker_engine):
    """The BuildKit CLI this host has; skips (or fails in CI) where there is none."""
    from support.unavailable import _unavailable

    cli, tried = detect_buildkit()
    if cli is None:
        _unavailable(f"no docker CLI here builds with BuildKit ({'; '.join(tried)})")
    return cli


@pytest.fixture(scope="module")
def marked_ca() -> tuple[Path, bytes]:
    """The session's CA bundle with its marker line (support.real_images.session_ca): what every build
    of the session trusts, so the family's other users are served from these builds' layers."""
    return session_ca()


def _build(base_image: str, repository: str, report: Path, ca: Path, *extra: str) -> dict:
    done = imagebuilder("build", *E2E, "--base-image", base_image, "--repository", repository,
                        "--builder", "buildkit", "--ca-bundle", str(ca), "--report", str(report), *extra)
    assert done.returncode == 0, f"build failed:\n{done.stderr[-4000:]}"
    assert done.stderr.startswith("builder: BuildKit"), done.stderr[:300]
    return json.loads(report.read_text())["images"][0]


@pytest.fixture(scope="module")
def buildkit_images(docker_engine, base_image, buildkit_cli, marked_ca, tmp_path_factory, request):
    """torch 2.13 runtime, then the devel image that needs the same wheels, both with BuildKit
    and --ca-bundle on the local Debian base. Removed after the last test that uses them.

    The family's real builds (support.policy's IMAGE_FAMILIES): its other users (the session's devel
    image, test_publish_buildkit's publishes) run after this module and are served from these
    layers. --no-cache, both: every step runs here with the marked CA (BuildKit keeps secrets out
    of the cache key; through buildx its bytes are in it, and --no-cache makes sure), and the devel install step
    runs even though the runtime's layers are there."""
    repository = f"{TEST_REPOSITORY_PREFIX}/buildkit-{uuid.uuid4().hex[:8]}"
    reports = tmp_path_factory.mktemp("buildkit")
    with released_after_last_use(request, lambda: remove_local_tags(docker_engine, repository)):
        with family_build(request):
            runtime = _build(base_image, repository, reports / "runtime.json", marked_ca[0], "--variant", "runtime",
                             "--no-cache")
            devel = _build(base_image, repository, reports / "devel.json", marked_ca[0], "--variant", "devel",
                           "--no-cache")
        yield {"runtime": runtime, "devel": devel}


def _layers_find(ref: str, needles: list[bytes], chunk: int = 1 << 22) -> set[bytes]:
    """Which of `needles` are in `docker save REF`: in any file of its archive (the config, its
    history) and in every layer's contents, decompressed (the containerd store saves layers as
    it stores them, gzip or zstd: a plain search of the stream finds no file's bytes; measured).
    Read as a stream (an image is GBs); `docker save` must exit 0, or the search proves nothing."""
    import tarfile
    import threading
    import zlib

    keep = max(len(n) for n in needles)
    found: set[bytes] = set()

    def search(blocks: Iterator[bytes]) -> None:
        tail = b""
        for block in blocks:
            found.update(n for n in needles if n in tail + block)
            tail = block[-keep:]

    def raw(f: IO[bytes], first: bytes) -> Iterator[bytes]:
        yield first
        while block := f.read(chunk):
            yield block

    def gunzip(blocks: Iterator[bytes]) -> Iterator[bytes]:
        inflate = zlib.decompressobj(wbits=47)
        for block in blocks:
            while block:
                yield inflate.decompress(block)
                block = inflate.unused_data  # concatenated gzip members
                if block:
                    inflate = zlib.decompressobj(wbits=47)

    def unzstd(blocks: Iterator[bytes]) -> Iterator[bytes]:
        proc = subprocess.Popen(["zstd", "-dc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        stdin = proc.stdin

        def feed() -> None:
            with stdin:
                for block in blocks:
                    stdin.write(block)

        feeder = threading.Thread(target=feed)
        feeder.start()
        while block := proc.stdout.read(chunk):
            yield block
        feeder.join()
        assert proc.wait() == 0, "zstd -dc failed on a layer"

    save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert save.stdout is not None and save.stderr is not None
    files = 0
    try:
        with tarfile.open(fileobj=save.stdout, mode="r|") as archive:
            for member in archive:
                f = archive.extractfile(member) if member.isfile() else None
                if f is None:
                    continue
                files += 1
                first = f.read(4)
                blocks = raw(f, first)
                if first[:2] == b"\x1f\x8b":
                    blocks = gunzip(blocks)
                elif first == b"\x28\xb5\x2f\xfd":
                    blocks = unzstd(blocks)
                search(blocks)
    finally:
        save.stdout.close()
        stderr = save.stderr.read()
        assert save.wait() == 0, f"docker save {ref} exited {save.returncode}: {stderr.decode(errors='replace')[-2000:]}"
    assert files, f"docker save {ref} held no file"
    return found


@pytest.mark.docker
@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_the_layer_search_finds_a_files_bytes_and_fails_on_a_failed_save(docker_engine, base_image, buildkit_cli,
                                                                         tmp_path, compression):
    """The positive control of the CA test's search, on a small image: bytes that are only in a
    layer's file (written by the step, not in its command) are found, in either compression the
    store may hold; what is nowhere is not; a save that fails fails the search."""
    (tmp_path / "Dockerfile").write_text(f"FROM {base_image}\nRUN head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /x"
                                         f" # {uuid.uuid4().hex}\n")
    ref = f"{TEST_REPOSITORY_PREFIX}/layer-search-{uuid.uuid4().hex[:8]}:x"
    done = subprocess.run([*buildkit_cli.command, "--output",
                           f"type=image,name={ref},compression={compression},force-compression=true", str(tmp_path)],
                          env={**os.environ, **({"DOCKER_BUILDKIT": "1"} if buildkit_cli.buildkit_env else {})},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    try:
        content = docker_engine.read_file(ref, "/x")
        assert content is not None and len(content) == 48
        assert _layers_find(ref, [content, uuid.uuid4().hex.encode()]) == {content}
    finally:
        docker_engine.remove_image(ref)
    with pytest.raises(AssertionError, match="docker save .* exited"):
        _layers_find(ref, [content])


@pytest.mark.slow
@pytest.mark.docker
def test_buildkit_ca_bundle_is_in_no_layer_no_history_and_no_env(buildkit_images, docker_engine, marked_ca):
    image = buildkit_images["runtime"]
    ref = image["tags"][0]
    _, marker = marked_ca
    # The install step ran in this build with the marked CA (a step served from the cache would
    # prove nothing about where this build put the bundle).
    assert re.search(r"\+ torch==2\.13\.", Path(image["log"]).read_text()), "the install step did not run"
    # docker save holds every layer (uncompressed tars) and the config with its history. The
    # positive control, in the same stream: a line of the lock the build installed from, which
    # is in a layer (/opt/imagebuilder/requirements.lock): the search does find what is there.
    lock = docker_engine.read_file(ref, "/opt/imagebuilder/requirements.lock")
    assert lock, f"{ref} has no /opt/imagebuilder/requirements.lock for the positive control"
    control = max(lock.splitlines(), key=len)
    assert len(control) > 40, lock[:500]
    assert _layers_find(ref, [marker, control]) == {control}
    history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", ref],
                             capture_output=True, text=True, check=True).stdout
    assert marker.decode() not in history and "BEGIN CERTIFICATE" not in history
    env = docker_engine.inspect_image(ref)["Config"]["Env"]
    assert not [e for e in env if e.startswith(("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"))], env
    run = docker_engine.run(ref, ["bash", "-c", "test ! -e /run/secrets/ca && python -c 'import torch; print(torch.__version__)'"],
                            timeout=300)
    assert run.exit_code == 0 and "2.13." in run.output, run.output


@pytest.mark.slow
@pytest.mark.docker
def test_the_wheel_groups_write_each_file_once_and_leave_no_cache(buildkit_images, docker_engine):
    """The wheel groups' RUNs unpack into a uv cache inside the venv, hard-link from it and remove
    it (install_steps.GROUP_UV_CACHE): each file written once, no cache left in the image, no file of
    the venv with a second link. devel (another apt layer below its groups) ran its own."""
    devel_log = Path(buildkit_images["devel"]["log"]).read_text()
    assert re.search(r"\+ torch==2\.13\.", devel_log) and "+ ninja==" in devel_log  # its installs ran
    for variant in ("runtime", "devel"):
        ref = buildkit_images[variant]["tags"][0]
        run = docker_engine.run(ref, ["bash", "-c", "test -e /opt/venv/.uv-cache && echo cache || echo no-cache; "
                                      "find /opt/venv -type f -links +1 | wc -l; find /opt/venv -type f | wc -l"],
                                timeout=300)
        assert run.exit_code == 0, run.output
        left, linked, files = run.output.split()[-3:]
        assert (left, linked) == ("no-cache", "0") and int(files) > 1000, (variant, run.output)


@pytest.mark.docker
def test_a_failed_buildkit_step_is_named_with_its_last_lines(docker_engine, base_image, buildkit_cli, tmp_path):
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_image}\nRUN echo {uuid.uuid4().hex} && echo 'Could not fetch URL https://pypi.example/simple/' && exit 7\n")
    tag = f"{TEST_REPOSITORY_PREFIX}/failed-{uuid.uuid4().hex[:8]}:x"
    with pytest.raises(BuildFailed) as e:
        BuildKitBuilder(buildkit_cli, docker_engine).build(BuildRequest(context=tmp_path, tags=(tag,),
                                                                        log_path=tmp_path / "build.log"))
    assert (e.value.step, e.value.total, e.value.step_exit_code, e.value.cause) == (2, 2, 7, "network")
    assert e.value.tail[-1] == "Could not fetch URL https://pypi.example/simple/"
    assert "exit code: 7" in (tmp_path / "build.log").read_text()
    assert not docker_engine.image_exists(tag)


@pytest.mark.docker
@pytest.mark.registry
def test_an_estargz_export_is_gzip_with_a_table_of_contents_in_each_layer(docker_engine, base_image, buildkit_cli,
                                                                           registry, tmp_path):
    """--compression estargz for real, on a small image: BuildKit exports eStargz into the
    containerd store, `docker push` sends those blobs as they are (the image id is the pushed
    digest), every layer is gzip to any puller and carries the table of contents a stargz
    snapshotter mounts lazily, and the image runs."""
    from imagebuilder.registry.client import HttpRegistry

    marker = uuid.uuid4().hex
    ref = f"{registry}/estargz-{marker[:8]}:x"
    (tmp_path / "Dockerfile").write_text(f"FROM {base_image}\nRUN echo {marker} > /marker\n")
    try:
        built = BuildKitBuilder(buildkit_cli, DockerEngine()).build(BuildRequest(
            context=tmp_path, tags=(ref,), export=Export(Compression("estargz"))))
        pushed = docker_engine.push(ref)
        assert pushed == built.image_id
        found = HttpRegistry(config={}).manifest(ref)
        assert found is not None
        layers = found[0]["layers"]
        assert len(layers) == 2 and all(layer["mediaType"].endswith("+gzip") for layer in layers), layers
        assert all("containerd.io/snapshot/stargz/toc.digest" in (layer.get("annotations") or {}) for layer in layers)
        assert docker_engine.run(ref, ["cat", "/marker"], timeout=60).output.strip() == marker
    finally:
        remove_local_tags(docker_engine, registry)


@pytest.mark.docker
def test_ctrl_c_stops_a_buildkit_build_and_leaves_nothing(docker_engine, base_image, buildkit_cli, tmp_path):
    import signal
    import sys

    marker = uuid.uuid4().hex
    seconds = 300 + int(marker[:4], 16) % 97  # a `sleep N` no other build runs
    (tmp_path / "Dockerfile").write_text(f"FROM {base_image}\nRUN echo started-{marker} && sleep {seconds}\n")
    tag = f"{TEST_REPOSITORY_PREFIX}/interrupted-{marker[:8]}:x"
    log = tmp_path / "build.log"
    script = (
        "import sys; from pathlib import Path\n"
        "from imagebuilder.engine.buildkit import BuildKitBuilder, BuildKitCli\n"
        "from imagebuilder.engine.api import BuildRequest\n"
        "from imagebuilder.engine.docker import DockerEngine\n"
        f"cli = BuildKitCli({buildkit_cli.command!r}, buildkit_env={buildkit_cli.buildkit_env!r})\n"
        f"BuildKitBuilder(cli, DockerEngine()).build(BuildRequest(context=Path({str(tmp_path)!r}), "
        f"tags=({tag!r},), log_path=Path({str(log)!r})))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (log.is_file() and f"started-{marker}" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the build did not start"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed test leaves no build running: the CLI's session ends it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in output
    assert "build interrupted; the docker CLI was stopped" in log.read_text()
    assert not docker_engine.image_exists(tag)
    # The step's process is gone with the build (BuildKit runs no container that outlives it).
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-f", f"sleep {seconds}"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, f"`sleep {seconds}` still runs after the interrupt"
        time.sleep(1)


# --- arm64 under QEMU ---------------------------------------------------------------------

ARM64_BASE = "imagebuilder-base:bookworm-arm64"
EM_AARCH64 = "b7 00"  # ELF e_machine 183, little-endian


@pytest.fixture(scope="module")
def arm64_image(docker_engine, buildkit_cli, tmp_path_factory, request):
    """torch 2.11 (the first release with aarch64 CUDA wheels) runtime for linux/arm64, built
    under QEMU on the local arm64 Debian base (.ci/arm64-base.sh). Removed after."""
    from support.real_images import ca_bundle_args
    from support.unavailable import _unavailable

    if not docker_engine.image_exists(ARM64_BASE):
        _unavailable(f"{ARM64_BASE} does not exist; create it with .ci/arm64-base.sh {ARM64_BASE}")
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        _unavailable("arm64 binaries do not run here; .ci/qemu.sh registers qemu-aarch64")
    repository = f"{TEST_REPOSITORY_PREFIX}/arm64-{uuid.uuid4().hex[:8]}"
    report = tmp_path_factory.mktemp("arm64") / "report.json"
    with released_after_last_use(request, lambda: remove_local_tags(docker_engine, repository)):
        done = imagebuilder("build", "--torch", "2.11", "--cuda", "13.0", "--os", "debian12",
                            "--platform", "linux/arm64", "--base-image", f"linux/arm64={ARM64_BASE}",
                            "--repository", repository, "--builder", "buildkit", *ca_bundle_args(),
                            "--report", str(report))
        assert done.returncode == 0, f"arm64 build failed:\n{done.stderr[-4000:]}"
        yield {**json.loads(report.read_text())["images"][0], "stderr": done.stderr}


@pytest.mark.slow
@pytest.mark.docker
def test_an_arm64_image_carries_aarch64_cuda_wheels(arm64_image, docker_engine):
    """By content: `import torch` under QEMU hangs, so nothing here runs Python."""
    ref = arm64_image["tags"][0]
    assert ref.endswith("-arm64") and arm64_image["platform"] == "linux/arm64"
    attrs = docker_engine.inspect_image(ref)
    assert (attrs["Os"], attrs["Architecture"]) == ("linux", "arm64")
    site = "/opt/venv/lib/python3.11/site-packages"
    script = (f"cd {site} && uname -m && cat torch-2.11.0.dist-info/WHEEL && ls -d *.dist-info"
              " && od -An -tx1 -j18 -N2 torch/lib/libtorch_cuda.so")
    run = docker_engine.run(ref, ["bash", "-c", script], timeout=600)
    assert run.exit_code == 0, run.output
    lines = [line.strip() for line in run.output.splitlines()]
    assert lines[0] == "aarch64"
    tags = [line.removeprefix("Tag: ") for line in lines if line.startswith("Tag: ")]
    assert tags and all(t.startswith("cp311-cp311-manylinux_") and t.endswith("_aarch64") for t in tags), tags
    manifest = json.loads(docker_engine.run(ref, ["cat", "/opt/imagebuilder/manifest.json"], timeout=300).output)
    for pin in (f"torch-{manifest['torch']}", f"torchvision-{manifest['torchvision']}",
                f"nvidia_cudnn_cu13-{manifest['cudnn']}", f"nvidia_nccl_cu13-{manifest['nccl']}"):
        assert f"{pin}.dist-info" in lines, (pin, lines)
    assert lines[-1] == EM_AARCH64  # libtorch_cuda.so is an aarch64 CUDA build
    # Issue 42: NCCL's fabric libraries, aarch64 builds in the loader's cache, and the variable
    # enroot's pytorch hook looks for.
    cache = docker_engine.run(ref, ["ldconfig", "-p"], timeout=300)
    rdma = {line.split()[0]: line for line in cache.output.splitlines() if ".so" in line
            and any(name in line for name in ("libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"))}
    assert set(rdma) == {"libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"}, cache.output[-2000:]
    assert all("AArch64" in line and "/aarch64-linux-gnu/" in line for line in rdma.values()), rdma
    assert f"PYTORCH_VERSION={manifest['torch']}" in attrs["Config"]["Env"]


# Run by the image's Python under QEMU (it imports no torch): every ELF file of the venv, the
# interpreter its links and scripts name, who owns what.
VENV_FACTS = """
import json, os
elf, foreign, shebangs = 0, [], set()
for root, _, files in os.walk("/opt/venv"):
    for name in files:
        path = os.path.join(root, name)
        if os.path.islink(path):
            continue
        with open(path, "rb") as f:
            head = f.read(20)
        if head[:4] == b"\\x7fELF":
            elf += 1
            if head[18:20] != b"\\xb7\\x00":
                foreign.append(path)
for name in os.listdir("/opt/venv/bin"):
    path = os.path.join("/opt/venv/bin", name)
    if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as f:
            first = f.readline()
        if first.startswith(b"#!"):
            shebangs.add(first.strip().decode())
python = os.path.realpath("/opt/venv/bin/python")
print(json.dumps({"elf": elf, "foreign": foreign[:5], "shebangs": sorted(shebangs), "python": python,
                  "runs": os.access(python, os.X_OK), "cfg": open("/opt/venv/pyvenv.cfg").read(),
                  "owners": {p: [os.stat(p).st_uid, os.stat(p).st_gid, oct(os.stat(p).st_mode & 0o7777)]
                             for p in ("/opt", "/opt/venv", "/opt/venv/lib/python3.11/site-packages")}}))
"""


@pytest.mark.slow
@pytest.mark.docker
def test_an_arm64_image_built_on_amd64_installs_its_wheels_natively(arm64_image, docker_engine):
    """Issue 31: on this amd64 host the aarch64 wheels are installed by uv on the host's own
    platform (no QEMU for uv), into the layers the image's RUNs would write: every shared
    object in the venv is aarch64, the venv's interpreter is the image's Python, its scripts
    run that venv's python, and the owners are those of a venv installed in the image. The
    build said what still ran emulated."""
    (notice,) = [line for line in arm64_image["stderr"].splitlines() if "linux/arm64 on a host of another" in line]
    assert "wheels install natively (uv --python-platform aarch64-manylinux_2_28)" in notice
    assert "apt, the SBOM" in notice and "run under emulation" in notice
    run = docker_engine.run(arm64_image["tags"][0], ["/usr/bin/python3", "-c", VENV_FACTS], timeout=600)
    assert run.exit_code == 0, run.output
    facts = json.loads(run.output.strip().splitlines()[-1])
    assert facts["elf"] > 100 and facts["foreign"] == [], facts
    assert facts["python"] == "/usr/bin/python3.11" and facts["runs"], facts
    assert "home = /usr/bin\n" in facts["cfg"], facts["cfg"]
    assert facts["shebangs"] and all(s.startswith("#!/opt/venv/bin/python") for s in facts["shebangs"]), facts
    assert facts["owners"] == {"/opt": [0, 0, "0o755"], "/opt/venv": [1000, 1000, "0o755"],
                               "/opt/venv/lib/python3.11/site-packages": [1000, 1000, "0o755"]}, facts["owners"]
    # Each wheel group's RUN ran the host's uv from the native-uv stage (through its own loader),
    # writing the venv where it stays: no second copy of the wheels.
    history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", arm64_image["tags"][0]],
                             capture_output=True, text=True, check=True).stdout
    assert history.count('uv="/run/imagebuilder/native/ld.so --library-path') == 8, history
    assert "COPY --link" not in history and "imagebuilder-layers" not in history


@pytest.mark.docker
@pytest.mark.slow
def test_an_arm64_image_installs_its_own_aarch64_lock(arm64_image, docker_engine):
    """pip works under QEMU (it imports no torch): what the image holds is the aarch64 lock,
    not the x86_64 pins."""
    from packaging.utils import canonicalize_name

    from imagebuilder.lock.lockfile import load_locks

    run = docker_engine.run(arm64_image["tags"][0], ["/opt/venv/bin/python", "-m", "pip", "list", "--format=freeze",
                                                     "--disable-pip-version-check"], timeout=600)
    assert run.exit_code == 0, run.output
    installed = {}
    for line in run.output.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            installed[canonicalize_name(name)] = version
    lock = load_locks(REPO_ROOT / "locks").locks["torch2.11.0-cu130-py3.11-runtime-aarch64"]
    assert installed == {p.name: str(p.version) for p in lock.pins}
    # The pins of 2.11 happen to resolve alike on both machines; the lock the build installed
    # from (kept in the image) says for which it was resolved.
    recorded = docker_engine.run(arm64_image["tags"][0], ["cat", "/opt/imagebuilder/requirements.lock"], timeout=300)
    assert recorded.output.strip() == lock.text().strip() and "# platform: aarch64-manylinux_2_28\n" in recorded.output


# --- multi-arch index -----------------------------------------------------------------------


def test_an_index_document_is_canonical_oci_with_one_platform_per_child():
    from imagebuilder.registry.manifests import (DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, index_document,
                                                 platform_entries)

    # An image pushed as an index of its own (the containerd store: the image and its provenance)
    # joins with its platform's image and that image's attestation, one level deep.
    arm, attestation, other = "sha256:" + "c" * 64, "sha256:" + "d" * 64, "sha256:" + "e" * 64
    arm64_index = {"manifests": [
        {"mediaType": OCI_MANIFEST, "size": 481, "digest": arm, "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": OCI_MANIFEST, "size": 565, "digest": attestation, "platform": {"os": "unknown", "architecture": "unknown"},
         "annotations": {"vnd.docker.reference.digest": arm, "vnd.docker.reference.type": "attestation-manifest"}},
        {"mediaType": OCI_MANIFEST, "size": 9, "digest": other, "platform": {"os": "linux", "architecture": "amd64"}}]}
    entries = [*platform_entries("linux/amd64", DOCKER_MANIFEST, 528, "sha256:" + "a" * 64, {}),
               *platform_entries("linux/arm64", OCI_INDEX, 855, "sha256:" + "b" * 64, arm64_index)]
    body = index_document(entries)
    assert body == index_document(list(entries))  # same children, same bytes, same digest
    document = json.loads(body)
    assert document["schemaVersion"] == 2 and document["mediaType"] == OCI_INDEX
    assert [(m["platform"]["os"], m["platform"]["architecture"], m["digest"][7:8]) for m in document["manifests"]] == [
        ("linux", "amd64", "a"), ("linux", "arm64", "c"), ("unknown", "unknown", "d")]
    assert b" " not in body
    with pytest.raises(ValueError, match="has no linux/s390x image"):
        platform_entries("linux/s390x", OCI_INDEX, 855, "sha256:" + "b" * 64, arm64_index)


@pytest.mark.registry
@pytest.mark.docker
def test_a_published_tag_is_an_index_over_amd64_and_arm64(docker_engine, base_image, registry):
    """Every tag of a 2.11 runtime image pushed per platform (TAG-amd64, TAG-arm64; the local
    Debian bases stand in for built images), then `publish --merge-only` makes each TAG an
    OCI index through the registry API; the index's digests resolve to each platform's image."""
    import urllib.request

    from support.unavailable import _unavailable

    from imagebuilder.registry.manifests import ACCEPT, OCI_INDEX
    from imagebuilder.resources import default_matrix_path

    if not docker_engine.image_exists(ARM64_BASE):
        _unavailable(f"{ARM64_BASE} does not exist; create it with .ci/arm64-base.sh {ARM64_BASE}")
    namespace = f"{TEST_REPOSITORY_PREFIX}-index-{uuid.uuid4().hex[:8]}"
    matrix = load_matrix(default_matrix_path())
    coordinates = ("--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--os", "debian12", "--variant", "runtime")
    image = render(resolve(matrix, Request("2.11", "13.0", python="3.11", os="debian12", variant="runtime")), matrix,
                   RenderOptions(repository=f"{registry}/{namespace}/pytorch"))
    try:
        pushed = {}
        for source, platform in ((base_image, "linux/amd64"), (ARM64_BASE, "linux/arm64")):
            for ref in image.refs:
                child = f"{ref}-{platform.rpartition('/')[2]}"
                subprocess.run(["docker", "tag", source, child], check=True)
                pushed[platform] = docker_engine.push(child)
        merge = ("publish", *coordinates, "--registry", f"{registry}/{namespace}",
                 "--platform", "linux/amd64,linux/arm64", "--merge-only")
        first, again = imagebuilder(*merge), imagebuilder(*merge)
        assert first.returncode == 0, first.stderr
        # Same children, same index digest: the rerun finds each index there and writes nothing.
        assert first.stdout.replace(": written ", ": unchanged ") == again.stdout
        written = [line for line in first.stdout.splitlines() if line.startswith("index ")]
        assert len(written) == len(image.refs)
        assert all(": written sha256:" in w and "over linux/amd64, linux/arm64" in w for w in written)

        name = f"{namespace}/pytorch"

        def get(path: str) -> tuple[str, dict]:
            request = urllib.request.Request(f"http://{registry}/v2/{name}/{path}", headers={"Accept": ACCEPT})
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.headers["Content-Type"], json.loads(response.read())

        # A child pushed as an index (the containerd store's arm64 base: image + provenance)
        # joins with its platform's image: the index over platforms is one level deep.
        images = {}
        for platform, digest in pushed.items():
            media_type, document = get(f"manifests/{digest}")
            images[platform] = digest if media_type != OCI_INDEX else next(
                m["digest"] for m in document["manifests"]
                if f"{m['platform']['os']}/{m['platform']['architecture']}" == platform)
        for ref in image.refs:
            media_type, index = get(f"manifests/{ref.rpartition(':')[2]}")
            assert media_type == OCI_INDEX and index["mediaType"] == OCI_INDEX
            platforms = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
                         for m in index["manifests"] if m["platform"]["os"] != "unknown"}
            assert platforms == images
            assert all(m["mediaType"] != OCI_INDEX for m in index["manifests"])
        for platform, digest in images.items():
            _, manifest = get(f"manifests/{digest}")  # the digest resolves ...
            _, config = get(f"blobs/{manifest['config']['digest']}")
            assert f"{config['os']}/{config['architecture']}" == platform  # ... to that platform's image
    finally:
        remove_local_tags(docker_engine, namespace)
