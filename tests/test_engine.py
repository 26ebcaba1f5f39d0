"""DockerEngine against the real daemon, with tiny Dockerfiles on the local base image.

Nothing here needs the network: every image is FROM the debootstrap base plus RUN echo/COPY.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from imagebuilder.engine.errors import (BaseImageMissing, BuildFailed, BuildTimedOut, DaemonUnavailable, ImageMissing,
                                        PushFailed, TagFailed)
from imagebuilder.engine.api import BuildRequest, Progress
from imagebuilder.engine.docker import DockerEngine
from imagebuilder.engine.classic import ClassicBuilder
from imagebuilder.engine.errors import classify_failure

# Containers of the base image and classic builds of tiny images on it, no BuildKit and no
# torch image of the session's: CI runs these beside the builds (.ci/run, beside_builds).
pytestmark = pytest.mark.beside_builds

REPO_ROOT = Path(__file__).resolve().parent.parent
docker = pytest.mark.docker


@pytest.fixture
def context(tmp_path: Path) -> Callable[[str], Path]:
    """Writes a build context holding the given Dockerfile and a small file to COPY."""

    def write(dockerfile: str) -> Path:
        ctx = tmp_path / "context"
        ctx.mkdir(exist_ok=True)
        (ctx / "hello.txt").write_text("hello\n")
        (ctx / "Dockerfile").write_text(textwrap.dedent(dockerfile).lstrip())
        return ctx

    return write


def _containers_running(marker: str) -> set[str]:
    """Ids of all containers (any state) whose command contains `marker`.

    Others build on the same daemon at the same time, so a test recognises its own
    containers by a unique marker in their command, never by image or creation time.
    """
    out = subprocess.run(
        ["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout
    return {line.split()[0] for line in out.splitlines() if marker in line}


@pytest.fixture
def marker(image_repo: str) -> str:
    """A string unique to this test, to put in the commands of its containers."""
    return image_repo.rsplit("-", 1)[-1]


# --------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("error", "tail", "cause"),
    [
        ("returned a non-zero code: 1", ["ERROR: No matching distribution found for tourch"], None),
        ("returned a non-zero code: 1",
         ["Could not fetch URL https://pypi/simple/x/: There was a problem confirming the ssl "
          "certificate: [SSL: CERTIFICATE_VERIFY_FAILED]"], "network"),
        ("returned a non-zero code: 2", ["  cause: invalid peer certificate: UnknownIssuer"], "network"),
        ("returned a non-zero code: 1",
         ["Failed to establish a new connection: [Errno -2] Name or service not known"], "network"),
        ("returned a non-zero code: 1", ["ConnectionResetError(104, 'Connection reset by peer')"],
         "network"),
        ("returned a non-zero code: 1", ["OSError: [Errno 28] No space left on device"], "disk-full"),
        ("write /var/lib/docker/tmp/x: no space left on device", [], "disk-full"),
    ],
)
def test_classify_failure(error: str, tail: list[str], cause: str | None) -> None:
    assert classify_failure(error, tail) == cause


CLASSIC_STREAM = [
    "Step 1/6 : ARG BASE_IMAGE=base:1\n", "Step 2/6 : FROM ${BASE_IMAGE} AS wheels\n", " ---> aaaaaaaaaaaa\n",
    "Step 3/6 : RUN pip ", "install x\n", " ---> Running in cccccccccccc\n", "Collecting x\nDone\n",
    "Removing intermediate container cccccccccccc\n", " ---> bbbbbbbbbbbb\n",
    "Step 4/6 : FROM ${BASE_IMAGE}\n", " ---> aaaaaaaaaaaa\n",
    "Step 5/6 : COPY --from=wheels /opt/venv /opt/venv\n", " ---> Using cache\n", " ---> dddddddddddd\n",
    "Step 6/6 : LABEL a=b\n", " ---> Running in eeeeeeeeeeee\n", " ---> ffffffffffff\n",
    "Successfully built ffffffffffff\n",
]


def test_classic_stream_parser_on_canned_output() -> None:
    from imagebuilder.engine.classic_stream import BuildState as _BuildState

    events: list[Progress] = []
    state = _BuildState(time.monotonic(), events.append)
    for chunk in CLASSIC_STREAM:
        state.feed(chunk)
    state.flush()
    assert [(e.step, e.total, e.cached, e.line) for e in events] == [
        (1, 6, False, None), (2, 6, False, None), (3, 6, False, None), (3, 6, False, "Collecting x"),
        (3, 6, False, "Done"), (4, 6, False, None), (5, 6, False, None), (5, 6, True, None), (6, 6, False, None)]
    assert events[2].instruction == "RUN pip install x"  # a step line split across chunks
    assert state.image_id == "ffffffffffff" and state.cached_steps == 1 and state.from_steps == 2
    assert state.containers == {"cccccccccccc", "eeeeeeeeeeee"}
    # The first stage's last image is what a multi-stage build leaves behind; the base
    # image's id after a FROM is not a stage image.
    assert state.stage_images == ["bbbbbbbbbbbb"]
    cached = _BuildState(time.monotonic(), None)
    for chunk in CLASSIC_STREAM:
        cached.feed(chunk.replace(" ---> Running in cccccccccccc\n", " ---> Using cache\n"))
    assert cached.stage_images == []  # a stage from the cache is an earlier build's: not ours to remove


def test_network_hint_names_the_host_and_skips_ca_advice_when_a_ca_was_given() -> None:
    from imagebuilder.engine.errors import network_hint

    tail = ["error: Request failed after 3 retries", "  Caused by: error sending request for url "
            "(http://127.0.0.1:9/simple/torch/)", "  Caused by: tcp connect error: Connection refused"]
    with_ca = network_hint(tail, ca_bundle_given=True)
    assert "127.0.0.1:9" in with_ca and "--index-url" in with_ca and "--ca-bundle" not in with_ca
    assert "--ca-bundle" in network_hint(tail, ca_bundle_given=False)


def test_a_listing_the_daemon_answers_with_404_while_another_build_removes_an_image_is_retried() -> None:
    """The containerd image store answers `GET /images/json?all=1` with a 404 when an image it
    lists is removed meanwhile (another build's clean-up on the shared daemon; seen in CI)."""
    import docker

    class Api:
        calls = 0

        def images(self, all: bool) -> list[dict[str, str]]:  # noqa: A002 (the SDK's name)
            Api.calls += 1
            if Api.calls < 3:
                raise docker.errors.NotFound("404 Client Error: Not Found for url: .../images/json")
            return [{"Id": "sha256:a", "ParentId": ""}]

    class Client:
        api = Api()

    class Engine:
        client = Client()

    builder = ClassicBuilder(Engine())  # type: ignore[arg-type]
    builder._hooked = True  # no response hook on a fake client
    assert builder._listed_images() == [{"Id": "sha256:a", "ParentId": ""}]
    assert Api.calls == 3

    Api.calls = -10  # a 404 that stays is the daemon's fault, said as one
    with pytest.raises(docker.errors.NotFound):
        builder._listed_images()


def test_importing_the_engine_does_not_import_docker() -> None:
    code = "import sys, imagebuilder.engine; sys.exit('docker' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, timeout=60).returncode == 0


def test_no_daemon_names_the_socket_and_how_to_start_one(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/docker.sock"
    with pytest.raises(DaemonUnavailable) as e:
        DockerEngine(url).ping()
    assert e.value.base_url == url
    assert url in str(e.value) and "dockerd" in str(e.value)


# --------------------------------------------------------------------------- build


@docker
def test_build_applies_all_tags_and_labels_reports_progress_and_writes_log(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    ctx = context(f"""
        FROM {base_image}
        COPY hello.txt /hello.txt
        RUN echo built-line-1 && echo built-line-2
    """)
    tags = (f"{image_repo}:1.0", f"{image_repo}:latest")
    events: list[Progress] = []
    log = tmp_path / "logs" / "build.log"
    result = ClassicBuilder(docker_engine).build(
        BuildRequest(ctx, tags, {"org.opencontainers.image.revision": "abc123"}, log_path=log,
                     nocache=True),
        events.append,
    )

    assert result.tags == tags
    assert result.image_id.startswith("sha256:")
    assert result.size > 0 and result.seconds > 0
    assert (result.steps, result.cached_steps, result.executed_steps) == (4, 0, 3)  # + LABEL step
    for tag in tags:
        assert docker_engine.image_labels(tag)["org.opencontainers.image.revision"] == "abc123"
    starts = [(e.step, e.total) for e in events if e.line is None]
    assert starts == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [e.line for e in events if e.step == 3 and e.line] == ["built-line-1", "built-line-2"]
    assert all(b.elapsed >= a.elapsed for a, b in zip(events, events[1:]))
    text = log.read_text()
    assert "Step 3/4 : RUN echo built-line-1" in text and "built-line-2" in text
    assert result.log_path == log


@docker
def test_second_identical_build_is_fully_cached(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path],
) -> None:
    ctx = context(f"""
        FROM {base_image}
        COPY hello.txt /hello.txt
        RUN echo cached-build
    """)
    request = BuildRequest(ctx, (f"{image_repo}:1",), {"purpose": "cache-test"})
    first = ClassicBuilder(docker_engine).build(request)
    cached: list[Progress] = []
    second = ClassicBuilder(docker_engine).build(request, cached.append)

    assert second.image_id == first.image_id
    assert second.executed_steps == 0
    assert second.cached_steps == second.steps - 1  # every step but FROM
    assert [e.step for e in cached if e.cached] == [2, 3, 4]


@docker
def test_failing_run_step_reports_step_and_last_lines_and_leaves_no_tag(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    ctx = context(f"""
        FROM {base_image}
        RUN echo fine
        RUN for i in $(seq 1 40); do echo line-$i; done; exit 3
        RUN echo never
    """)
    tags = (f"{image_repo}:1", f"{image_repo}:2")
    log = tmp_path / "build.log"
    with pytest.raises(BuildFailed) as e:
        ClassicBuilder(docker_engine).build(BuildRequest(ctx, tags, {}, log_path=log))

    failed = e.value
    assert (failed.step, failed.total) == (3, 4)
    assert failed.instruction is not None and failed.instruction.startswith("RUN for i in")
    assert failed.tail == tuple(f"line-{i}" for i in range(11, 41))  # the last 30
    assert failed.step_exit_code == 3 and failed.cause is None
    assert failed.log_path == log and "line-1\n" in log.read_text()
    assert "step 3/4" in str(failed) and "exit code 3" in str(failed) and str(log) in str(failed)
    assert "\n" not in str(failed)
    assert "line-40" in failed.report()
    assert not any(docker_engine.image_exists(tag) for tag in tags)
    # The image step 2 made is not left behind untagged (the log names it: " ---> <id>").
    made = re.findall(r"^ ---> ([0-9a-f]{12})$", log.read_text().split("Step 2/4", 1)[1], re.M)
    assert made and not any(docker_engine.image_exists(image_id) for image_id in made)


@docker
@pytest.mark.parametrize(
    ("output", "cause", "advice"),
    [
        ("WARNING: Retrying ... Could not fetch URL https://index/simple/six/: "
         "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed", "network", "--ca-bundle"),
        ("OSError: [Errno 28] No space left on device", "disk-full", "docker system prune"),
    ],
)
def test_failing_step_says_when_network_or_disk_was_the_cause(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path],
    output: str, cause: str, advice: str,
) -> None:
    ctx = context(f"""
        FROM {base_image}
        RUN echo '{output}' >&2; exit 1
    """)
    with pytest.raises(BuildFailed) as e:
        ClassicBuilder(docker_engine).build(BuildRequest(ctx, (f"{image_repo}:1",), {}))
    assert e.value.cause == cause
    assert advice in str(e.value)


@docker
@pytest.mark.parametrize("dockerfile", [
    "FROM {missing} AS build\nRUN echo unreachable\n",
    # The stream shows `FROM ${{BASE_IMAGE}}` unexpanded: the error names the image itself.
    "ARG BASE_IMAGE={missing}\nFROM ${{BASE_IMAGE}}\nRUN echo unreachable\n",
], ids=["named", "build-arg-default"])
def test_missing_base_image_names_it_and_suggests_base_image_flag(
    docker_engine: DockerEngine, image_repo: str, context: Callable[[str], Path], dockerfile: str,
) -> None:
    missing = f"{image_repo}-no-such-base:0"
    ctx = context(dockerfile.format(missing=missing))
    with pytest.raises(BaseImageMissing) as e:
        ClassicBuilder(docker_engine).build(BuildRequest(ctx, (f"{image_repo}:1",), {}))
    assert e.value.image == missing
    assert missing in str(e.value) and "--base-image" in str(e.value) and "${BASE_IMAGE}" not in str(e.value)


def _image_gone(engine: DockerEngine, image_id: str) -> bool:
    return not engine.image_exists(image_id)


@docker
def test_a_build_removes_its_earlier_stages_and_the_image_a_rebuild_untagged(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path], marker: str,
) -> None:
    dockerfile = f"""
        FROM {base_image} AS first
        RUN echo {marker}-stage > /stage.txt
        FROM {base_image}
        COPY --from=first /stage.txt /stage.txt
        RUN echo {{}} > /version.txt
        LABEL io.imagebuilder.test=after-the-change
    """
    tag = f"{image_repo}:1"
    first = ClassicBuilder(docker_engine).build(BuildRequest(context(dockerfile.format("one")), (tag,), {}))
    assert len(first.removed) == 1  # the first stage's image: untagged, nobody asked for it
    assert _image_gone(docker_engine, first.removed[0])
    changed_step = docker_engine.inspect_image(first.image_id)["Parent"]  # `RUN echo one`: only it has it
    second = ClassicBuilder(docker_engine).build(BuildRequest(context(dockerfile.format("two")), (tag,), {}))
    assert second.image_id != first.image_id
    assert first.image_id in second.removed and _image_gone(docker_engine, first.image_id)
    # The step under it went with it (the daemon's own prune of untagged parents, or the
    # builder's where the containerd store keeps them); the base they share stayed.
    assert _image_gone(docker_engine, changed_step)
    assert docker_engine.image_exists(tag) and docker_engine.image_exists(base_image)


@docker
def test_a_rebuild_keeps_the_previous_image_while_another_tag_names_it(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path], marker: str,
) -> None:
    keep, moving = f"{image_repo}:kept", f"{image_repo}:moving"
    first = ClassicBuilder(docker_engine).build(BuildRequest(context(f"FROM {base_image}\nRUN echo {marker}-a\n"), (keep, moving), {}))
    second = ClassicBuilder(docker_engine).build(BuildRequest(context(f"FROM {base_image}\nRUN echo {marker}-b\n"), (moving,), {}))
    assert first.image_id not in second.removed and docker_engine.image_exists(keep)


