"""`imagebuilder project` for real: a team's pyproject project (pandas, torchmetrics and its own
package) on the session's published and signed torch 2.6 runtime image (conftest's
signed_publish), through the CLI, with a real engine, registry and cosign: resolved under the
base, built in its own layers, proven (the torch stack byte-for-byte the base's, the base's
smoke tests in CPU mode, the user's checks), tagged, pushed with the base's layers mounted, and
signed, its provenance attested. Then what users do next: a code-only change, a stale lock under
--locked, a conflict, a project that overwrites a torch file, a base imagebuilder did not make, a
dependency built from source against the base's torch."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cleanup import remove_local_tags
from support.projects import (NVTX_SDIST, TORCH_SDIST, bridge_gateway, recording_sdist, simple_index,
                             trainer_pyproject)
from support.real_images import ca_bundle_args, imagebuilder

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.registry, pytest.mark.slow]

PYPROJECT = trainer_pyproject("trainer")
SITE_PACKAGES = "/opt/venv/lib/python3.11/site-packages"
IMPORTS = "python -c 'import trainer, pandas, torchmetrics; print(trainer.VERSION)'"


def _project(folder: Path, version: int = 1) -> Path:
    (folder / "trainer").mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (folder / "trainer" / "__init__.py").write_text(f"VERSION = {version}\n")
    (folder / ".dockerignore").write_text("secrets.env\n")
    (folder / "secrets.env").write_text("TOKEN=do-not-ship\n")
    return folder


def _run(folder: Path, base: str, tag: str, *extra: str, report: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = ["project", str(folder), "--base", base, "--tag", tag, "--allow-no-gpu", *ca_bundle_args(), *extra]
    if report is not None:
        args += ["--report", str(report)]
    return imagebuilder(*args, timeout=1800, env_extra={"COSIGN_PASSWORD": ""})


def _layers(ref: str) -> list[str]:
    out = subprocess.run(["docker", "image", "inspect", ref, "--format", "{{json .RootFS.Layers}}"],
                         capture_output=True, text=True, check=True).stdout
    return list(json.loads(out))


def _images_named(marker: str) -> list[str]:
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if marker in line]


@pytest.fixture(scope="module")
def first(signed_publish: dict[str, Any], signing_keys: dict[str, Path], docker_engine: Any,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The project built on the published base (by its registry tag, signature checked), pushed
    to the base's registry and signed; every local tag it made goes after the module."""
    root = tmp_path_factory.mktemp("project")
    folder = _project(root / "trainer")
    repository = f"{signed_publish['address']}/imagebuilder-test/project-{uuid.uuid4().hex[:8]}"
    base = signed_publish["image"]["ref"]
    report = root / "report.json"
    try:
        done = _run(folder, base, f"{repository}:1", "--key", str(signing_keys["pub"]), "--push", "--sign-key",
                    str(signing_keys["key"]), "--check", IMPORTS, "--check", 'test "$(id -u)" = 1000', report=report)
        assert done.returncode == 0, done.stdout + done.stderr[-6000:]
        yield {"folder": folder, "repository": repository, "base": base, "done": done,
               "report": json.loads(report.read_text()), "root": root}
    finally:
        remove_local_tags(docker_engine, repository)  # the rebase test's base and image too


