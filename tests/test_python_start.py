"""The run contract at Python's start (templates/python_start.py.j2, issue 42), run for real as a
uid that no passwd file names, by the OS's own Python, with the environments the cluster runtimes
give: Docker's HOME=/ for an unknown uid, an empty HOME, Apptainer's bound host home, a folder a
hostile user made first in a shared /tmp. The image's compile cache is a folder of this test's,
rendered into the module as render() renders the image's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.unavailable import _unavailable

from imagebuilder.build.render import PYTHON_START, PYTHON_START_TEMPLATE, _environment
from imagebuilder.resources import templates_dir

UID = 54321  # in no passwd file here
PYTHON = "/usr/bin/python3"  # the OS's: this uid can read it (the venv's lies under /root)
CACHES = ("TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH")


@pytest.fixture(autouse=True)
def _root() -> None:
    """The module runs as another uid (setpriv): root only; CI runs as root (a failure there)."""
    if os.geteuid() != 0:
        _unavailable("runs the module as another uid (setpriv): needs root")


def start(tmp_path: Path, env: dict[str, str], image_cache: Path) -> dict[str, str]:
    """Import the rendered module as UID with exactly env; the environment it leaves."""
    module = tmp_path / "module"
    module.mkdir(exist_ok=True)
    source = _environment(str(templates_dir())).get_template(PYTHON_START_TEMPLATE).render(compile_cache=str(image_cache))
    (module / f"{PYTHON_START}.py").write_text(source)
    for folder in (tmp_path, module):
        folder.chmod(0o755)
    done = subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "env", "-i",
                           *(f"{k}={v}" for k, v in env.items()), PYTHON, "-S", "-c",
                           f"import sys; sys.path.insert(0, {str(module)!r}); import {PYTHON_START}; "
                           "import os, json; print(json.dumps(dict(os.environ)))"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


def image_env(cache: Path, **extra: str) -> dict[str, str]:
    return {"TORCH_HOME": str(cache), "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
            "TRITON_CACHE_DIR": f"{cache}/triton", "CUDA_CACHE_PATH": f"{cache}/nv", **extra}


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder the other uid can reach (pytest's own lie under a folder only root can enter)."""
    folder = Path(tempfile.mkdtemp(prefix="ib-python-start-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture
def read_only_cache(tmp_path: Path) -> Path:
    """The image's cache folder as a read-only root shows it to any uid: there, not writable."""
    cache = tmp_path / "image" / "home" / "torch" / ".cache" / "torch"
    for name in ("inductor", "triton", "nv"):
        (cache / name).mkdir(parents=True)
    for folder in [tmp_path / "image", *cache.parents, cache, *(cache / n for n in ("inductor", "triton", "nv"))]:
        if str(folder).startswith(str(tmp_path / "image")):
            folder.chmod(0o755)
    return cache


@pytest.mark.parametrize("home", ["", "/"])
def test_a_uid_without_a_home_gets_one_and_a_name_and_its_caches_move_into_it(tmp_path, read_only_cache, home):
    temporary = tmp_path / "tmp"
    temporary.mkdir(mode=0o1777)
    temporary.chmod(0o1777)
    env = start(tmp_path, image_env(read_only_cache, HOME=home, TMPDIR=str(temporary)), read_only_cache)
    new_home = temporary / f"home-{UID}"
    assert env["HOME"] == str(new_home)
    assert (new_home.stat().st_uid, new_home.stat().st_mode & 0o777) == (UID, 0o700)
    assert (env["USER"], env["LOGNAME"]) == (f"uid{UID}", f"uid{UID}")
    moved = f"{new_home}/.cache/torch"
    assert {name: env[name] for name in CACHES} == {"TORCH_HOME": moved, "TORCHINDUCTOR_CACHE_DIR": f"{moved}/inductor",
                                                    "TRITON_CACHE_DIR": f"{moved}/triton", "CUDA_CACHE_PATH": f"{moved}/nv"}


def test_a_bound_host_home_is_kept_and_holds_the_caches(tmp_path, read_only_cache):
    """Apptainer binds the host user's home: it stays HOME, and the kernels outlive the job there."""
    home = tmp_path / "host-home"
    home.mkdir()
    os.chown(home, UID, UID)
    env = start(tmp_path, image_env(read_only_cache, HOME=str(home), USER="alice"), read_only_cache)
    assert (env["HOME"], env["USER"], "LOGNAME" in env) == (str(home), "alice", False)
    assert env["TRITON_CACHE_DIR"] == f"{home}/.cache/torch/triton"


def test_caches_this_uid_can_write_and_those_the_user_chose_stay(tmp_path, read_only_cache):
    """A volume mounted at one cache's folder keeps that one; a variable set elsewhere is the user's."""
    home = tmp_path / "host-home"
    home.mkdir()
    os.chown(home, UID, UID)
    os.chown(read_only_cache / "inductor", UID, UID)  # as a volume mounted there would be
    env = start(tmp_path, image_env(read_only_cache, HOME=str(home), TRITON_CACHE_DIR="/nowhere/triton"),
                read_only_cache)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{read_only_cache}/inductor"
    assert env["TRITON_CACHE_DIR"] == "/nowhere/triton"
    assert env["CUDA_CACHE_PATH"] == f"{home}/.cache/torch/nv"


def test_a_home_another_uid_made_first_in_a_shared_tmp_is_never_taken(tmp_path, read_only_cache):
    """/tmp may be the host's (Apptainer binds it): a folder or link already at /tmp/home-<uid>
    that is not this uid's own is refused; the caches go to a folder of its own instead."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    temporary.chmod(0o1777)
    (temporary / f"home-{UID}").mkdir(mode=0o777)  # another user's, open to all
    (temporary / f"home-{UID}").chmod(0o777)
    env = start(tmp_path, image_env(read_only_cache, HOME="/", TMPDIR=str(temporary)), read_only_cache)
    assert env["HOME"] == "/"
    own = temporary / f"torch-cache-{UID}"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{own}/inductor" and own.stat().st_uid == UID
