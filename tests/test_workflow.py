""".github/workflows/*.yml: valid for GitHub Actions, and what they run is what imagebuilder accepts.

publish.yml publishes the matrix; matrix-update.yml adds releases the index has and opens a pull request.

Every workflow is validated against SchemaStore's GitHub workflow schema with check-jsonschema
(a maintained checker whose vendored schema works offline); then what the schema cannot know:
jobs' needs exist, the plan job's script runs for real (imagebuilder + jq) and one generated
matrix entry goes through the publish job's command line with `--dry-run --force`; the update
job's steps run against a local git origin, with a recorder for `gh`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.matrix_text import remove_block
from support.unavailable import _unavailable

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "publish.yml"
UPDATE = REPO_ROOT / ".github" / "workflows" / "matrix-update.yml"
PUBLISH_KEYS = ("torch", "cuda", "python", "os")
SIGNING_ENV = {"COSIGN_PRIVATE_KEY": "${{ secrets.COSIGN_PRIVATE_KEY }}",
               "COSIGN_PASSWORD": "${{ secrets.COSIGN_PASSWORD }}"}


def load_workflow(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key `on` as True.
    document["on"] = document.pop(True, document.get("on"))
    return dict(document)


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return load_workflow(WORKFLOW)


@pytest.fixture(scope="module", params=[WORKFLOW, UPDATE], ids=lambda p: p.name)
def any_workflow(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_workflow(request.param)


# --------------------------------------------------------------------------- schema


@pytest.mark.parametrize("path", sorted((REPO_ROOT / ".github" / "workflows").glob("*.yml")), ids=lambda p: p.name)
def test_workflow_is_valid_for_github_actions(path: Path) -> None:
    """SchemaStore's GitHub workflow schema, vendored in check-jsonschema (works offline):
    triggers, cron strings, job and step keys, runs-on, strategy, permissions."""
    checker = Path(sys.executable).parent / "check-jsonschema"
    done = subprocess.run([str(checker), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_triggers(workflow: dict[str, Any]) -> None:
    on = workflow["on"]
    assert set(on) == {"schedule", "workflow_dispatch"}
    inputs = on["workflow_dispatch"]["inputs"]
    assert inputs["torch"]["type"] == "string" and inputs["torch"]["required"] is False
    assert inputs["force"]["type"] == "boolean" and inputs["force"]["default"] is False
    for spec in inputs.values():
        assert spec["description"]


def test_jobs_are_complete_and_needs_exist(any_workflow: dict[str, Any]) -> None:
    jobs = any_workflow["jobs"]
    for name, job in jobs.items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name)
        assert job.get("runs-on"), f"{name} has no runs-on"
        assert job.get("steps"), f"{name} has no steps"
        needs = job.get("needs", [])
        for needed in [needs] if isinstance(needs, str) else needs:
            assert needed in jobs and needed != name, f"{name} needs unknown job {needed}"
        ids = [step["id"] for step in job["steps"] if "id" in step]
        assert len(ids) == len(set(ids))
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), f"{name}: a step needs exactly one of uses/run: {step}"
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[\w.-]+", step["uses"]), step["uses"]


def test_publish_job_fans_out_on_gpu_runners(workflow: dict[str, Any]) -> None:
    job = workflow["jobs"]["publish"]
    assert job["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]
    assert job["strategy"]["fail-fast"] is False
    assert job["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert "plan" in ([job["needs"]] if isinstance(job["needs"], str) else job["needs"])
    plan = workflow["jobs"]["plan"]
    output = plan["outputs"]["matrix"]
    step_id, name = re.fullmatch(r"\$\{\{ steps\.([\w-]+)\.outputs\.([\w-]+) \}\}", output).groups()  # type: ignore[union-attr]
    (step,) = [s for s in plan["steps"] if s.get("id") == step_id]
    assert f"echo \"{name}=" in step["run"] and "$GITHUB_OUTPUT" in step["run"]
    login = " ".join(step.get("run", "") + str(step.get("with", "")) for step in job["steps"])
    assert "--password-stdin" in login or "docker/login-action" in login
    assert "secrets." in json.dumps(job["steps"])  # the password comes from a secret, not the file


# --------------------------------------------------------------------------- the scripts, run


def _shim(directory: Path, extra: str = "") -> Path:
    """An `imagebuilder` on PATH that is this checkout's CLI (+ `extra` arguments)."""
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "imagebuilder"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m imagebuilder "$@" {extra}\n')
    shim.chmod(0o755)
    return directory


