"""`imagebuilder project`, the pure parts: what a project folder declares (project/source.py), a
conflict with the base named before uv runs (project/lock.py), the Dockerfile's layers
(project/render.py), and how the torch family is compared (project/probe.py). The real builds
are tests/test_project.py's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from imagebuilder.errors import BadRequest
from imagebuilder.lock.lockfile import Lock, Pin
from imagebuilder.project.command import ProofFailed
from imagebuilder.project.lock import ConflictsWithBase, StaleLock, check_against_base, resolve
from imagebuilder.project.probe import Venv, family_differences
from imagebuilder.project.render import BaseFacts, render_project
from imagebuilder.project.report import PROVE, ProjectReport, kept
from imagebuilder.project.source import NotAProject, read_project
from imagebuilder.trust.provenance import PROJECT_BUILD_TYPE, ProjectBuild, project_provenance, resolved_dependencies

BASE = {"torch": "2.6.0", "torchvision": "0.21.0", "numpy": "2.2.1", "nvidia-nccl-cu12": "2.21.5", "pip": "24.0"}


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_a_pyproject_project_is_its_dependencies_its_build_backend_and_its_tool_table(tmp_path: Path) -> None:
    project = read_project(write(tmp_path, {"pyproject.toml": """
[project]
name = "trainer"
version = "0.1"
dependencies = ["pandas==2.2.3", "torchmetrics>=1.4"]
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"
[tool.imagebuilder]
apt = ["libsndfile1"]
start = "python -m trainer --epochs 2"
no-build-isolation = ["flash-attn"]
"""}))
    assert project.kind == "pyproject.toml" and project.name == "trainer"
    assert project.requirements == ("pandas==2.2.3", "torchmetrics>=1.4", "setuptools>=68")
    assert project.apt == ("libsndfile1",)
    assert project.start == ("python", "-m", "trainer", "--epochs", "2")
    assert project.no_build_isolation == ("flash-attn",)


def test_requirements_txt_and_pylock_projects_install_no_package_of_their_own(tmp_path: Path) -> None:
    reqs = read_project(write(tmp_path / "r", {"requirements.txt": "# deps\npandas==2.2.3  # data\n\ntqdm\n"}))
    assert (reqs.kind, reqs.requirements, reqs.name) == ("requirements.txt", ("pandas==2.2.3", "tqdm"), None)
    pylock = read_project(write(tmp_path / "p", {"pylock.toml": """