@docker
def test_a_tag_that_cannot_be_applied_removes_the_tags_already_applied(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path],
) -> None:
    ctx = context(f"FROM {base_image}\nRUN echo tag-test\n")
    good, bad = f"{image_repo}:ok", f"{image_repo}:Bad Tag"
    with pytest.raises(TagFailed) as e:
        ClassicBuilder(docker_engine).build(BuildRequest(ctx, (good, bad), {}))
    assert e.value.tag == bad
    assert not docker_engine.image_exists(good)


@docker
def test_build_over_its_timeout_is_stopped_and_cleaned_up(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path],
    marker: str,
) -> None:
    ctx = context(f"FROM {base_image}\nRUN echo {marker}; sleep 60\n")
    started = time.monotonic()
    with pytest.raises(BuildTimedOut) as e:
        ClassicBuilder(docker_engine).build(BuildRequest(ctx, (f"{image_repo}:1",), {}, nocache=True, timeout=4))
    assert time.monotonic() - started < 30
    assert e.value.step == 2
    assert not _containers_running(marker)
    assert not docker_engine.image_exists(f"{image_repo}:1")


_INTERRUPT_DRIVER = """
import sys
from pathlib import Path
from imagebuilder.engine.api import BuildRequest
from imagebuilder.engine.docker import DockerEngine
from imagebuilder.engine.classic import ClassicBuilder

def progress(p):
    if p.line == "sleeping":
        print("SLEEPING", flush=True)

try:
    ClassicBuilder(DockerEngine()).build(BuildRequest(Path(sys.argv[1]), (sys.argv[2],), {}, nocache=True), progress)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    sys.exit(130)
print("FINISHED", flush=True)
"""


