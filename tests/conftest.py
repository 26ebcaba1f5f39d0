"""Shared fixtures and the hooks that apply the suite's policy. Docker fixtures skip without a
daemon, or fail when CI demands one (support.unavailable).

What the test modules share besides fixtures lives in tests/support/, a module per concern:
policy tables (support.policy), the real CLI and the session's images' coordinates
(support.real_images), the session's BuildKit records (support.build_cache), local registries
(support.registry), cleanup, fakes, host runs of the smoke suite. Import from there, not from here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from build_records import build_cache_records, prune_records
from fault_proxy import FaultProxy
from support.build_cache import (_SESSION_CACHE, _buildkit_cli, after_test, family_build,
                                 released_after_last_use)
from support.apt_repo import AptRepo, served
from support.cleanup import remove_images, remove_local_tags
from support.cosign_keys import cosign_key_pair
from support.fuzz import hypothesis_profiles
from support.policy import FAILING_EARLY, FAMILY_OF, FIXTURE_MARKERS, OTHER_REAL_BUILDS, _group_the_families
from support.real_images import (DEFAULT_BASE_IMAGE, DEVEL_CUDA, DEVEL_TORCH, E2E_OS, SIGNED_CUDA,
                                 SIGNED_OS, SIGNED_TORCH, TEST_REPOSITORY_PREFIX, build_cli, ca_bundle_args,
                                 imagebuilder)
from support.registry import _free_port, running_registry, throwaway_registry
from support.ssh_host import SSHD, SshDockerHost
from support.unavailable import _unavailable

if TYPE_CHECKING:
    from imagebuilder.engine.docker import DockerEngine

hypothesis_profiles()


# --- hooks: a test carries the markers of what it needs; a family's users run together --------


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background by a non-interactive shell (`cmd &`, nohup) inherits
    SIGINT ignored, and so would every process it starts; the Ctrl-C tests press Ctrl-C as a
    terminal does, on processes that have Python's default handler."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # What imagebuilder keeps between commands (the main suite's dependency graph, converted
    # layers): the session's own, so no test reads what an earlier run or the user left.
    if "IMAGEBUILDER_CACHE_DIR" not in os.environ:
        os.environ["IMAGEBUILDER_CACHE_DIR"] = tempfile.mkdtemp(prefix="imagebuilder-test-cache-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop("IMAGEBUILDER_CACHE_DIR"), ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run a test whose fixtures need more than its markers say."""
    missing = []
    building = set(FAMILY_OF) | {function for _file, function in OTHER_REAL_BUILDS.keys() - FAILING_EARLY.keys()}
    for item in items:
        marked = {mark.name for mark in item.iter_markers()}
        needed = set().union(*(FIXTURE_MARKERS.get(name, frozenset()) for name in getattr(item, "fixturenames", ())))
        if needed - marked:
            missing.append(f"{item.nodeid}: mark it {', '.join(sorted(needed - marked))}")
        # The session beside the builds never prunes and runs beside them: no torch image of its own.
        builds = building & {*getattr(item, "fixturenames", ()), getattr(item, "originalname", item.name)}
        if "beside_builds" in marked and builds:
            missing.append(f"{item.nodeid}: beside_builds, but it builds ({', '.join(sorted(builds))}): drop the mark")
    if missing:
        raise pytest.UsageError("tests whose markers do not fit their fixtures (see FIXTURE_MARKERS and the "
                                "builds in tests/support/policy.py):\n  " + "\n  ".join(missing))
    _group_the_families(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    after_test(item)

# --- the daemon, its base image, a repository per test -------------------------------------


@pytest.fixture(scope="session")
def docker_engine() -> DockerEngine:
    """A DockerEngine whose daemon answers; skips (or fails in CI) otherwise."""
    from imagebuilder.engine.errors import DaemonUnavailable
    from imagebuilder.engine.docker import DockerEngine

    engine = DockerEngine()
    try:
        engine.ping()
    except DaemonUnavailable as e:
        _unavailable(f"{e} (.ci/docker-up.sh starts one)")
    return engine


@pytest.fixture(scope="session")
def base_image(docker_engine: DockerEngine) -> str:
    """A small local Debian image to build FROM; IMAGEBUILDER_BASE_IMAGE overrides it."""
    ref = os.environ.get("IMAGEBUILDER_BASE_IMAGE", DEFAULT_BASE_IMAGE)
    if not docker_engine.image_exists(ref):
        _unavailable(f"base image {ref} does not exist; create it with .ci/base-image.sh {ref}")
    return ref


@pytest.fixture
def image_repo(docker_engine: DockerEngine, request: pytest.FixtureRequest) -> Iterator[str]:
    """A repository name unique to this test; every image tagged with it is removed after.

    Tags pushed to a local registry (127.0.0.1:PORT/<repo>) are caught too: cleanup
    removes every local tag that contains the unique repository name.
    """

    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    repo = f"{TEST_REPOSITORY_PREFIX}/{slug}-{uuid.uuid4().hex[:8]}"
    yield repo
    remove_local_tags(docker_engine, repo)

# --- ports and registries ------------------------------------------------------------------


@pytest.fixture
def free_port() -> int:
    """A loopback TCP port nothing listens on (right now)."""
    return _free_port()


@pytest.fixture
def registry() -> Iterator[str]:
    """A throwaway registry on 127.0.0.1:PORT for one test (no Docker engine needed: mark the
    test `registry`); yields that address."""
    with throwaway_registry() as address:
        yield address

@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """A registry for one test module, for tests that put a fault proxy in front of it."""
    with throwaway_registry() as address:
        yield address


@pytest.fixture
def proxy(upstream: str) -> Iterator[FaultProxy]:
    """tests/fault_proxy.py in front of `upstream`, for one test: inject() its faults."""
    with FaultProxy(upstream) as running:
        yield running


# --- real images, built once per test session (support.policy's families) ----------------


@pytest.fixture(scope="session")
def runtime_image(docker_engine: DockerEngine, base_image: str, tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Iterator[dict]:
    """The issue's main job for real: torch 2.6 for CUDA 12.1, runtime, on the local Debian
    base, through the CLI. Yields the build report's image entry; removes the image (and the
    images built FROM it in its repository) after the last test that uses it."""
    repository = f"{TEST_REPOSITORY_PREFIX}/e2e-{uuid.uuid4().hex[:8]}"
    with released_after_last_use(request, lambda: remove_local_tags(docker_engine, repository)):
        with family_build(request):
            report = build_cli(base_image, repository, tmp_path_factory.mktemp("build") / "report.json",
                               "--variant", "runtime")
        entry = report["images"][0]
        entry["repository"] = repository
        entry["stderr"], entry["stdout"] = report["stderr"], report["stdout"]
        yield entry


@pytest.fixture(scope="session")
def jupyter_image(docker_engine: DockerEngine, base_image: str, runtime_image: dict, tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Iterator[dict]:
    """JupyterLab on the runtime image, built once (test_e2e's and test_cluster_runtimes' tests);
    removed after the last test that uses it. Yields the build report."""
    tags: list[str] = []
    with released_after_last_use(request, lambda: remove_images(docker_engine, tags)):
        with family_build(request):
            report = build_cli(base_image, runtime_image["repository"], tmp_path_factory.mktemp("jupyter") / "r.json",
                               "--variant", "jupyter")
        tags += [t for image in report["images"] for t in image["tags"]]
        yield report




@pytest.fixture(scope="session")
def devel_image(docker_engine: DockerEngine, base_image: str, tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[dict]:
    """A devel image (torch 2.13, CUDA 13.0, Debian base) built once per session through the
    CLI (its family's: served from test_buildkit's layers, which run first); the devel-jupyter
    image is built FROM it. Yields the build report's image entry; removes both after the last
    test that uses it."""
    import json

    repository = f"{TEST_REPOSITORY_PREFIX}/devel-{uuid.uuid4().hex[:8]}"
    report = tmp_path_factory.mktemp("devel") / "report.json"
    with released_after_last_use(request, lambda: remove_local_tags(docker_engine, repository)):
        with family_build(request):
            done = imagebuilder("build", "--torch", DEVEL_TORCH, "--cuda", DEVEL_CUDA, "--os", E2E_OS, "--variant",
                                "devel", "--builder", "auto", "--base-image", base_image, "--repository", repository,
                                *ca_bundle_args(), "--report", str(report))
        assert done.returncode == 0, f"build failed:\n{done.stderr[-4000:]}"
        entry = json.loads(report.read_text())["images"][0]
        entry["repository"] = repository
        yield entry


@pytest.fixture(scope="session")
def devel_verdict(devel_image: dict) -> dict:
    """`imagebuilder verify` of the session's devel image, run once (the devel check: nvcc, a CUDA
    extension built and loaded, ~60 s): test_workspace judges it, and test_publish_buildkit's devel
    publish, the same content (its inputs hash, asserted there), replays it (support.replay)."""
    import json

    done = imagebuilder("verify", devel_image["tags"][0], "--allow-no-gpu", "--json", timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    verdict: dict = json.loads(done.stdout)
    return verdict


@pytest.fixture(scope="session")
def signing_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three cosign key pairs: ours (no password), another, and one locked with a password."""
    import shutil

    if shutil.which("cosign") is None:
        _unavailable("cosign is missing: .ci/cosign-install.sh installs it")
    root = tmp_path_factory.mktemp("keys")
    key, pub = cosign_key_pair(root / "ours")
    _, other = cosign_key_pair(root / "other")
    locked, locked_pub = cosign_key_pair(root / "locked", password="s3cret")
    return {"key": key, "pub": pub, "other": other, "locked": locked, "locked_pub": locked_pub}


@pytest.fixture(scope="session")
def signed_publish(docker_engine: DockerEngine, base_image: str, signing_keys: dict[str, Path],
                   tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[dict]:
    """`imagebuilder publish --sign-key` of the real runtime image (torch 2.6, CUDA 12.4, on the
    local Debian base, BuildKit) to an empty registry, once per session: build, smoke tests (CPU
    mode), push of every tag, signature and SBOM attestation. test_publish's first run and
    test_signing's signed run are this one publish (they published identical inputs twice);
    their modules run back to back (IMAGE_FAMILIES), test_signing's last test, which moves the
    tags, last. Every local tag and the registry go after the last test that uses it."""
    import json
    import time

    from imagebuilder.engine.select import detect_buildkit

    if detect_buildkit()[0] is None:
        _unavailable("no docker CLI here builds with BuildKit")
    with running_registry() as local:
        address = local.address
        registry = f"{address}/imagebuilder-test/pub-{uuid.uuid4().hex[:8]}"
        report = tmp_path_factory.mktemp("signed-publish") / "publish.json"

        def release() -> None:
            # After the last user, not at the session's end: the registry's storage is GBs.
            remove_local_tags(docker_engine, address)
            local.remove()

        with released_after_last_use(request, release):
            started = time.monotonic()
            with family_build(request):
                done = imagebuilder("publish", "--torch", SIGNED_TORCH, "--cuda", SIGNED_CUDA, "--os", SIGNED_OS,
                                    "--variant", "runtime", "--builder", "buildkit", "--base-image", base_image,
                                    *ca_bundle_args(), "--allow-no-gpu", "--registry", registry, "--report", str(report),
                                    "--sign-key", str(signing_keys["key"]), env_extra={"COSIGN_PASSWORD": ""})
            seconds = time.monotonic() - started
            assert done.returncode == 0, f"publish failed:\n{done.stdout}\n{done.stderr[-6000:]}"
            document = json.loads(report.read_text())
            (image,) = document["images"]
            yield {"report": document, "image": image, "address": address, "registry": registry,
                   "stdout": done.stdout, "seconds": seconds, "digest": image["digest"]}

# --- BuildKit's cache: what this test session added is removed at its end ----------------


@pytest.fixture(scope="session")
def _session_build_cache(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, tuple[str, str]]] | None]:
    """The BuildKit CLI and the cache records that existed before this session (None: keep all).

    A session that runs no Docker test builds nothing: it prunes nothing either, so a fast run
    next to a full one never takes the full one's records."""
    builds = any(item.get_closest_marker("docker") for item in request.session.items)
    keep = os.environ.get("IMAGEBUILDER_KEEP_BUILD_CACHE") == "1" or not builds
    cli = None if keep else _buildkit_cli()
    if cli is None:
        yield None
        return
    before = build_cache_records(cli)
    _SESSION_CACHE.append((cli, before))
    yield cli, before
    _SESSION_CACHE.clear()
    prune_records(cli, before, keep_cache_mounts=False)


@pytest.fixture(scope="module", autouse=True)
def buildkit_cache_cleanup(_session_build_cache: tuple[str, dict[str, tuple[str, str]]] | None) -> Iterator[None]:
    """BuildKit keeps every layer of the tests' builds in its cache, outside the image store that
    image cleanup reaches: with the containerd store a whole run's layers fill a CI disk (tens of
    GB). So the layers this session added are pruned after each module, unless a family has
    users left (IMAGE_FAMILIES, prune_session_build_cache); its cache mounts (the wheels and
    apt packages later builds reuse) at the session's end. Only this session's records are pruned: the
    daemon and its cache are shared."""
    yield

# --- a Docker daemon reached over SSH (DOCKER_HOST=ssh://...) -----------------------------


@pytest.fixture(scope="session")
def ssh_docker_host(docker_engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshDockerHost]:
    """Our own sshd (a throwaway host key and authorized key, its own config on a free port; the
    system's sshd, if any, is left alone) whose sessions run `docker system dial-stdio` against
    the daemon the tests use, as the docker CLI and SDK do over ssh."""
    import shutil
    import time

    if not SSHD.exists():
        _unavailable(f"{SSHD} is missing: apt-get install openssh-server (.ci/setup --tests does)")
    if shutil.which("docker") is None:
        _unavailable("the far side of ssh runs `docker system dial-stdio`: no docker CLI on PATH")
    root = tmp_path_factory.mktemp("sshd")
    host = SshDockerHost(root, _free_port())
    (host.home / ".ssh").mkdir(parents=True, mode=0o700)
    key = host.home / ".ssh" / "id_ed25519"
    for path in (root / "host_key", key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "imagebuilder-test", "-f", str(path)],
                       check=True, timeout=60)
    (root / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    host_key = (root / "host_key.pub").read_text().split()[:2]
    (host.home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{host.port} {' '.join(host_key)}\n")
    local = os.environ.get("DOCKER_HOST", "")
    (root / "sshd_config").write_text("\n".join([
        f"Port {host.port}", "ListenAddress 127.0.0.1", f"HostKey {root / 'host_key'}",
        f"PidFile {root / 'sshd.pid'}", f"AuthorizedKeysFile {root / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "UsePAM no", "StrictModes no", "X11Forwarding no", "AllowTcpForwarding no",
        # The far side reaches the same daemon as the tests (a DOCKER_HOST of theirs included).
        *([f"SetEnv DOCKER_HOST={local}"] if local.startswith("unix://") else []), ""]))
    # The privilege separation directory every sshd needs (Debian's service creates it at start).
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    with open(host.log, "ab") as log:
        host.process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(root / "sshd_config")],
                                        stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while "Server listening" not in host.log.read_text():
            if host.process.poll() is not None or time.monotonic() > deadline:
                _unavailable(f"our sshd did not start: {host.log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield host
    finally:
        host.process.terminate()
        try:
            host.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            host.process.kill()
            host.process.wait()


@pytest.fixture(scope="session")
def empty_security_mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A mirror of bookworm and bookworm-security with no packages, served on loopback: the
    security fixes a publish reads of its base, with no network (IMAGEBUILDER_SECURITY_MIRROR)."""
    repo = AptRepo(tmp_path_factory.mktemp("apt"))
    for suite in ("bookworm", "bookworm-security"):
        repo.publish(suite, [])
    with served(repo.root) as url:
        yield url