lock-version = "1.0"
[[packages]]
name = "pandas"
version = "2.2.3"
[[packages]]
name = "local-thing"
directory = { path = "." }
"""}))
    assert (pylock.kind, pylock.requirements) == ("pylock.toml", ("pandas==2.2.3",))


def test_a_uv_lock_project_is_read_through_uv_export(tmp_path: Path) -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(uv).exists():
        pytest.fail("uv is missing: .ci/setup --tests installs it into .venv")
    folder = write(tmp_path, {"pyproject.toml": '[project]\nname = "app"\nversion = "0.1"\n'
                                                'requires-python = ">=3.10"\ndependencies = ["tqdm==4.67.1"]\n'})
    done = subprocess.run([uv, "lock", "--offline", "--directory", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:  # no cached tqdm metadata yet: the index, once
        done = subprocess.run([uv, "lock", "--directory", str(folder)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    project = read_project(folder, uv)
    assert project.kind == "uv.lock" and project.name == "app"
    assert any(r.startswith("tqdm==4.67.1") for r in project.requirements), project.requirements


@pytest.mark.parametrize(("files", "says"), [
    ({}, "no pyproject.toml with a [project] table"),
    ({"pyproject.toml": "[project\nname="}, "the whole file (line 1): is not TOML"),
    ({"pyproject.toml": "[project]\nversion = '1'\n"}, "project.name (line 1): is nothing (null), not a package name"),
    ({"pyproject.toml": "[project]\nname = 'x'\ndependencies = 'pandas'\n"}, "project.dependencies (line 3): is a string, not a list of requirements"),
    ({"requirements.txt": "pandas===\n"}, "requirements.txt: the whole file (line 1): 'pandas===' is not a requirement"),
    ({"requirements.txt": "-r other.txt\n"}, "(line 1): -r is not supported"),
    ({"requirements.txt": "x @ https://example.invalid/x.whl\n"}, "a direct URL cannot be locked"),
    ({"requirements.txt": "x\n", "imagebuilder.toml": "apt = ['Bad Name']\n"}, "apt[0] (line 1): 'Bad Name' is not a Debian package name"),
    ({"requirements.txt": "x\n", "imagebuilder.toml": "start = \"python 'unbalanced\"\n"}, "No closing quotation"),
    ({"requirements.txt": "x\n", "imagebuilder.toml": "start = []\n"}, "start (line 1): is empty, not a command"),
    ({"requirements.txt": "x\n", "imagebuilder.toml": "aptt = []\n"}, "aptt (line 1): is not a key of [tool.imagebuilder]"),
    ({"pylock.toml": "[[packages]]\nversion = '1'\n"}, "packages[0].name (line 1): is nothing (null), not a package name"),
])
def test_a_folder_that_is_not_a_usable_project_is_one_line_naming_the_file(tmp_path: Path, files: dict[str, str],
                                                                             says: str) -> None:
    with pytest.raises(BadRequest) as e:
        read_project(write(tmp_path / "p", files))
    assert says in str(e.value) and "\n" not in str(e.value)
    assert e.value.exit_code == 2


def test_a_file_is_not_a_project_folder(tmp_path: Path) -> None:
    with pytest.raises(NotAProject, match="not a folder"):
        read_project(write(tmp_path, {"f": ""}) / "f")


@pytest.mark.parametrize(("requirement", "names"), [
    ("torch==2.5.1", "torch 2.6.0 (the base's torch stack)"),
    ("torchvision<0.21", "torchvision 0.21.0"),
    ("nvidia-nccl-cu12>=2.23", "nvidia-nccl-cu12 2.21.5"),
    ("numpy<2", "numpy 2.2.1 (a package the base holds)"),
])
def test_a_requirement_the_base_cannot_satisfy_names_the_package_and_both_versions(
        tmp_path: Path, requirement: str, names: str) -> None:
    project = read_project(write(tmp_path, {"requirements.txt": f"pandas\n{requirement}\n"}))
    with pytest.raises(ConflictsWithBase) as e:
        check_against_base(project, BASE, "acme/torch:2.6")
    message = str(e.value)
    assert requirement in message and names in message and "nothing was built" in message
    assert e.value.exit_code == 2 and len([message, *e.value.details()]) <= 3


def test_requirements_the_base_satisfies_pass(tmp_path: Path) -> None:
    project = read_project(write(tmp_path, {"requirements.txt": "torch>=2.6\nnumpy\nnvidia-nccl-cu12==2.21.5\n"}))
    check_against_base(project, BASE, "acme/torch:2.6")


def test_locked_refuses_a_missing_or_stale_lock_before_resolving(tmp_path: Path) -> None:
    project = read_project(write(tmp_path, {"requirements.txt": "pandas==2.2.3\n"}))
    args = dict(uv="/nonexistent/uv", base_dists=BASE, base_name="b", python="3.11",
                platform="x86_64-manylinux_2_28", index_args=(), locked=True)
    with pytest.raises(StaleLock, match="no lock yet"):
        resolve(project, **args)  # type: ignore[arg-type]
    (tmp_path / "imagebuilder-project.lock").write_text("# inputs: 0000\npandas==2.2.2 --hash=sha256:" + "a" * 64 + "\n")
    with pytest.raises(StaleLock, match="the requirements or the base's packages changed"):
        resolve(project, **args)  # type: ignore[arg-type]


FACTS = BaseFacts(name="acme/torch:2.6", from_ref="acme/torch@sha256:" + "b" * 64, digest="sha256:" + "b" * 64,
                  image_id="sha256:" + "b" * 64,
                  user="1000", python="3.11", venv="/opt/venv", venv_owner="1000")
PINS = Lock("l", ("pandas",), "x86_64-manylinux_2_28", "3.11",
            (Pin("flash-attn", Version("2.7.4"), ("sha256:" + "c" * 64,)),
             Pin("pandas", Version("2.2.3"), ("sha256:" + "d" * 64,))))


def test_the_dockerfile_is_the_base_by_digest_then_packages_dependencies_and_code(tmp_path: Path) -> None:
    project = read_project(write(tmp_path, {"pyproject.toml": """