@docker
def test_ctrl_c_stops_the_build_and_removes_its_containers(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path],
    tmp_path: Path, marker: str,
) -> None:
    ctx = context(f"""
        FROM {base_image}
        RUN echo sleeping; sleep 30 # {marker}
        RUN echo after # {marker}
    """)
    driver = tmp_path / "driver.py"
    driver.write_text(_INTERRUPT_DRIVER)
    tag = f"{image_repo}:1"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, str(driver), str(ctx), tag], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "SLEEPING":
            pytest.fail(f"the build driver did not reach the sleep step: {proc.communicate()}")
        assert _containers_running(marker), "the RUN sleep step should have a container"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "INTERRUPTED" in out
    assert not _containers_running(marker)
    assert not docker_engine.image_exists(tag)


# --------------------------------------------------------------------------- run


@docker
def test_run_returns_output_and_exit_code_and_removes_its_container(
    docker_engine: DockerEngine, base_image: str, marker: str,
) -> None:
    script = f"echo out; echo $GREETING >&2; exit 4 # {marker}"
    result = docker_engine.run(base_image, ["sh", "-c", script], timeout=60,
                               environment={"GREETING": "hi"})
    assert (result.exit_code, result.timed_out) == (4, False)
    assert sorted(result.output.split()) == ["hi", "out"]  # the two streams may interleave
    assert not _containers_running(marker)


