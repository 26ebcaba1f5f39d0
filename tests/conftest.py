"""Shared fixtures. Docker fixtures skip without a daemon, or fail when CI demands one.

CI sets IMAGEBUILDER_REQUIRE_DOCKER=1 so that a missing daemon, base image or registry
fails the run instead of skipping it: CI can never pass by skipping the real tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn

import pytest
from build_records import build_cache_records, prune_records  # type: ignore[import-not-found]

if TYPE_CHECKING:
    from imagebuilder.engine import DockerEngine

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASE_IMAGE = "imagebuilder-base:bookworm"
TEST_REPOSITORY_PREFIX = "imagebuilder-test"


def _require_docker() -> bool:
    return os.environ.get("IMAGEBUILDER_REQUIRE_DOCKER") == "1"


def _unavailable(reason: str) -> NoReturn:
    """The one way a test (or a test module) says that what it needs is missing: a skip, or under
    IMAGEBUILDER_REQUIRE_DOCKER=1 (CI, whose .ci/setup installs every tool the tests use: Docker,
    docker-registry, cosign, torch, gcc, jq, uv, sshd, the base images) a failure, so CI cannot
    pass by skipping. tests/test_suite_rules.py refuses a pytest.skip or importorskip elsewhere."""
    if _require_docker():
        pytest.fail(f"{reason} (IMAGEBUILDER_REQUIRE_DOCKER=1: not skipping)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, why: str) -> ModuleType:
    """`import name`, or _unavailable (a skip, a failure in CI) saying why the test needs it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        _unavailable(f"{name} is not importable ({e}): {why}")


# --- hypothesis: the same examples on every run, a deep run on demand ---------------------

# By default (CI, the fast run) the fuzzers are derandomized: every run tries the same examples
# (seeded from each test), so a red CI run is the code's doing and reproduces as it is.
# IMAGEBUILDER_FUZZ=deep: random examples, FUZZ_SCALE times as many (tests/test_matrix_fuzz.py
# multiplies its bounds by fuzz_examples), for hunting before a release.
FUZZ_DEEP = os.environ.get("IMAGEBUILDER_FUZZ") == "deep"
FUZZ_SCALE = 20


def fuzz_examples(n: int) -> int:
    """A fuzzer's max_examples: `n` in CI and the fast run, FUZZ_SCALE times that in a deep run."""
    return n * FUZZ_SCALE if FUZZ_DEEP else n


def _hypothesis_profiles() -> None:
    from hypothesis import settings

    settings.register_profile("derandomized", derandomize=True, database=None)
    settings.register_profile("deep", derandomize=False)
    settings.load_profile("deep" if FUZZ_DEEP else "derandomized")


_hypothesis_profiles()


# --- markers: a test carries the markers of what it needs ----------------------------------

# A fixture -> the markers every test using it (directly or through other fixtures) carries,
# so `-m "not docker and not slow and not network"` (the fast run, see docs/development.md)
# never starts a daemon, a registry, or a real image build.
FIXTURE_MARKERS: dict[str, frozenset[str]] = {
    "docker_engine": frozenset({"docker"}),
    "registry": frozenset({"registry"}),
    "local_registry": frozenset({"registry"}),
    "docs_registry": frozenset({"registry"}),
    # Real torch images (GBs, minutes): built through the CLI once per module or session.
    **{name: frozenset({"slow"}) for name in (
        "runtime_image", "devel_image", "devel_jupyter_image", "jupyter_image", "buildkit_images",
        "arm64_image", "first_run", "signed_run", "bk_published")},
    "signed_publish": frozenset({"slow", "registry"}),
    # Every smoke test for real on this host's torch (a gloo all-reduce, an Inductor compile).
    "local_runs": frozenset({"slow"}),
    "full_run": frozenset({"slow"}),
}


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background by a non-interactive shell (`cmd &`, nohup) inherits
    SIGINT ignored, and so would every process it starts; the Ctrl-C tests press Ctrl-C as a
    terminal does, on processes that have Python's default handler."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run a test whose fixtures need more than its markers say."""
    missing = []
    for item in items:
        marked = {mark.name for mark in item.iter_markers()}
        needed = set().union(*(FIXTURE_MARKERS.get(name, frozenset()) for name in getattr(item, "fixturenames", ())))
        if needed - marked:
            missing.append(f"{item.nodeid}: mark it {', '.join(sorted(needed - marked))}")
    if missing:
        raise pytest.UsageError("tests whose fixtures need markers they lack (see FIXTURE_MARKERS in "
                                "tests/conftest.py):\n  " + "\n  ".join(missing))
    _group_the_families(items)