[project]
name = "trainer"
version = "0.1"
dependencies = ["pandas"]
[tool.imagebuilder]
apt = ["libsndfile1"]
start = ["python", "-m", "trainer"]
no-build-isolation = ["flash-attn"]
"""}))
    rendered = render_project(project, FACTS, PINS, "sha256:" + "e" * 64,
                              index_args=("--extra-index-url", "https://wheels.example/cu121", "--index-strategy",
                                          "unsafe-best-match"), ca=True)
    text = rendered.dockerfile
    assert f"FROM acme/torch@sha256:{'b' * 64}\n" in text
    assert text.index("apt-get install") < text.index("pip install --no-deps --require-hashes") < text.index("cp -a")
    assert "rm -rf /var/lib/apt/lists/*" in text
    assert "--extra-index-url https://wheels.example/cu121" in text and "index-strategy" not in text
    assert rendered.files == {"requirements.lock": f"pandas==2.2.3 \\\n    --hash=sha256:{'d' * 64}\n",
                              "no-build-isolation.lock": f"flash-attn==2.7.4 \\\n    --hash=sha256:{'c' * 64}\n"}
    assert "--no-build-isolation -r /tmp/imagebuilder-project/no-build-isolation.lock" in text
    assert "--no-build-isolation -r /tmp/imagebuilder-project/requirements.lock" not in text
    # pip 26 keeps PIP_CONSTRAINT out of isolated builds: the base's pins go in as build constraints,
    # only where the build is isolated (pip refuses --build-constraint with --no-build-isolation).
    isolated, not_isolated = (next(line for line in text.splitlines() if name in line)
                              for name in ("/requirements.lock", "/no-build-isolation.lock"))
    assert isolated.startswith(' && env ${PIP_CONSTRAINT:+PIP_BUILD_CONSTRAINT="$PIP_CONSTRAINT"} /opt/venv/bin/python')
    assert "PIP_BUILD_CONSTRAINT" not in not_isolated
    assert 'CMD ["python", "-m", "trainer"]' in text
    assert text.rstrip().endswith(f'io.imagebuilder.project.lock="sha256:{"e" * 64}"')
    assert "USER 1000\nRUN --mount=type=bind,from=imagebuilder-project" in text
    assert text.count("\nRUN ") == 3  # packages, dependencies, code: nothing else over the base


def test_a_project_with_nothing_to_add_is_one_layer_over_the_base(tmp_path: Path) -> None:
    project = read_project(write(tmp_path, {"requirements.txt": "numpy\n"}))
    rendered = render_project(project, FACTS, Lock("l", (), "", "3.11", ()), "sha256:" + "e" * 64, index_args=(),
                              ca=False)
    assert rendered.dockerfile.count("\nRUN ") == 1 and "apt-get" not in rendered.dockerfile
    assert "pip install" not in rendered.dockerfile and rendered.files == {}


def test_a_local_base_is_from_the_runs_alias_and_an_http_index_is_a_trusted_host_for_pip(tmp_path: Path) -> None:
    """A base only this engine holds is FROM the per-run name the command points at its id (BuildKit
    resolves a digest at a registry only); an in-house index over http is one pip would ignore."""
    project = read_project(write(tmp_path, {"requirements.txt": "pandas\n"}))
    local = replace(FACTS, from_ref="", local=True)
    args = dict(index_args=("--extra-index-url", "http://10.0.0.5:8080/simple", "--index-strategy",
                            "unsafe-best-match"), ca=False)
    text = render_project(project, local, PINS, "sha256:" + "e" * 64, local_alias="imagebuilder-project-base:r1",
                          **args).dockerfile  # type: ignore[arg-type]
    assert "\nFROM imagebuilder-project-base:r1\n" in text
    assert " --extra-index-url http://10.0.0.5:8080/simple --trusted-host 10.0.0.5:8080 " in text
    with pytest.raises(ValueError, match="per-run alias"):
        render_project(project, local, PINS, "sha256:" + "e" * 64, **args)  # type: ignore[arg-type]


def test_the_provenance_names_the_base_digest_and_the_lock_as_resolved_dependencies() -> None:
    build = ProjectBuild(project="trainer", tag="r:5000/acme/trainer:1", base_name="r:5000/pytorch:2.6",
                         base_repository="r:5000/pytorch", base_digest="sha256:" + "b" * 64,
                         lock_file="imagebuilder-project.lock", lock_digest="sha256:" + "e" * 64,
                         checks=("python -m trainer --help",), builder_version="0.1.0", invocation="r1",
                         started="2026-12-06T04:00:00Z", finished="2026-12-06T04:05:00Z")
    predicate = project_provenance(build)
    assert predicate["buildDefinition"]["buildType"] == PROJECT_BUILD_TYPE
    assert predicate["buildDefinition"]["resolvedDependencies"][0]["uri"] == "pkg:docker/r:5000/pytorch"
    assert resolved_dependencies(json.loads(json.dumps(predicate))) == {"base": "sha256:" + "b" * 64,
                                                                        "lock": "sha256:" + "e" * 64}
    with pytest.raises(ValueError, match="not a digest"):
        project_provenance(replace(build, lock_digest="e" * 64))


@pytest.mark.parametrize(("raised", "written", "says"), [
    (None, True, None),
    (ProofFailed(tag="acme/t:1", what="the torch stack is not the base's", more=["  torch 2.6.0: 1 file(s) differ"]),
     True, "acme/t:1: not tagged: the torch stack is not the base's"),
    (KeyboardInterrupt(), True, "interrupted (Ctrl-C)"),
    (OSError(28, "No space left on device"), True, "[Errno 28] No space left on device"),
    (StaleLock(path="p/imagebuilder-project.lock", why="no lock yet"), False, None),  # a wrong request: nothing
])
def test_the_report_is_written_however_the_run_ends(tmp_path: Path, raised: BaseException | None, written: bool,
                                                   says: str | None) -> None:
    path = tmp_path / "report.json"
    report = ProjectReport(tag="acme/t:1", project="p", base="b")
    try:
        with kept(report, path):
            report.phase = PROVE
            if raised is not None:
                raise raised
    except BaseException as e:  # noqa: BLE001 (each case's own, re-raised by kept)
        assert e is raised
    assert path.exists() == written
    if written:
        doc = json.loads(path.read_text())
        assert (doc["ok"], doc["error"]) == (raised is None, says)
        assert doc["phase"] == ("done" if raised is None else "prove")
        if isinstance(raised, ProofFailed):
            assert doc["error_details"] == ["torch 2.6.0: 1 file(s) differ"]


def _family(**versions: tuple[str, str, int]) -> Venv:
    return Venv("3.11", {}, {name.replace("_", "-"): {"version": v, "record": r, "bad": ["torch/lib/x.so"] * bad,
                                                       "bad_count": bad}
                            for name, (v, r, bad) in versions.items()})


def test_the_family_must_be_the_bases_byte_for_byte() -> None:
    base = _family(torch=("2.6.0", "r1", 0), nvidia_nccl_cu12=("2.21.5", "r2", 0))
    assert family_differences(base, base) == []
    assert family_differences(base, _family(torch=("2.5.1", "r9", 0), nvidia_nccl_cu12=("2.21.5", "r2", 0))) == [
        "torch was replaced: base 2.6.0, project image 2.5.1"]
    assert family_differences(base, _family(torch=("2.6.0", "r9", 0), nvidia_nccl_cu12=("2.21.5", "r2", 0))) == [
        "torch 2.6.0 was reinstalled: its RECORD differs from the base's"]
    assert family_differences(base, _family(torch=("2.6.0", "r1", 1), nvidia_nccl_cu12=("2.21.5", "r2", 0))) == [
        "torch 2.6.0: 1 file(s) differ from RECORD (torch/lib/x.so)"]
    added = _family(torch=("2.6.0", "r1", 0), nvidia_nccl_cu12=("2.21.5", "r2", 0), triton=("3.2.0", "r3", 0))
    assert family_differences(base, added) == [
        "triton 3.2.0 was added (the base has none): it would shadow the base's stack"]
    assert family_differences(base, _family(torch=("2.6.0", "r1", 0))) == [
        "nvidia-nccl-cu12 2.21.5 is gone from the project image"]


class _Registry:
    """Images as documents: what plan_rebase and push_rebased ask of a registry."""

    def __init__(self, images: dict[str, tuple[list[str], dict[str, str], int]]) -> None:
        self.images: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {ref: ({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                              "config": {"digest": "sha256:c", "size": 1},
                              "layers": [{"digest": d, "size": 1} for d in layers]},
                             {"config": {"Labels": labels}, "rootfs": {"diff_ids": [f"diff-{d}" for d in layers]},
                              "history": [{}] * history})
                       for ref, (layers, labels, history) in images.items()}
        self.mounted: list[tuple[str, str]] = []
        self.uploaded: list[str] = []
        self.put: list[str] = []

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None:
        found = self.images.get(ref)
        return (found[0], str(found[0]["mediaType"])) if found else None

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        found = self.images.get(ref)
        return (found[1], ()) if found else None

    def has_blob(self, ref: str, digest: str) -> bool:
        return False

    def mount(self, ref: str, digest: str, source: str) -> bool:
        self.mounted.append((digest, source))
        return True

    def upload_blob(self, ref: str, digest: str, source: Any, size: int) -> None:
        self.uploaded.append(digest)

    def put_manifest(self, ref: str, body: bytes, media_type: str) -> dict[str, str]:
        self.put.append(ref)
        return {}


BASE_LABELS = {"io.imagebuilder.lock": "locks/x.txt sha256:1", "io.imagebuilder.python": "3.11"}
OLD = {"io.imagebuilder.project.base.digest": "sha256:b1", "io.imagebuilder.project.base.name": "r:5000/base:1",
       "io.imagebuilder.project.lock": "sha256:l", "io.imagebuilder.project.apt": "", **BASE_LABELS}


def _registry(old: dict[str, str] = OLD, new_base: dict[str, str] = BASE_LABELS) -> _Registry:
    return _Registry({"r:5000/base@sha256:b1": (["b1", "b2"], BASE_LABELS, 3),
                      "r:5000/base:2": (["b1", "b3", "b4"], new_base, 4),
                      "r:5000/app:1": (["b1", "b2", "deps", "code"], old, 5)})


def test_a_rebase_takes_the_project_layers_onto_the_new_base_and_uploads_only_the_config() -> None:
    from imagebuilder.project.rebase import RebasePlan, plan_rebase, push_rebased, rebased

    registry = _registry()
    plan = plan_rebase(registry, "r:5000/app:1", "r:5000/base:2", "sha256:l")
    assert isinstance(plan, RebasePlan), plan
    config, manifest = rebased(plan, "r:5000/base:2", "sha256:b9")
    doc, conf = json.loads(manifest), json.loads(config)
    assert [x["digest"] for x in doc["layers"]] == ["b1", "b3", "b4", "deps", "code"]
    assert conf["rootfs"]["diff_ids"] == ["diff-b1", "diff-b3", "diff-b4", "diff-deps", "diff-code"]
    assert len(conf["history"]) == 4 + 2
    assert conf["config"]["Labels"]["io.imagebuilder.project.base.digest"] == "sha256:b9"
    digest, uploaded = push_rebased(registry, plan, "r:5000/app:2", config, manifest)
    assert uploaded == 1 and registry.mounted == [("b1", "r:5000/base:2"), ("b3", "r:5000/base:2"),
                                                  ("b4", "r:5000/base:2"), ("deps", "r:5000/app:1"),
                                                  ("code", "r:5000/app:1")]
    assert registry.put == [f"r:5000/app@{digest}"]  # by digest: tagged only once proven


@pytest.mark.parametrize(("old", "new_base", "lock", "why"), [
    ({**OLD, "io.imagebuilder.project.apt": "libsndfile1"}, BASE_LABELS, "sha256:l", "installed OS packages"),
    (OLD, BASE_LABELS, "sha256:other", "the project's lock changed"),
    (OLD, {**BASE_LABELS, "io.imagebuilder.lock": "locks/y.txt sha256:2"}, "sha256:l", "another venv"),
    (OLD, {"io.imagebuilder.python": "3.11"}, "sha256:l", "(none)"),
    ({k: v for k, v in OLD.items() if "project" not in k}, BASE_LABELS, "sha256:l", "is not a project image"),
])
def test_a_rebase_that_is_not_sound_says_why(old: dict[str, str], new_base: dict[str, str], lock: str,
                                             why: str) -> None:
    from imagebuilder.project.rebase import plan_rebase

    plan = plan_rebase(_registry(old, new_base), "r:5000/app:1", "r:5000/base:2", lock)
    assert isinstance(plan, str) and why in plan, plan