@docker
def test_run_tells_each_line_as_it_is_printed(docker_engine: DockerEngine, base_image: str, marker: str) -> None:
    """verify shows each check as it ends: a line printed 2 s before the container ends arrives before that."""
    arrived: list[tuple[str, float]] = []

    def told(line: str) -> None:
        arrived.append((line, time.monotonic()))

    script = f"echo first; sleep 2; echo second >&2 # {marker}"
    started = time.monotonic()
    result = docker_engine.run(base_image, ["sh", "-c", script], timeout=60, on_output=told)
    ended = time.monotonic()
    assert [line for line, _ in arrived] == ["first", "second"] and "first" in result.output
    assert arrived[0][1] < ended - 1, "the first line came only when the container ended"
    assert started < arrived[0][1]
    assert not _containers_running(marker)


@docker
def test_run_enforces_its_timeout(docker_engine: DockerEngine, base_image: str, marker: str) -> None:
    started = time.monotonic()
    result = docker_engine.run(base_image, ["sh", "-c", f"echo started; sleep 60 # {marker}"],
                               timeout=2)
    assert result.timed_out and result.exit_code != 0
    assert "started" in result.output
    assert time.monotonic() - started < 30
    assert not _containers_running(marker)


@docker
def test_run_of_a_missing_image_says_so(docker_engine: DockerEngine, image_repo: str) -> None:
    with pytest.raises(ImageMissing):
        docker_engine.run(f"{image_repo}:absent", ["true"], timeout=10)
    with pytest.raises(ImageMissing):
        docker_engine.image_labels(f"{image_repo}:absent")