# --- real torch images by family: the images of one lock share BuildKit's layers ------------

# A family: the fixtures whose images are built from one lock (so from the same BuildKit
# layers). The session's BuildKit records are pruned after every module and every released
# image (the disk is shared), except a family's own records while the family has users left:
# each image content is built once, and its later users are served from the cache. The
# modules that use a family run back to back (_group_the_families), so a family is open for as
# short a stretch as the tests allow. docs/development.md lists the families and what each costs.
IMAGE_FAMILIES: dict[str, tuple[str, ...]] = {
    # test_buildkit builds runtime and devel for real (--no-cache, with the marked CA); the
    # session's devel image (test_workspace's, test_torchcodec's) and test_publish_buildkit's
    # publishes are served from their layers.
    "torch 2.13 / CUDA 13.0 runtime and devel (debian12)": ("buildkit_images", "devel_image", "bk_published"),
    # conftest's runtime image (the README's main job, CUDA 12.1: torch 2.6's cu124 wheels), the
    # jupyter image built FROM it, and the one signed publish (BuildKit) serving test_publish and
    # test_signing: CUDA 12.4, the same cu124 lock, so the same steps up to the labels (every
    # install step served from the main job's layers).
    "torch 2.6 (cu124 wheels) runtime: CUDA 12.1 and jupyter, CUDA 12.4 published and signed (debian12)":
        ("runtime_image", "jupyter_image", "signed_publish"),
}
FAMILY_OF = {fixture: family for family, fixtures in IMAGE_FAMILIES.items() for fixture in fixtures}