def test_the_project_image_is_resolved_built_proven_pushed_and_signed(first: dict[str, Any],
                                                                      signing_keys: dict[str, Path]) -> None:
    from imagebuilder.registry.client import HttpRegistry
    from imagebuilder.trust.cosign import Cosign, CosignFailed
    from imagebuilder.trust.provenance import SLSA_V1, resolved_dependencies

    report, folder = first["report"], first["folder"]
    lock = (folder / "imagebuilder-project.lock").read_text()
    assert "pandas==2.2.3" in lock and "torchmetrics==1.6.1" in lock
    assert "\ntorch==" not in lock and "nvidia-" not in lock  # the base's: installed already, never again
    proof = report["proof"]
    assert proof[0].startswith("torch stack: ") and "byte-for-byte the base's" in proof[0]
    assert proof[1].startswith("smoke tests: passed (CPU")
    assert proof[2:] == [f"check: {IMPORTS}", 'check: test "$(id -u)" = 1000']
    tag = f"{first['repository']}:1"
    labels = json.loads(subprocess.run(["docker", "image", "inspect", tag, "--format", "{{json .Config.Labels}}"],
                                       capture_output=True, text=True, check=True).stdout)
    assert labels["io.imagebuilder.project.base.digest"] == report["base_digest"]
    assert labels["io.imagebuilder.project.lock"] == report["lock"]
    assert labels["io.imagebuilder.torch"] == "2.6.0"  # the base's labels stay
    base_layers, layers = _layers(first["base"]), _layers(tag)
    assert layers[:len(base_layers)] == base_layers and 1 <= len(layers) - len(base_layers) <= 2
    listing = subprocess.run(["docker", "run", "--rm", "--read-only", "--user", "4242:0", tag, "sh", "-c",
                              "ls -A /opt/project; python -c 'import trainer; print(trainer.__file__)'"],
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert "secrets.env" not in listing.stdout and "pyproject.toml" in listing.stdout  # .dockerignore honoured
    assert "/opt/venv/lib/python" in listing.stdout  # installed as a package, readable by any uid
    # The push: the base's layers were in the registry already (mounted); only the project's went up
    # (and the image's config).
    base_blobs = {d.removeprefix("sha256:")[:12] for d in HttpRegistry(config={}).blobs(first["base"])}
    assert report["uploaded"] and not set(report["uploaded"]) & base_blobs
    assert report["uploaded_blobs"] <= len(layers) - len(base_layers) + 1
    target = f"{first['repository']}@{report['pushed_digest']}"
    assert report["signed"]["digest"] == report["pushed_digest"]
    assert Cosign().verify(str(signing_keys["pub"]), target)
    assert "signature: " in first["done"].stderr  # the base's signature was checked first
    # Its provenance, verified by cosign with the key: the base by digest and the lock by hash.
    predicate = Cosign().verified_predicate(str(signing_keys["pub"]), target, "slsaprovenance1", SLSA_V1)
    lock_hex = hashlib.sha256((folder / "imagebuilder-project.lock").read_bytes()).hexdigest()
    assert resolved_dependencies(predicate) == {"base": report["base_digest"], "lock": f"sha256:{lock_hex}"}
    assert report["lock"] == f"sha256:{lock_hex}" and report["ok"] is True and report["error"] is None
    assert predicate["buildDefinition"]["externalParameters"]["tag"] == tag
    with pytest.raises(CosignFailed):  # another key's verification fails: the attestation is signed
        Cosign().verified_predicate(str(signing_keys["other"]), target, "slsaprovenance1", SLSA_V1)


def test_a_code_only_change_rebuilds_only_the_code_layer_and_reuses_the_lock(first: dict[str, Any]) -> None:
    folder = first["folder"]
    lock_before = (folder / "imagebuilder-project.lock").read_text()
    (folder / "trainer" / "__init__.py").write_text("VERSION = 2\n")
    report = first["root"] / "code-change.json"
    done = _run(folder, first["base"], f"{first['repository']}:2", "--locked", "--check",
                "python -c 'import trainer; assert trainer.VERSION == 2'", report=report)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "lock: reused" in done.stderr
    assert (folder / "imagebuilder-project.lock").read_text() == lock_before
    assert json.loads(report.read_text())["executed_steps"] == 1  # the code's RUN; the dependencies cached
    before, after = _layers(f"{first['repository']}:1"), _layers(f"{first['repository']}:2")
    assert after[:-1] == before[:-1] and after[-1] != before[-1]


def test_locked_refuses_a_stale_lock_and_builds_nothing(first: dict[str, Any]) -> None:
    folder = first["root"] / "stale"
    shutil.copytree(first["folder"], folder)
    (folder / "pyproject.toml").write_text(PYPROJECT.replace('"torchmetrics==1.6.1"', '"torchmetrics==1.6.1", "tqdm"'))
    marker = f"stale-{uuid.uuid4().hex[:8]}"
    done = _run(folder, first["base"], f"imagebuilder-test/{marker}:1", "--locked")
    assert done.returncode == 2, done.stderr
    assert "imagebuilder-project.lock is stale (the requirements or the base's packages changed)" in done.stderr
    assert "Traceback" not in done.stderr and _images_named(marker) == []


@pytest.mark.parametrize(("requirement", "says"), [
    ("torch==2.5.1", "torch==2.5.1 conflicts with"),
    ("xformers==0.0.28.post3", "xformers==0.0.28.post3 needs torch==2.5.1, but"),  # it pins torch itself
])
def test_a_requirement_that_would_replace_torch_exits_2_before_any_build(first: dict[str, Any], requirement: str,
                                                                          says: str) -> None:
    folder = first["root"] / f"conflict-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "requirements.txt").write_text(f"pandas==2.2.3\n{requirement}\n")
    marker = f"conflict-{uuid.uuid4().hex[:8]}"
    report = folder / "report.json"
    done = _run(folder, first["base"], f"imagebuilder-test/{marker}:1", report=report)
    assert done.returncode == 2, done.stderr
    assert not report.exists()  # a wrong request (exit 2) leaves nothing behind, no report either
    error = done.stderr[done.stderr.index("error: "):].strip().splitlines()
    assert len(error) <= 3, error
    assert says in error[0] and "torch 2.6.0" in error[0] and "nothing was built" in error[0], error
    assert "build:" not in done.stderr and _images_named(marker) == [] and not (folder / "imagebuilder-project.lock").exists()


def test_a_project_that_overwrites_a_torch_file_is_not_tagged_and_leaves_no_image(first: dict[str, Any]) -> None:
    """The silent replacement users report, made on purpose: the package's data files overwrite
    torch/version.py. The proof names the file; nothing is tagged and no candidate image stays."""
    folder = first["root"] / "evil"
    shutil.copytree(first["folder"], folder)
    (folder / "version.py").write_text("__version__ = '2.6.0+evil'\n")
    (folder / "pyproject.toml").write_text(PYPROJECT + '\n[tool.setuptools.data-files]\n'
                                           '"lib/python3.11/site-packages/torch" = ["version.py"]\n')
    marker = f"evil-{uuid.uuid4().hex[:8]}"
    report = first["root"] / "evil.json"
    done = _run(folder, first["base"], f"imagebuilder-test/{marker}:1", "--locked", report=report)
    assert done.returncode == 1, done.stderr
    assert "not tagged: the torch stack is not the base's" in done.stderr
    assert "torch 2.6.0: 1 file(s) differ from RECORD (torch/version.py)" in done.stderr
    doc = json.loads(report.read_text())  # the --report of a failed run names the failure
    assert (doc["ok"], doc["phase"]) == (False, "prove") and doc["image_id"].startswith("sha256:")
    assert doc["error"] == f"imagebuilder-test/{marker}:1: not tagged: the torch stack is not the base's"
    assert "torch 2.6.0: 1 file(s) differ from RECORD (torch/version.py)" in doc["error_details"]
    assert _images_named(marker) == [] and _images_named("imagebuilder-project-candidate") == []


def test_an_image_imagebuilder_did_not_make_is_refused_in_one_line(docker_engine: Any, base_image: str,
                                                                    tmp_path: Path) -> None:
    _project(tmp_path / "p")
    done = _run(tmp_path / "p", base_image, "imagebuilder-test/not-ours:1")
    assert done.returncode == 2
    assert f"error: {base_image} was not built by imagebuilder (no io.imagebuilder.inputs-hash label)" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_republished_base_takes_the_project_layers_as_they_are(first: dict[str, Any], docker_engine: Any) -> None:
    """The base republished with the same venv (an OS fix: one more layer, the same lock label):
    --rebase re-makes the pushed project image on it in the registry (only a config uploaded,
    every layer mounted), proves it and tags it; the code in it is the old image's."""
    new_base = f"{first['repository']}-base:fixed"
    folder = first["root"] / "os-fix"
    folder.mkdir()
    (folder / "Dockerfile").write_text(f"FROM {first['base']}\nUSER 0\nRUN echo fixed > /etc/os-fix\nUSER 1000\n")
    built = subprocess.run(["docker", "buildx", "build", "--output", f"type=image,name={new_base},push=true",
                            str(folder)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    report = first["root"] / "rebase.json"
    tag = f"{first['repository']}:rebased"
    done = _run(first["folder"], new_base, tag, "--rebase", f"{first['repository']}:1", "--push", report=report)
    assert done.returncode == 0, done.stderr[-4000:]
    doc = json.loads(report.read_text())
    assert doc["rebased"] == f"{first['repository']}:1" and doc["uploaded_blobs"] == 1
    assert doc["proof"][0].startswith("torch stack: ") and doc["proof"][1].startswith("smoke tests: passed")
    old_own = _layers(f"{first['repository']}:1")[len(_layers(first["base"])):]
    assert _layers(tag) == [*_layers(new_base), *old_own]
    ran = subprocess.run(["docker", "run", "--rm", tag, "sh", "-c", "cat /etc/os-fix; python -c 'import trainer; "
                          "print(trainer.VERSION)'"], capture_output=True, text=True, timeout=120)
    assert ran.stdout.split() == ["fixed", "1"], ran.stdout + ran.stderr


@pytest.mark.parametrize("kind", ["requirements.txt", "uv.lock"])
def test_a_requirements_txt_or_uv_lock_project_is_built_and_proven(first: dict[str, Any], docker_engine: Any,
                                                                    kind: str) -> None:
    """The other declarations, built for real on the same base: requirements.txt (code on the
    venv's path, the image's CMD from imagebuilder.toml, and two dependencies that exist only as
    source distributions, from an index made here: one whose build imports torch, named in
    no-build-isolation, builds against the base venv's torch (no second torch fetched); one whose
    isolated build needs a torch-stack member (nvidia-nvtx-cu12) gets the base's pin of it, not
    PyPI's newest) and uv.lock (through `uv export`, the project installed as its package)."""
    import sys

    folder = first["root"] / kind.replace(".", "-")
    folder.mkdir()
    index = contextlib.ExitStack()
    extra: tuple[str, ...] = ()
    if kind == "requirements.txt":
        (folder / "requirements.txt").write_text(f"tqdm==4.67.1\n{TORCH_SDIST}==0.1\n{NVTX_SDIST}==0.1\n")
        (folder / "app.py").write_text("import tqdm\nprint('app', tqdm.__version__)\n")
        (folder / "imagebuilder.toml").write_text(f'start = "python -m app"\nno-build-isolation = ["{TORCH_SDIST}"]\n')
        sdists = [recording_sdist(first["root"] / "sdists", TORCH_SDIST, "torch"),
                  recording_sdist(first["root"] / "sdists", NVTX_SDIST, "nvidia-nvtx-cu12")]
        extra = ("--extra-index-url", index.enter_context(simple_index(sdists, bridge_gateway())))
        check = "python -m app"
    else:
        (folder / "uvapp").mkdir()
        (folder / "uvapp" / "__init__.py").write_text("import tqdm\n")
        (folder / "pyproject.toml").write_text('[project]\nname = "uvapp"\nversion = "0.1"\nrequires-python = ">=3.10"\n'
                                               'dependencies = ["tqdm==4.67.1"]\n[tool.setuptools]\npackages = ["uvapp"]\n')
        uv = str(Path(sys.executable).parent / "uv")
        locked = subprocess.run([uv, "lock", "--directory", str(folder)], capture_output=True, text=True, timeout=300)
        assert locked.returncode == 0, locked.stderr
        check = "python -c 'import uvapp'"
    marker = f"{kind.split('.')[0]}-{uuid.uuid4().hex[:8]}"
    tag = f"imagebuilder-test/{marker}:1"
    try:
        with index:
            done = _run(folder, first["base"], tag, "--check", check, *extra)
        assert done.returncode == 0, done.stderr[-4000:]
        assert f"build: {kind} project" in done.stderr and f"proof: check: {check}" in done.stderr
        assert "proof: torch stack: " in done.stderr  # the base's torch RECORD and files, unchanged
        assert "tqdm==4.67.1" in (folder / "imagebuilder-project.lock").read_text()
        if kind == "requirements.txt":
            cmd = subprocess.run(["docker", "image", "inspect", tag, "--format", "{{json .Config.Cmd}}"],
                                 capture_output=True, text=True, check=True).stdout
            assert json.loads(cmd) == ["python", "-m", "app"]
            assert f"{TORCH_SDIST}==0.1" in (folder / "imagebuilder-project.lock").read_text()
            built = subprocess.run(["docker", "run", "--rm", tag, "python", "-c",
                                    "from importlib.metadata import distribution as d; "
                                    f"from {TORCH_SDIST} import _built_with as t; from {NVTX_SDIST} import _built_with as n; "
                                    "print(t.VERSION, t.WHERE, d('torch').version, d('torch').locate_file(''), "
                                    "n.VERSION, n.WHERE, d('nvidia-nvtx-cu12').version)"],
                                   capture_output=True, text=True, timeout=120)
            assert built.returncode == 0, built.stderr
            torch_built, torch_where, torch_version, venv, nvtx_built, nvtx_where, nvtx_version = built.stdout.split()
            # The venv's torch, not a fetched one.
            assert (torch_built, torch_where) == (torch_version, venv) and venv == SITE_PACKAGES, built.stdout
            # The isolated build fetched its own, at the base's pin (torch 2.6's 12.4.127), not PyPI's newest.
            assert "/pip-build-env-" in nvtx_where and nvtx_built == nvtx_version == "12.4.127", built.stdout
    finally:
        remove_local_tags(docker_engine, marker)