# --------------------------------------------------------------------------- push


def _registry_digest(registry: str, repository: str, tag: str) -> str:
    request = urllib.request.Request(
        f"http://{registry}/v2/{repository}/manifests/{tag}",
        method="HEAD",
        headers={"Accept": ", ".join([
            "application/vnd.docker.distribution.manifest.v2+json",
            "application/vnd.oci.image.manifest.v1+json",
        ])},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.headers["Docker-Content-Digest"])


@docker
@pytest.mark.registry
def test_push_returns_the_digest_the_registry_stored(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path],
    registry: str,
) -> None:
    ref = f"{registry}/{image_repo}:1"
    ClassicBuilder(docker_engine).build(BuildRequest(context(f"FROM {base_image}\nRUN echo pushed\n"), (ref,), {}))
    digest = docker_engine.push(ref)
    assert digest.startswith("sha256:")
    assert digest == _registry_digest(registry, image_repo, "1")
    catalog = json.load(urllib.request.urlopen(f"http://{registry}/v2/_catalog", timeout=10))
    assert image_repo in catalog["repositories"]


@docker
def test_push_to_a_registry_that_does_not_answer_fails_after_retries(
    docker_engine: DockerEngine, base_image: str, image_repo: str, context: Callable[[str], Path],
    free_port: int,
) -> None:
    ref = f"127.0.0.1:{free_port}/{image_repo}:1"
    ClassicBuilder(docker_engine).build(BuildRequest(context(f"FROM {base_image}\nRUN echo unpushed\n"), (ref,), {}))
    with pytest.raises(PushFailed) as e:
        docker_engine.push(ref, retries=2, backoff=0.1)
    assert e.value.attempts == 2 and e.value.ref == ref
    assert "connection refused" in e.value.detail.lower()