# Every other fixture or test that builds a real torch image (or starts to: the failures
# before torch are listed too), by file and function; tests/test_suite_rules.py fails when a
# build appears outside these and the family fixtures, so a new image is a decision (minutes
# of CI each), not an accident.
OTHER_REAL_BUILDS: dict[tuple[str, str], str] = {
    # The families' builds (IMAGE_FAMILIES), and their users that build again from the cache.
    ("conftest.py", "build_cli"): "the runtime_image family's build, with a variant",
    ("conftest.py", "runtime_image"): "family: torch 2.6 (cu124 wheels) / CUDA 12.1 runtime",
    ("conftest.py", "devel_image"): "family: torch 2.13 / CUDA 13.0 devel (served from test_buildkit's layers)",
    ("conftest.py", "signed_publish"): "family: torch 2.6 / CUDA 12.4 runtime, published and signed (from the main job's layers)",
    ("test_buildkit.py", "_build"): "buildkit_images' build through the CLI",
    ("test_buildkit.py", "buildkit_images"): "family: torch 2.13 / CUDA 13.0 runtime and devel, the real builds",
    ("conftest.py", "jupyter_image"): "family: torch 2.6 / CUDA 12.1 (JupyterLab's layer on runtime_image)",
    ("test_e2e.py", "test_a_second_identical_build_is_fully_cached"): "runtime_image again: from the cache",
    ("test_publish_buildkit.py", "_publish"): "the publish of test_publish_buildkit's tests",
    ("test_publish_buildkit.py", "bk_published"): "family: torch 2.13 / CUDA 13.0 (from test_buildkit's layers)",
    ("test_publish_buildkit.py", "test_a_republish_of_identical_content_uploads_nothing_and_moves_no_tag"):
        "the family's runtime again: from the cache",
    ("test_publish_buildkit.py", "test_an_empty_remote_engine_builds_from_the_registry_cache_verifies_and_pushes"):
        "the family's runtime on a second engine, from the registry's cache",
    ("test_publish.py", "test_second_run_skips_and_pushes_nothing"): "signed_publish's rerun: skips",
    ("test_publish.py", "test_the_next_day_adds_only_the_dated_tag"): "signed_publish's rerun: retags",
    ("test_publish.py", "test_a_release_with_common_pins_shares_their_layers_and_uploads_none_of_them"):
        "torch 2.5 (cu124) runtime published after signed_publish: the groups below cuSPARSELt from its layers",
    ("test_signing.py", "test_nothing_is_signed_when_verify_failed"): "signed_publish's image again: from the cache",
    ("test_signing.py", "test_a_failed_signing_fails_the_publish_and_the_next_run_signs"):
        "signed_publish's image again: from the cache",
    ("test_workspace.py", "devel_jupyter_image"): "JupyterLab's layer on devel_image",
    # Images of their own.
    ("test_buildkit.py", "arm64_image"): "torch 2.11 for arm64 under QEMU (its own lock and platform)",
    ("test_python_install.py", "test_a_debian13_image_runs_on_the_os_python"):
        "torch 2.6 / CUDA 12.4 on Debian 13's own Python 3.13 (its own lock)",
    # Builds that fail before torch is installed (seconds).
    ("test_e2e.py", "test_build_failure_names_the_step_and_leaves_no_tag"): "fails at the install step (no index)",
    ("test_e2e.py", "test_missing_base_image_suggests_base_image"): "fails before building (no base)",
    ("test_e2e.py", "test_strict_refuses_the_cuda_121_fallback_before_anything_is_built"): "refused before building",
    ("test_python_install.py", "test_a_refusing_python_mirror_fails_the_build_with_one_line_naming_it"):
        "fails at the interpreter download",
    ("test_bad_inputs.py", "test_an_image_that_exists_nowhere_is_a_bad_request"): "fails before building (no base)",
    ("test_bad_inputs.py", "test_a_registry_that_cannot_be_asked_is_the_worlds_failure"): "fails before building",
    ("test_bad_inputs.py", "test_build_refuses_a_with_that_contradicts_the_torch_pins"): "refused before building",
    ("test_bad_inputs.py", "test_a_devel_base_image_without_nvcc_fails_the_first_build_step"):
        "fails at the first build step",
}


def _group_the_families(items: list[pytest.Item]) -> None:
    """Order the modules so that each family's users run back to back (a stable sort): every
    module that uses a family moves next to the first module that uses it; the group holding a
    `most_disk` module runs first (before the session's caches grow), and that module runs last
    in its group (its last test prunes all of the session's records for a second engine)."""
    modules = list(dict.fromkeys(item.path for item in items))
    uses: dict[Path, set[str]] = {module: set() for module in modules}
    most_disk: set[Path] = set()
    for item in items:
        uses[item.path] |= {FAMILY_OF[name] for name in getattr(item, "fixturenames", ()) if name in FAMILY_OF}
        if item.get_closest_marker("most_disk") is not None:
            most_disk.add(item.path)
    first: dict[str, int] = {}
    for index, module in enumerate(modules):
        for family in sorted(uses[module]):
            first.setdefault(family, index)
    group = {module: min([index, *(first[family] for family in uses[module])]) for index, module in enumerate(modules)}
    disk_groups = {group[module] for module in most_disk}
    position = {module: index for index, module in enumerate(modules)}
    items.sort(key=lambda item: (group[item.path] not in disk_groups, group[item.path], item.path in most_disk,
                                 position[item.path]))


@pytest.fixture(scope="session")
def docker_engine() -> DockerEngine:
    """A DockerEngine whose daemon answers; skips (or fails in CI) otherwise."""
    from imagebuilder.engine import DaemonUnavailable, DockerEngine

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


def remove_local_tags(docker_engine: DockerEngine, marker: str) -> None:
    """Remove every local tag that contains `marker` (images are GBs; the disk is shared)."""
    import docker

    client = docker.from_env()
    try:
        refs = [tag for image in client.images.list() for tag in image.tags if marker in tag]
    finally:
        client.close()
    remove_images(docker_engine, refs)