def _run_step(script: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env})


def _run_plan(workflow: dict[str, Any], tmp: Path, torch: str) -> dict[str, str]:
    """The plan job's matrix step, run with this checkout's imagebuilder and jq; its outputs."""
    if shutil.which("jq") is None:
        _unavailable("jq is not installed (GitHub's runners have it; .ci/setup --tests installs it)")
    (step,) = [s for s in workflow["jobs"]["plan"]["steps"] if s.get("id") == "matrix"]
    output = tmp / "github_output"
    done = _run_step(step["run"], {"PATH": f"{_shim(tmp / 'bin')}:{os.environ['PATH']}", "TORCH": torch,
                                   "GITHUB_OUTPUT": str(output)}, tmp)
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


@pytest.fixture(scope="module")
def generated(workflow: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The plan job's matrix step for torch 2.6."""
    tmp = tmp_path_factory.mktemp("plan")
    outputs = _run_plan(workflow, tmp, "2.6")
    images = json.loads((tmp / "images.json").read_text())["include"]
    return {"matrix": json.loads(outputs["matrix"]), "count": outputs["count"], "images": images}


def test_the_plan_job_groups_images_by_combination(generated: dict[str, Any]) -> None:
    combos = generated["matrix"]["include"]
    images = generated["images"]
    assert int(generated["count"]) == len(combos) > 0
    assert all(set(entry) == set(PUBLISH_KEYS) for entry in combos)
    assert {tuple(e[k] for k in PUBLISH_KEYS) for e in images} == {tuple(c[k] for k in PUBLISH_KEYS) for c in combos}
    assert len(combos) < len(images)  # variants share a job
    assert len(combos) <= 256  # GitHub's limit of jobs per matrix


def test_each_job_publishes_its_combination_runtime_first(workflow: dict[str, Any], generated: dict[str, Any],
                                                          signing_keys: dict[str, Path], tmp_path: Path) -> None:
    """The publish step's exact command line, for a generated entry, is accepted by imagebuilder
    and plans that combination's images (--dry-run --force: no registry, nothing built). The
    secrets are a real key, as on the runner: the dry run tries the key as the run does."""
    job = workflow["jobs"]["publish"]
    (step,) = [s for s in job["steps"] if s.get("name") == "Publish"]
    combos = generated["matrix"]["include"]
    entry = next(c for c in combos
                 if {i["variant"] for i in generated["images"] if all(i[k] == c[k] for k in PUBLISH_KEYS)} >= {"runtime", "jupyter"})
    env = {name.upper(): entry[name] for name in PUBLISH_KEYS}
    assert set(step["env"]) == {*env, "FORCE", "SQUASHFS", *SIGNING_ENV}
    assert all(step["env"][name] == f"${{{{ matrix.{name.lower()} }}}}" for name in env)
    env.update(COSIGN_PRIVATE_KEY=signing_keys["key"].read_text(), COSIGN_PASSWORD="")
    env.update(FORCE="", SQUASHFS="--squashfs", REGISTRY="127.0.0.1:1/ci", PATH=f"{_shim(tmp_path / 'bin', '--dry-run --force')}:{os.environ['PATH']}")
    done = _run_step(step["run"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    wanted = [i for i in generated["images"] if all(i[k] == entry[k] for k in PUBLISH_KEYS)]
    # x64 runners publish the linux/amd64 images under their platform's tags; merge joins them.
    positions = {i["variant"]: done.stdout.index(f"127.0.0.1:1/ci/pytorch:{i['tag']}-amd64 ") for i in wanted}
    assert positions["runtime"] < positions["jupyter"]
    plan_lines = [line for line in done.stdout.splitlines() if re.match(r"^\d+\s", line)]
    assert len(plan_lines) == len(wanted)


@pytest.mark.parametrize("job_name, step_name", [("publish", "Publish"), ("publish-arm64", "Publish"),
                                                 ("merge", "Merge")])
def test_every_publishing_step_signs_with_the_key_from_the_secrets(workflow: dict[str, Any], job_name: str,
                                                                   step_name: str) -> None:
    """The key and its password reach only the step that signs, from secrets, as cosign's env://
    key reference; the job installs cosign first."""
    job = workflow["jobs"][job_name]
    (step,) = [s for s in job["steps"] if s.get("name") == step_name]
    assert {k: step["env"][k] for k in SIGNING_ENV} == SIGNING_ENV
    assert "--sign-key env://COSIGN_PRIVATE_KEY" in step["run"]
    names = [s.get("name") for s in job["steps"]]
    assert names.index("Install cosign") < names.index(step_name)
    others = [s for s in job["steps"] if s is not step]
    assert "COSIGN_PRIVATE_KEY }}" not in json.dumps(others)  # no other step sees the key


def test_force_input_becomes_the_flag(workflow: dict[str, Any]) -> None:
    (step,) = [s for s in workflow["jobs"]["publish"]["steps"] if s.get("name") == "Publish"]
    assert step["env"]["FORCE"] == "${{ inputs.force && '--force' || '' }}"
    assert "$FORCE" in step["run"] and "--registry \"$REGISTRY\"" in step["run"]
    assert workflow["jobs"]["publish"]["env"]["REGISTRY"] == "${{ vars.REGISTRY }}"


def test_arm64_runners_publish_the_releases_with_aarch64_wheels_and_merge_joins_them(
        workflow: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    """The plan step's arm64 matrix, run for real over the whole matrix: only 2.11+ releases;
    the arm64 job publishes linux/arm64 without merging; the merge job runs after both."""
    outputs = _run_plan(workflow, tmp_path_factory.mktemp("plan-arm64"), "")
    arm64 = json.loads(outputs["arm64_matrix"])["include"]
    assert int(outputs["arm64_count"]) == len(arm64) > 0
    assert {c["torch"].rsplit(".", 1)[0] for c in arm64} >= {"2.11"}
    assert all(tuple(int(x) for x in c["torch"].split(".")[:2]) >= (2, 11) for c in arm64)
    jobs = workflow["jobs"]
    arm_job = jobs["publish-arm64"]
    assert arm_job["runs-on"] == ["self-hosted", "linux", "ARM64", "gpu"]
    assert arm_job["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.arm64_matrix) }}"
    (publish_step,) = [s for s in arm_job["steps"] if s.get("name") == "Publish"]
    assert "--platform linux/arm64 --no-merge" in publish_step["run"]
    merge = jobs["merge"]
    assert set(merge["needs"]) == {"plan", "publish", "publish-arm64"}
    (merge_step,) = [s for s in merge["steps"] if s.get("name") == "Merge"]
    assert "--platform linux/amd64,linux/arm64 --merge-only" in merge_step["run"]
    # Also after failed platform jobs: it merges every tag it can, and its report (a line per
    # tag: written, unchanged, skipped and why) is kept, also when it fails naming the rest.
    assert "!cancelled()" in merge["if"] and "--report merge-report.json" in merge_step["run"]
    (upload,) = [s for s in merge["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert upload["if"] == "always()" and upload["with"]["path"] == "merge-report.json"


# --------------------------------------------------------------------------- matrix-update.yml


@pytest.fixture(scope="module")
def update() -> dict[str, Any]:
    return load_workflow(UPDATE)


def test_update_runs_weekly_and_may_open_pull_requests(update: dict[str, Any]) -> None:
    assert set(update["on"]) == {"schedule", "workflow_dispatch"}  # the cron string: the schema test
    assert update["permissions"] == {"contents": "write", "pull-requests": "write"}
    steps = update["jobs"]["update"]["steps"]
    (add,) = [s for s in steps if s.get("id") == "add"]
    (pr,) = [s for s in steps if s.get("name") == "Open a pull request"]
    assert "matrix add --new" in add["run"]
    assert pr["if"] == "steps.add.outputs.changed == 'true'"
    assert pr["env"]["GH_TOKEN"] == "${{ github.token }}"  # the job's token, not a stored secret
    assert "gh pr create" in pr["run"] and '--head "$branch"' in pr["run"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A clone (with an origin to push to) of a repository whose matrix.yaml lacks torch 2.15."""
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    _git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    _git(tmp_path, "clone", "-q", str(origin), str(work))
    (work / "matrix.yaml").write_text(remove_block((REPO_ROOT / "matrix.yaml").read_text(), "2.15"))
    _git(work, "add", "matrix.yaml")
    _git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "matrix")
    _git(work, "push", "-q", "origin", "main")
    return work


@pytest.mark.slow
def test_update_adds_a_new_release_and_opens_one_pull_request(update: dict[str, Any], checkout: Path) -> None:
    """Both steps run for real (the index is read; `gh` is a recorder): 2.15.0 is added, pushed on
    its own branch and proposed once; a second run finds the branch and proposes nothing."""
    steps = update["jobs"]["update"]["steps"]
    (add,) = [s for s in steps if s.get("id") == "add"]
    (pr,) = [s for s in steps if s.get("name") == "Open a pull request"]
    bin_dir = _shim(checkout.parent / "bin")
    calls = checkout.parent / "gh-calls"
    (bin_dir / "gh").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    (bin_dir / "gh").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GITHUB_OUTPUT": str(checkout / ".out")}
    done = _run_step(add["run"], env, checkout)
    assert done.returncode == 0, done.stderr
    outputs = dict(line.split("=", 1) for line in (checkout / ".out").read_text().splitlines())
    assert outputs == {"changed": "true", "versions": "2.15.0"}
    for _ in range(2):
        done = _run_step(pr["run"], {**env, "VERSIONS": "2.15.0", "BASE": "main", "GH_TOKEN": "x"}, checkout)
        assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == [
        "pr create --base main --head matrix/torch-2.15.0 --title matrix.yaml: torch 2.15.0 --body-file body.md"]
    pushed = _git(checkout, "show", "origin/matrix/torch-2.15.0:matrix.yaml")
    assert '  "2.15":\n    version: "2.15.0"' in pushed


# --------------------------------------------------------------------------- locks.yml: drift becomes a pull request

LOCKS_WORKFLOW = REPO_ROOT / ".github" / "workflows" / "locks.yml"


@pytest.fixture(scope="module")
def locks_workflow() -> dict[str, Any]:
    document = yaml.safe_load(LOCKS_WORKFLOW.read_text())
    document["on"] = document.pop(True, document.get("on"))
    return dict(document)


def test_locks_workflow_is_scheduled_and_may_open_pull_requests(locks_workflow: dict[str, Any]) -> None:
    """(The schema test above checks its keys and cron; this checks what the schema cannot.)"""
    on = locks_workflow["on"]
    assert set(on) == {"schedule", "workflow_dispatch"}
    assert locks_workflow["permissions"] == {"contents": "write", "pull-requests": "write"}
    (job,) = locks_workflow["jobs"].values()
    ids = {step.get("id") for step in job["steps"]}
    for step in job["steps"]:
        text = json.dumps(step)
        for name in re.findall(r"steps\.([\w-]+)\.", text):
            assert name in ids, f"{step.get('name')}: no step id {name}"
        for name in re.findall(r"inputs\.([\w-]+)", text):
            assert name in on["workflow_dispatch"]["inputs"], text
    text = json.dumps(job["steps"])
    # Drift is never published from here: the refreshed locks go to a branch and a pull request.
    assert "gh pr create" in text and "git add locks" in text and "imagebuilder publish" not in text


@pytest.mark.network
def test_locks_workflow_check_step_finds_drift_and_the_refresh_step_fixes_it(
        locks_workflow: dict[str, Any], tmp_path: Path) -> None:
    """The check and refresh steps, run for real against the index (uv), on a copy of the
    matrix and its locks, restricted to the image CI builds."""
    if not (Path(sys.executable).parent / "uv").exists() and shutil.which("uv") is None:
        _unavailable("uv is not installed (.ci/setup --tests installs it)")
    from imagebuilder.lock.lockfile import parse_lock
    from packaging.version import Version

    shutil.copy(REPO_ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(REPO_ROOT / "locks", tmp_path / "locks")
    (job,) = locks_workflow["jobs"].values()
    steps = {step.get("id"): step for step in job["steps"]}
    only = "--cuda 12.1 --os debian12 --variant runtime"
    env = {"PATH": f"{_shim(tmp_path / 'bin', only)}:{os.environ['PATH']}", "TORCH": "2.6"}

    def check() -> str:
        output = tmp_path / "github_output"
        output.write_text("")
        done = _run_step(steps["check"]["run"], {**env, "GITHUB_OUTPUT": str(output)}, tmp_path)
        assert done.returncode == 0, done.stderr
        return output.read_text().strip()

    assert check() == "drift=false"
    path = tmp_path / "locks" / "torch2.6.0-cu124-py3.11-runtime.txt"
    lock = parse_lock(path.stem, path.read_text())
    from dataclasses import replace

    path.write_text(replace(lock, pins=tuple(replace(p, version=Version("1.26.0")) if p.name == "numpy" else p
                                             for p in lock.pins)).text())
    assert check() == "drift=true"
    assert "numpy 1.26.0 ->" in (tmp_path / "drift.txt").read_text()
    done = _run_step(steps["refresh"]["run"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert path.read_text() == lock.text() and check() == "drift=false"