@pytest.mark.parametrize("instruction, expected", [
    ("FROM debian:12", ("debian:12", None, None)),
    ("FROM --platform=linux/arm64 ${BASE_IMAGE} AS venv", ("${BASE_IMAGE}", "venv", "linux/arm64")),
    ("from scratch as empty", ("scratch", "empty", None)),
    ("FROM", ("", None, None)),
    ("RUN echo FROM x", None),
])
def test_the_one_from_line_parser(instruction: str, expected: tuple[str, str | None, str | None] | None) -> None:
    from imagebuilder.engine.dockerfile import parse_from

    line = parse_from(instruction)
    assert (None if line is None else (line.image, line.stage, line.platform)) == expected


def test_only_the_engine_package_and_registry_auth_import_docker() -> None:
    """The Docker SDK stays behind engine/ (and docker's own credential lookup in registry/auth.py)."""
    import ast

    package = REPO_ROOT / "imagebuilder"
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(name == "docker" or name.startswith("docker.") for name in names):
                importers.add(path.relative_to(package).as_posix())
    assert {p for p in importers if not p.startswith("engine/")} == {"registry/auth.py"}, importers


def test_a_failed_pull_keeps_the_daemons_cause_not_docker_pys_url() -> None:
    import docker

    from imagebuilder.engine.errors import PullFailed

    cause = ("pull access denied for nope, repository does not exist or may require 'docker login': "
             "denied: requested access to the resource is denied")
    long_url = "http+docker://localhost/v1.47/images/create?tag=1&fromImage=" + "x" * 300

    class Api:
        def pull(self, ref: str, stream: bool, decode: bool) -> None:
            raise docker.errors.APIError(f"404 Client Error for {long_url}: Not Found", explanation=cause)

    class Client:
        api = Api()

    engine = DockerEngine("unix:///nonexistent")
    engine._client_obj = Client()  # type: ignore[assignment]
    with pytest.raises(PullFailed) as caught:
        engine.pull("nope:1")
    assert caught.value.detail == cause


@pytest.mark.parametrize(("env", "choice", "buildx", "says"), [
    ({}, "buildkit", None, "--builder buildkit needs a docker CLI with BuildKit"),
    ({"IMAGEBUILDER_BUILDER": "buildkit"}, "buildkit", None, "IMAGEBUILDER_BUILDER=buildkit needs a docker CLI"),
    ({"BUILDX_BUILDER": "remote"}, "auto", "remote", "BUILDX_BUILDER=remote needs a docker CLI with BuildKit"),
    ({"IMAGEBUILDER_BUILDER": "classic"}, "classic", "remote",
     "--buildx-builder remote needs a BuildKit builder, but IMAGEBUILDER_BUILDER=classic asks for the classic one"),
])
def test_a_builder_error_names_the_setting_the_user_made(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                         choice: str, buildx: str | None, says: str) -> None:
    from imagebuilder.engine import select
    from imagebuilder.errors import BadRequest

    for name in ("IMAGEBUILDER_BUILDER", "BUILDX_BUILDER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(select, "detect_buildkit", lambda builder=None: (None, ["docker: no buildx"]))
    with pytest.raises(BadRequest) as caught:
        select.decide(choice, buildx)
    assert str(caught.value).startswith(says)