def remove_images(docker_engine: DockerEngine, refs: list[str]) -> None:
    """Remove these tags, and the untagged step images the classic builder left under them.

    Its step images are its cache: on the containerd image store removing the last tag does
    not always take them along (measured: 9 GB left behind per torch image). Only an image
    that has no tag is removed, and Docker refuses one that another image is built on or a
    container uses: nothing another user still names goes."""
    import docker

    client = docker.from_env()
    try:
        parents: list[str] = []
        for ref in refs:
            with contextlib.suppress(docker.errors.NotFound):
                parents += [step["Id"] for step in client.images.get(ref).history() if step["Id"] != "<missing>"]
        for ref in refs:
            docker_engine.remove_image(ref)
        for image_id in dict.fromkeys(parents):  # newest first: a child before its parent
            try:
                if not client.images.get(image_id).tags:
                    client.images.remove(image_id)
            except docker.errors.APIError:  # gone, named, or built on: not ours to remove
                continue
    finally:
        client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def free_port() -> int:
    """A loopback TCP port nothing listens on (right now)."""
    return _free_port()


@contextlib.contextmanager
def throwaway_registry() -> Iterator[str]:
    """A registry (Debian's docker-registry) on 127.0.0.1:PORT for as long as the block runs;
    yields that address; its storage is removed after."""
    script = REPO_ROOT / ".ci" / "registry.sh"
    port = str(_free_port())
    started = subprocess.run([str(script), "start", port], capture_output=True, text=True,
                             timeout=90)
    if started.returncode != 0:
        _unavailable(f"could not start a local registry with {script}: {started.stderr.strip()}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(script), "stop", port], capture_output=True, timeout=30, check=False)


@dataclasses.dataclass
class TickingBuild:
    """A fake background build (engine.api.Running): it runs for `busy` waits, then ends with
    `rc`, noting "cache exported" in `timeline` when one is given; stopping ends it with -2."""

    busy: int
    rc: int
    timeline: list[str] | None = None
    stopped: bool = False
    ended_at = None

    def wait(self, timeout: float | None = None) -> int | None:
        if self.stopped:
            return -2
        if self.busy > 0:
            self.busy -= 1
            return None
        if self.timeline is not None:
            self.timeline.append("cache exported")
        return self.rc

    def stop(self) -> None:
        self.stopped = True


def put_blob(host: str, repository: str, blob: bytes) -> dict[str, object]:
    """Upload `blob` into REPOSITORY of the registry at HOST (loopback http, no auth) in one
    monolithic PUT; its descriptor's digest and size."""
    import hashlib
    import urllib.parse
    import urllib.request

    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    start = urllib.request.Request(f"http://{host}/v2/{repository}/blobs/uploads/", method="POST")
    with urllib.request.urlopen(start, timeout=30) as answer:
        location = urllib.parse.urljoin(f"http://{host}/", answer.headers["Location"])
    sep = "&" if "?" in location else "?"
    put = urllib.request.Request(f"{location}{sep}digest={digest}", data=blob, method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    urllib.request.urlopen(put, timeout=30).close()
    return {"digest": digest, "size": len(blob)}


def put_manifest(host: str, repository: str, reference: str, manifest: bytes, media_type: str) -> str:
    """PUT `manifest` as REPOSITORY:REFERENCE on the registry at HOST; the digest it answers."""
    import urllib.request

    put = urllib.request.Request(f"http://{host}/v2/{repository}/manifests/{reference}", data=manifest,
                                 method="PUT", headers={"Content-Type": media_type})
    with urllib.request.urlopen(put, timeout=30) as answer:
        return str(answer.headers["Docker-Content-Digest"])


@pytest.fixture
def registry(docker_engine: DockerEngine) -> Iterator[str]:
    """A throwaway registry on 127.0.0.1:PORT for one test; yields that address."""
    with throwaway_registry() as address:
        yield address


# --- real images, built once per test session -------------------------------------------

E2E_TORCH, E2E_CUDA, E2E_OS = "2.6", "12.1", "debian12"


_SESSION_CA: list[tuple[Path, bytes]] = []


def session_ca() -> tuple[Path, bytes]:
    """The CA bundle every build of the session trusts, and its marker: the proxy's bundle
    ($SSL_CERT_FILE, else the system's) with a unique comment line appended (PEM readers skip
    text between certificates), so that a test can look for it in an image. One file for the
    whole session: through buildx the bundle is bind-mounted from a named context, so its bytes
    are in every install step's cache key, and the families' images share layers only when
    their builds trust the same bundle."""
    if not _SESSION_CA:
        import atexit
        import shutil
        import tempfile

        source = Path(os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")
        marker = f"# imagebuilder-ca-marker-{uuid.uuid4().hex}".encode()
        folder = Path(tempfile.mkdtemp(prefix="imagebuilder-test-ca-"))
        atexit.register(shutil.rmtree, folder, True)
        (folder / "ca.pem").write_bytes(source.read_bytes() + b"\n" + marker + b"\n")
        _SESSION_CA.append((folder / "ca.pem", marker))
    return _SESSION_CA[0]


def session_ca_bundle() -> Path | None:
    """Behind a TLS-intercepting proxy (these machines) pip inside the build needs the host's
    CA: the session's marked copy of it (session_ca); None where there is no proxy's CA."""
    ca = os.environ.get("SSL_CERT_FILE")
    return session_ca()[0] if ca and Path(ca).is_file() else None


def ca_bundle_args() -> list[str]:
    """The CLI's `--ca-bundle` for the session's CA (session_ca_bundle), if any."""
    ca = session_ca_bundle()
    return ["--ca-bundle", str(ca)] if ca is not None else []


def installed_torch(log: Path | str) -> bool:
    """Whether a build log shows uv installing torch: its install step ran, not served from the cache."""
    return re.search(r"\+ torch==", Path(log).read_text()) is not None


def imagebuilder(*args: str, timeout: float = 3600,
                 env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, as a user runs it (with `env_extra` in its environment)."""
    import sys

    # A fixed revision label: a commit made while the tests run must not change the images.
    env = {**os.environ, "GITHUB_SHA": "0" * 40, **(env_extra or {})}
    # The classic builder unless a test asks for another (--builder wins over the variable): the
    # session's images ask for auto, the builder users get.
    env.setdefault("IMAGEBUILDER_BUILDER", "classic")
    return subprocess.run([sys.executable, "-m", "imagebuilder", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT, env=env)


def build_cli(base_image: str, repository: str, report: Path, *extra: str) -> dict:
    import json

    # No --os: it is read from the base image (Debian 12 here), as a user's build does; the
    # builder the user's engine gets (BuildKit on Docker 26 with buildx, classic on 20.10).
    done = imagebuilder("build", "--torch", E2E_TORCH, "--cuda", E2E_CUDA, "--builder", "auto",
                        "--base-image", base_image, "--repository", repository, *ca_bundle_args(),
                        "--report", str(report), *extra)
    assert done.returncode == 0, f"build failed:\n{done.stderr[-4000:]}"
    doc: dict = json.loads(report.read_text())
    doc["stderr"] = done.stderr  # what the user saw: the notices, the progress
    doc["stdout"] = done.stdout  # the summary of each image built
    return doc


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


# CUDA 13's nvcc comes from PyPI: a devel image on plain Debian. 2.13: its torchaudio needs torchcodec
# and the OS's FFmpeg, so test_torchcodec runs on this image (no image of its own).
DEVEL_TORCH, DEVEL_CUDA = "2.13", "13.0"


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


SIGNED_TORCH, SIGNED_CUDA, SIGNED_OS = "2.6", "12.4", "debian12"


def cosign_key_pair(directory: Path, password: str = "") -> tuple[Path, Path]:
    """A cosign key pair (cosign.key, cosign.pub) made by cosign itself."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cosign", "generate-key-pair"], cwd=directory, capture_output=True, check=True, timeout=60,
                   env={**os.environ, "COSIGN_PASSWORD": password})
    return directory / "cosign.key", directory / "cosign.pub"


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
    with throwaway_registry() as address:
        registry = f"{address}/imagebuilder-test/pub-{uuid.uuid4().hex[:8]}"
        report = tmp_path_factory.mktemp("signed-publish") / "publish.json"
        def release() -> None:
            # After the last user, not at the session's end: the registry's storage is GBs.
            remove_local_tags(docker_engine, address)
            subprocess.run([str(REPO_ROOT / ".ci" / "registry.sh"), "stop", address.rsplit(":", 1)[1]],
                           capture_output=True, timeout=30, check=False)

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


def remove_block(text: str, key: str) -> str:
    """matrix.yaml without one torch release's block (and its own comment lines above it)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f'  "{key}":'))
    end = next((i for i in range(start + 1, len(lines)) if re.match(r'^  ("|#)|^\S', lines[i])), len(lines))
    while start > 0 and lines[start - 1].startswith("  #"):
        start -= 1
    return "".join(lines[:start] + lines[end:])


# --- BuildKit's cache: what this test session added is removed at its end ----------------


def _buildkit_cli() -> str | None:
    """A docker CLI that speaks to BuildKit's cache (the one `engine.select.decide` would pick)."""
    from imagebuilder.engine.select import docker_clis

    for cli in docker_clis():
        # A docker 23+ CLI without buildx refuses `builder prune`; the probe id matches nothing.
        done = subprocess.run([cli, "builder", "prune", "--force", "--filter", "id=imagebuilder-probe"],
                              env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, text=True,
                              timeout=60)
        if done.returncode == 0:
            return cli
    return None


# The BuildKit CLI and the records that existed before this session, once it has started.
_SESSION_CACHE: list[tuple[str, dict[str, tuple[str, str]]]] = []


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
    prune_session_build_cache()


# The families whose fixtures have built and whose last user has not run yet.
_OPEN_FAMILIES: set[str] = set()
# family -> the node id of the last collected test that uses one of its fixtures
_FAMILY_LAST_USERS: dict[str, str] = {}


@contextlib.contextmanager
def family_build(request: pytest.FixtureRequest) -> Iterator[None]:
    """Around a family fixture's builds (IMAGE_FAMILIES): from here until the family's last
    user has run, no prune runs (prune_session_build_cache), so its users build from its layers."""
    family = FAMILY_OF.get(request.fixturename or "")
    assert family is not None, f"{request.fixturename} is in no IMAGE_FAMILIES entry"
    _OPEN_FAMILIES.add(family)
    yield


# --- a real image is removed after the last test that uses it -----------------------------

# fixture name -> the cleanup of the image it yielded, while that has not run yet
_RELEASES: dict[str, Callable[[], None]] = {}
# fixture name -> the node id of the last collected test that uses it (filled at the first teardown)
_LAST_USERS: dict[str, str] = {}


@contextlib.contextmanager
def released_after_last_use(request: pytest.FixtureRequest, cleanup: Callable[[], None]) -> Iterator[None]:
    """Around a fixture's build and yield: `cleanup` (removing the image) runs right after the
    last test that uses the fixture, not when its scope ends; a session or module image would
    otherwise keep its GBs on the shared disk while later tests build theirs. The session's new
    BuildKit records (the image's layers) are pruned with it. Runs once, on failure too."""
    done = False

    def release() -> None:
        nonlocal done
        if done:
            return
        done = True
        try:
            cleanup()
        finally:
            prune_session_build_cache()

    name = request.fixturename
    assert name is not None, "released_after_last_use belongs in a fixture"
    _RELEASES[name] = release
    try:
        yield
    finally:
        _RELEASES.pop(name, None)
        release()


def prune_session_build_cache(*, families_too: bool = False) -> None:
    """Prune the BuildKit records this session added (its layers; the cache mounts stay), unless
    a family has users left (all the same with families_too: test_publish_buildkit's second
    engine, whose copy of torch must not share the disk with the first's).

    Not "all but the family's records": on Docker 26 (containerd store, BuildKit 0.13) any
    prune that removes a record makes the daemon forget the cache keys of every record it
    keeps; the next build of the same steps runs them all again (measured: two RUNs built,
    an unrelated record pruned by id, the same Dockerfile again: no step CACHED). The
    families' layers are GBs the disk holds until their last user (IMAGE_FAMILIES)."""
    if not _SESSION_CACHE or (_OPEN_FAMILIES and not families_too):
        return
    cli, before = _SESSION_CACHE[0]
    prune_records(cli, before, keep_cache_mounts=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    if not _LAST_USERS:
        for collected in item.session.items:
            for name in getattr(collected, "fixturenames", ()):
                _LAST_USERS[name] = collected.nodeid
                if name in FAMILY_OF:
                    _FAMILY_LAST_USERS[FAMILY_OF[name]] = collected.nodeid
    for name in [name for name in _RELEASES if _LAST_USERS.get(name) == item.nodeid]:
        _RELEASES.pop(name)()
    closed = {family for family in _OPEN_FAMILIES if _FAMILY_LAST_USERS.get(family) == item.nodeid}
    _OPEN_FAMILIES.difference_update(closed)
    if closed:
        prune_session_build_cache()


# --- the smoke tests on this host: one run per argv -----------------------------------------

# `imagebuilder verify --local ...` runs every smoke test on this host's torch for real (a gloo
# all-reduce, an Inductor compile: minutes on 2 cores). test_verify and the documented
# commands ask for the same argv: it runs once per session, and each asker reads its result.
_HOST_VERIFY: dict[tuple[str, ...], subprocess.Popen[str]] = {}
_HOST_VERIFIED: dict[tuple[str, ...], tuple[int, str, str]] = {}


def start_host_verify(*args: str) -> None:
    """Start `imagebuilder verify ARGS` on this host unless this session has (runs side by side)."""
    import sys

    if args not in _HOST_VERIFY and args not in _HOST_VERIFIED:
        _HOST_VERIFY[args] = subprocess.Popen([sys.executable, "-m", "imagebuilder", "verify", *args], cwd=REPO_ROOT,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def host_verify(*args: str, timeout: float = 2400) -> tuple[int, str, str]:
    """`imagebuilder verify ARGS` on this host, run once per session: (exit status, stdout, stderr)."""
    if args not in _HOST_VERIFIED:
        start_host_verify(*args)
        proc = _HOST_VERIFY.pop(args)
        stdout, stderr = proc.communicate(timeout=timeout)
        _HOST_VERIFIED[args] = (proc.returncode, stdout, stderr)
    return _HOST_VERIFIED[args]


# --- a Docker daemon reached over SSH (DOCKER_HOST=ssh://...) -----------------------------

SSHD = Path("/usr/sbin/sshd")


class SshDockerHost:
    """This machine's Docker daemon behind our own sshd on 127.0.0.1:PORT: what `DOCKER_HOST=
    ssh://user@host` reaches on a remote GPU box. The ssh client side (a key, the host key in
    known_hosts) lives in `home`, so a client given HOME=home logs in without prompts."""

    def __init__(self, root: Path, port: int) -> None:
        import getpass

        self.root, self.port = root, port
        self.user = getpass.getuser()
        self.url = f"ssh://{self.user}@127.0.0.1:{port}"
        self.home = root / "home"
        self.log = root / "sshd.log"
        self.process: subprocess.Popen[bytes] | None = None

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a client that reaches the daemon only through this sshd."""
        env = {key: value for key, value in os.environ.items() if key not in ("SSH_AUTH_SOCK", "DOCKER_CONTEXT")}
        return {**env, "HOME": str(self.home), "DOCKER_HOST": self.url, **extra}

    def logins(self) -> int:
        return self.log.read_text().count(f"Accepted publickey for {self.user} from 127.0.0.1")


@pytest.fixture(scope="session")
def ssh_docker_host(docker_engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshDockerHost]:
    """Our own sshd (a throwaway host key and authorized key, its own config on a free port; the
    system's sshd, if any, is left alone) whose sessions run `docker system dial-stdio` against
    the daemon the tests use, as the docker CLI and SDK do over ssh."""
    import shutil
    import time

    if not SSHD.exists():
        _unavailable(f"{SSHD} is missing: apt-get install openssh-server (.ci/setup does)")
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
