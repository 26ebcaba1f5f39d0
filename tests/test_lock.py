"""Locks: the lock file format, naming, staleness, base pins and the inputs hash (fast, no
Docker); `imagebuilder lock` against the real index with the real uv; and inside the real
torch 2.6 runtime image that the session shares (conftest's runtime_image): pip freeze
equals the lock, the constraint file protects torch, the SBOM lists what is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from support.fakes import FakeDigests, FakeImages
from support.frozen_index import frozen_html, frozen_index, frozen_json
from support.real_images import REPO_ROOT, imagebuilder
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.lock import command as locking
from imagebuilder.lock.base_pin import BasePin, pin_base
from imagebuilder.lock.index import default_index_url
from imagebuilder.errors import BadRequest
from imagebuilder.lock.lockfile import (BadExtra, Lock, LockSet, Pin, StaleLock, load_locks, lock_name,
                                        parse_extras, parse_lock, with_suffix)
from imagebuilder.lock.uv_compile import ResolutionFailed
from imagebuilder.matrix.load import load_matrix, parse_matrix
from imagebuilder.matrix.resolve import Request, enumerate_matrix, resolve
from imagebuilder.matrix.selection import Selection
from imagebuilder.publish.planner import publish_images

MATRIX = load_matrix(REPO_ROOT / "matrix.yaml")
LOCKS = load_locks(REPO_ROOT / "locks")
E2E = Request("2.6", "12.1", None, "runtime", "debian12")  # conftest's runtime_image
E2E_LOCK = "torch2.6.0-cu124-py3.11-runtime"
H = ["sha256:" + c * 64 for c in "abcdef"]


def pin(name: str, version: str, *hashes: str) -> Pin:
    return Pin(name, Version(version), tuple(hashes or H[:1]))


# --------------------------------------------------------------------------- the file (pure)


def test_a_lock_reads_back_what_it_wrote_and_uv_output_reads_the_same() -> None:
    lock = Lock("x", ("torch==2.6.0", "pip"), "x86_64-manylinux_2_28", "3.11",
                (pin("nvidia-nccl-cu12", "2.21.5", H[0], H[1]), pin("torch", "2.6.0", H[2])))
    again = parse_lock("x", lock.text())
    assert again.text() == lock.text()
    assert again.requirements == lock.requirements and again.python == "3.11"
    uv_output = ("Torch==2.6.0 \\\n    --hash=sha256:" + "c" * 64 + "\n    # via -r -\n"
                 "nvidia_nccl_cu12==2.21.5 \\\n    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64 + "\n")
    assert parse_lock("x", uv_output).pins == lock.pins  # names canonical, hashes sorted


def test_the_constraint_file_pins_torch_and_its_cuda_stack_only() -> None:
    lock = Lock("x", (), "", "", (pin("numpy", "2.4.6"), pin("nvidia-cublas-cu12", "12.4.5.8"),
                                  pin("torch", "2.6.0"), pin("torchvision", "0.21.0"), pin("triton", "3.2.0")))
    assert lock.constraints() == "nvidia-cublas-cu12==12.4.5.8\ntorch==2.6.0\ntorchvision==0.21.0\ntriton==3.2.0\n"


@pytest.mark.parametrize(("line", "says"), [
    ("torch>=2.6", "x: the whole file (line 2): cannot read 'torch>=2.6'"),
    ("-e .", "x: the whole file (line 2): cannot read '-e .'"),
    ("torch==2.6.0 --hash", "x: torch.hash (line 2): '--hash' is not --hash=sha256:<64 hex digits>"),
    ("torch==2.6.0 \\\n  --hash=md5:00", "x: torch.hash (line 2): '--hash=md5:00' is not"),
    ("torch==2.x", "x: torch.version (line 2): '2.x' is not a version"),
])
def test_a_line_that_is_not_a_pin_is_an_error_naming_the_lock_the_package_and_the_line(line: str, says: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_lock("x", "# python: 3.12\n" + line + "\n")
    assert str(e.value).startswith(says) and e.value.exit_code == 2


def test_images_installing_the_same_set_share_a_lock_and_extras_name_their_own() -> None:
    debian = resolve(MATRIX, Request("2.6", "12.4", "3.11", "runtime", "debian12"))
    ubuntu = resolve(MATRIX, Request("2.6", "12.4", "3.11", "runtime", "ubuntu22.04"))
    cuda121 = resolve(MATRIX, E2E)
    assert lock_name(debian) == lock_name(ubuntu) == lock_name(cuda121) == E2E_LOCK
    a = parse_extras(["tqdm", "pandas==2.2.3"])
    assert a == parse_extras(["pandas == 2.2.3", "tqdm", "tqdm"])
    assert lock_name(debian, a).startswith(E2E_LOCK + "-with-")
    with pytest.raises(BadExtra, match="not a requirement"):
        parse_extras(["pandas==="])


def test_a_lock_made_for_other_requirements_is_stale_not_silently_used() -> None:
    spec = resolve(MATRIX, E2E)
    current = LOCKS.locks[E2E_LOCK]
    assert LOCKS.lock_for(spec, MATRIX) is current
    old = replace(current, requirements=("torch==2.6.0", "torchvision==0.20.0", "torchaudio==2.6.0", "pip"))
    with pytest.raises(StaleLock, match="imagebuilder lock --torch 2.6.0 --cuda 12.1"):
        LockSet(None, {E2E_LOCK: old}).lock_for(spec, MATRIX)


def test_the_committed_locks_cover_what_ci_builds_and_pin_pip() -> None:
    for request in (E2E, replace(E2E, variant="jupyter"), Request("2.12", "13.0", None, "devel", "debian12")):
        spec = resolve(MATRIX, request)
        lock = LOCKS.lock_for(spec, MATRIX)
        assert lock is not None, f"no lock for {spec.key}"
        if spec.variant != "jupyter":
            assert lock.version_of("torch") == spec.torch.version
            assert lock.version_of("pip") and lock.version_of("setuptools")  # torch.compile imports setuptools
        assert all(p.hashes for p in lock.pins)


def test_every_jupyter_image_of_the_pypi_builds_is_locked_on_every_os() -> None:
    """The default OS (ubuntu22.04, Python 3.10) included: its notebook pins are 3.10's own."""
    jupyter = [s for s in enumerate_matrix(MATRIX) if s.parent is not None]
    pypi = locking.pypi_builds(jupyter)
    assert {s.os.name for s in pypi} == set(MATRIX.oses) and any(s.python == Version("3.10") for s in pypi)
    missing = sorted({lock_name(s) for s in pypi if LOCKS.lock_for(s, MATRIX) is None})
    assert missing == []


def test_every_jupyter_lock_pins_tensorboard_and_the_proxy_that_serves_it() -> None:
    """Issue 32: every jupyter and devel-jupyter lock in locks/ (each OS's Python, each platform)
    installs tensorboard and jupyter-server-proxy at its Python's pins in matrix.yaml; the proxy
    4.1.1 or later (before, its websockets let anyone in without the token: CVE-2024-28179)."""
    covered = set()
    for spec in locking.pypi_builds(s for s in enumerate_matrix(MATRIX) if s.parent is not None):
        pins = dict(r.split("==") for r in MATRIX.tools.notebook_for(spec.python))
        for platform in spec.torch.platforms:
            lock = LOCKS.for_platform(platform).lock_for(spec, MATRIX)
            assert lock is not None, lock_name(spec, (), platform)
            for package in ("tensorboard", "jupyter-server-proxy"):
                assert lock.version_of(package) == Version(pins[package]), (lock.name, package)
            proxy = lock.version_of("jupyter-server-proxy")
            assert proxy is not None and proxy >= Version("4.1.1")
            covered.add(lock.name)
    assert covered == {path.stem for path in (REPO_ROOT / "locks").glob("*-jupyter*.txt")}


def test_the_notebook_pins_follow_the_python_and_a_python_without_them_is_refused() -> None:
    from imagebuilder.matrix.model import NoNotebookPins

    py310, py311 = MATRIX.tools.notebook_for(Version("3.10")), MATRIX.tools.notebook_for(Version("3.11"))
    assert "ipykernel==7.4.0" in py311 and "ipykernel==7.4.0" not in py310  # 7.4.0 declares Requires-Python >=3.11
    assert [r.split("==")[0] for r in py310] == [r.split("==")[0] for r in py311]
    with pytest.raises(NoNotebookPins, match="no jupyter packages for Python 3.9"):
        MATRIX.tools.notebook_for(Version("3.9"))


def test_each_platform_of_a_release_has_its_own_lock_and_builds_from_it() -> None:
    """aarch64 for the releases with aarch64 CUDA wheels (2.11+): resolved for that machine, not x86_64's pins."""
    arm = [s for s in locking.pypi_builds(enumerate_matrix(MATRIX)) if "linux/arm64" in s.torch.platforms]
    assert arm and min(s.torch.version for s in arm) == Version("2.11.0")
    arm_locks = LOCKS.for_platform("linux/arm64")
    for spec in arm:
        lock = arm_locks.lock_for(spec, MATRIX)
        assert lock is not None, f"no aarch64 lock for {lock_name(spec, (), 'linux/arm64')}"
        assert lock.platform == "aarch64-manylinux_2_28" and lock.name.endswith("-aarch64")
        x86 = LOCKS.lock_for(spec, MATRIX)
        assert x86 is not None and x86.platform == "x86_64-manylinux_2_28"
    spec = resolve(MATRIX, Request("2.11", "13.0", None, "runtime", "debian12"))
    arm_image = render(spec, MATRIX, RenderOptions(locks=arm_locks))
    x86_image = render(spec, MATRIX, RenderOptions(locks=LOCKS))
    assert arm_image.lock is not None and arm_image.lock.platform == "aarch64-manylinux_2_28"
    assert arm_image.files["imagebuilder/requirements.lock"] != x86_image.files["imagebuilder/requirements.lock"]
    assert arm_image.inputs_hash != x86_image.inputs_hash


# --------------------------------------------------------------------------- resolving (fake resolver)


def test_jupyter_resolves_under_its_runtime_lock_and_keeps_only_its_additions() -> None:
    runtime = resolve(MATRIX, E2E)
    jupyter = resolve(MATRIX, replace(E2E, variant="jupyter"))
    asked: list[tuple[Any, ...]] = []

    def resolver(request, reqs, constraints):
        asked.append((request.spec.variant, tuple(reqs), constraints.name if constraints else None))
        pins = [pin("torch", "2.6.0"), pin("pip", "26.3")]
        if request.spec.variant == "jupyter":
            pins += [pin("jupyterlab", "4.6.6"), pin("jinja2", "3.1.6")]
        return "\n".join(p.line() for p in pins) + "\n"

    plan = locking.lock_images([jupyter, runtime], MATRIX, resolver=resolver, pin=lambda image: None)
    locks = {lock.name: lock for lock in plan.locks}
    assert sorted(locks) == [E2E_LOCK.replace("runtime", "jupyter"), E2E_LOCK]
    assert asked[0] == ("runtime", ("torch==2.6.0", "torchvision==0.21.0", "torchaudio==2.6.0", "pip", "setuptools"),
                        None)
    assert asked[1] == ("jupyter", MATRIX.tools.notebook_for(Version("3.11")), E2E_LOCK)  # JupyterLab and the notebook packages
    assert [p.name for p in locks[E2E_LOCK.replace("runtime", "jupyter")].pins] == ["jinja2", "jupyterlab"]
    assert plan.unpinned == ("debian:bookworm-slim",)  # one base, asked once


def test_drift_names_each_package_that_moved() -> None:
    old = Lock("x", (), "", "", (pin("numpy", "2.4.5"), pin("torch", "2.6.0", H[0]), pin("gone", "1")))
    new = Lock("x", (), "", "", (pin("numpy", "2.4.6"), pin("torch", "2.6.0", H[1]), pin("new", "2")))
    assert locking.drift(old, new) == ["x.txt: gone 1 dropped", "x.txt: new 2 added", "x.txt: numpy 2.4.5 -> 2.4.6",
                                       "x.txt: torch 2.6.0 files changed on the index"]
    assert locking.drift(None, new) == ["x.txt: no lock (run `imagebuilder lock`)"]


@pytest.mark.parametrize("image, engine, expected", [
    ("mirror.local/cuda:12.4", {"mirror.local/cuda:12.4": ("sha256:id", ("mirror.local/cuda@" + H[0],))},
     BasePin("mirror.local/cuda:12.4", digest=H[0])),
    ("imagebuilder-base:bookworm", {"imagebuilder-base:bookworm": ("sha256:id", ())},
     BasePin("imagebuilder-base:bookworm", image_id="sha256:id")),
    ("debian:bookworm-slim", {}, BasePin("debian:bookworm-slim", digest=H[3])),
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", {}, None),
])
def test_a_base_image_is_pinned_by_registry_digest_else_local_image_id(image, engine, expected) -> None:
    assert pin_base(image, FakeImages(engine), FakeDigests({"debian:bookworm-slim": H[3]})) == expected


# --------------------------------------------------------------------------- the inputs hash (pure)


def _hashes(matrix, locks: LockSet) -> dict[str, str]:
    opts = RenderOptions(locks=locks)
    return {spec.key: render(spec, matrix, opts).inputs_hash for spec in enumerate_matrix(matrix)}


def test_adding_a_release_leaves_every_older_images_inputs_hash_unchanged(tmp_path: Path) -> None:
    """The new release takes `latest` and the `2.x-runtime` aliases from the previous one; those
    images are re-pointed in the registry, never rebuilt, so their hashes must not move."""
    text = MATRIX.text
    newest = MATRIX.newest_torch()
    key = newest.key
    block_start = text.index(f'\n  "{key}":\n')
    block = text[block_start:]
    future = block.replace(f'"{key}":', '"9.9":', 1).replace(f'version: "{newest.version}"', 'version: "9.9.0"', 1)
    bigger = parse_matrix(text + future if block_start + len(block) == len(text) else text, tmp_path / "matrix.yaml")
    assert "9.9" in bigger.torches, "the new release block did not parse"
    before, after = _hashes(MATRIX, LOCKS), _hashes(bigger, LOCKS)
    assert set(before) < set(after)
    assert {k: after[k] for k in before} == before
    # ... although the newest release's tags did change:
    spec = resolve(MATRIX, Request(str(newest.version), str(newest.variant(newest.pypi_variant).cuda)))
    assert "latest" in render(spec, MATRIX).tags and "latest" not in render(resolve(bigger, Request(
        str(newest.version), str(newest.variant(newest.pypi_variant).cuda))), bigger).tags


def test_the_hash_is_the_content_not_the_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = resolve(MATRIX, E2E)
    base = render(spec, MATRIX, RenderOptions(locks=LOCKS))
    renamed = parse_matrix(MATRIX.text, tmp_path / "site.yaml")  # another file name
    assert render(spec, renamed, RenderOptions(locks=LOCKS, source="https://github.com/acme/images")).inputs_hash \
        == base.inputs_hash
    monkeypatch.setattr("imagebuilder.build.render.__version__", "99.0")
    assert render(spec, MATRIX, RenderOptions(locks=LOCKS)).inputs_hash == base.inputs_hash
    # Editing the smoke tests rebuilds nothing: publish lends the current ones at verify time.
    import imagebuilder.resources as r
    files = {**r.carried_files(), "imagebuilder/smoke_tests/new_check.py": b"pass\n"}
    monkeypatch.setattr(r, "carried_files", lambda: files)
    assert render(spec, MATRIX, RenderOptions(locks=LOCKS)).inputs_hash == base.inputs_hash


def test_the_lock_and_the_base_digest_are_inputs() -> None:
    spec = resolve(MATRIX, E2E)
    locked = render(spec, MATRIX, RenderOptions(locks=LOCKS))
    unlocked = render(spec, MATRIX)
    assert locked.inputs_hash != unlocked.inputs_hash
    numpy = next(p for p in LOCKS.locks[E2E_LOCK].pins if p.name == "numpy")
    bumped = replace(LOCKS.locks[E2E_LOCK], pins=tuple(
        replace(p, version=Version("9.9"), hashes=(H[5],)) if p is numpy else p for p in LOCKS.locks[E2E_LOCK].pins))
    assert render(spec, MATRIX, RenderOptions(locks=replace(LOCKS, locks={E2E_LOCK: bumped}))).inputs_hash \
        != locked.inputs_hash
    hashes = []
    for digest in (H[0], H[1]):
        locks = replace(LOCKS, bases={spec.base_image: BasePin(spec.base_image, digest=digest)})
        image = render(spec, MATRIX, RenderOptions(locks=locks))
        assert f"ARG BASE_IMAGE=debian:bookworm-slim@{digest}\n" in image.dockerfile
        assert image.labels["org.opencontainers.image.base.digest"] == digest
        hashes.append(image.inputs_hash)
    assert len({*hashes, locked.inputs_hash}) == 3  # a security fix in the base is a new image
    by_id = replace(LOCKS, bases={spec.base_image: BasePin(spec.base_image, image_id="sha256:" + "9" * 64)})
    image = render(spec, MATRIX, RenderOptions(locks=by_id))
    assert "ARG BASE_IMAGE=debian:bookworm-slim\n" in image.dockerfile and "9" * 64 in image.dockerfile
    assert image.inputs_hash not in hashes


def test_a_locked_build_installs_exactly_the_lock_and_protects_torch() -> None:
    spec = resolve(MATRIX, E2E)
    image = render(spec, MATRIX, RenderOptions(locks=LOCKS))
    text = image.dockerfile
    assert "--require-hashes --no-deps" in text and "-r /opt/imagebuilder/requirements.lock" in text
    assert "torch==2.6.0" not in text and " --seed" not in text  # nothing resolved, nothing seeded
    assert image.files["imagebuilder/requirements.lock"].decode() == LOCKS.locks[E2E_LOCK].text()
    constraints = image.files["imagebuilder/constraints.txt"].decode().splitlines()
    assert "torch==2.6.0" in constraints and "triton==3.2.0" in constraints
    assert any(line.startswith("nvidia-cudnn-cu12==") for line in constraints)
    assert "PIP_CONSTRAINT=/opt/imagebuilder/constraints.txt" in text and "UV_CONSTRAINT=" in text
    assert "RUN /opt/venv/bin/python /opt/imagebuilder/sbom.py" in text
    jupyter = render(resolve(MATRIX, replace(E2E, variant="jupyter")), MATRIX, RenderOptions(locks=LOCKS))
    assert "-r /opt/imagebuilder/jupyter.lock" in jupyter.dockerfile and "pip freeze" not in jupyter.dockerfile


# --------------------------------------------------------------------------- the sbom module (pure)


def test_the_sbom_lists_venv_distributions_with_the_locks_hashes_and_dpkg_packages(tmp_path: Path) -> None:
    from imagebuilder.trust import sbom

    site = tmp_path / "venv/lib/python3.11/site-packages"
    for name, version in (("torch", "2.6.0"), ("Typing_Extensions", "4.16.0")):
        (site / f"{name}-{version}.dist-info").mkdir(parents=True)
        (site / f"{name}-{version}.dist-info/METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lock = tmp_path / "requirements.lock"
    lock.write_text(Lock("x", (), "", "", (pin("torch", "2.6.0", H[0], H[1]),)).text())
    status = tmp_path / "status"
    status.write_text("Package: libc6\nStatus: install ok installed\nVersion: 2.36-9+deb12u9\nArchitecture: amd64\n\n"
                      "Package: removed\nStatus: deinstall ok config-files\nVersion: 1\n")
    python = sbom.python_components(tmp_path / "venv", sbom.locked_hashes((str(lock),)))
    torch = next(c for c in python if c["name"] == "torch")
    assert torch["version"] == "2.6.0" and torch["purl"] == "pkg:pypi/torch@2.6.0"
    assert [h["content"] for h in torch["hashes"]] == ["a" * 64, "b" * 64]
    assert next(c for c in python if c["name"] == "typing-extensions")["properties"][0]["value"] == "false"
    debs = sbom.deb_components(str(status), {"ID": "debian", "VERSION_ID": "12"})
    assert [c["purl"] for c in debs] == ["pkg:deb/debian/libc6@2.36-9%2Bdeb12u9?arch=amd64&distro=debian-12"]


# --------------------------------------------------------------------------- the real index


def _copy_matrix(tmp_path: Path) -> Path:
    shutil.copy(REPO_ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(REPO_ROOT / "locks", tmp_path / "locks")
    return tmp_path / "matrix.yaml"


def _uv() -> str:
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists() and shutil.which("uv") is None:
        from support.unavailable import _unavailable

        _unavailable("uv is not installed (pip install uv==<matrix.yaml tools.uv>)")
    return str(uv) if uv.exists() else "uv"


# The index as the committed locks saw it (support.frozen_index): every locked project's files up
# to its pin, nothing newer, whatever the index publishes tomorrow. So these checks prove that the
# locks are what `lock` makes of that index (no false drift) and that --check names a drift, and
# neither fails on the day a dependency releases (decorator 5.3.2 did, 2026-12-05). uv is given
# that index alone (--index-url), so it resolves nothing around it. The live drift check is the
# nightly's `lock --check` (.github/workflows).
def _frozen_at(*names: str) -> Any:
    caps: dict[str, Version] = {}
    for name in names:
        for p in LOCKS.locks[name].pins:
            caps[p.name] = max(caps.get(p.name, p.version), p.version)
    return frozen_index(default_index_url(), caps)


@pytest.mark.network
def test_lock_check_passes_on_the_committed_lock_and_names_what_drifted(tmp_path: Path) -> None:
    _uv()
    matrix = _copy_matrix(tmp_path)
    with _frozen_at(E2E_LOCK) as index:
        args = ["--matrix", str(matrix), "lock", "--torch", "2.6", "--cuda", "12.1", "--os", "debian12", "--variant",
                "runtime", "--index-url", index, "--check"]
        done = imagebuilder(*args, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"[1/1] {E2E_LOCK}: ok" in done.stderr  # a line per set, with its result
        path = tmp_path / "locks" / f"{E2E_LOCK}.txt"
        lock = parse_lock(E2E_LOCK, path.read_text())
        older = replace(lock, pins=tuple(replace(p, version=Version("1.26.0")) if p.name == "numpy" else p
                                         for p in lock.pins))
        path.write_text(older.text())
        done = imagebuilder(*args, timeout=300)
    assert done.returncode == 1
    numpy = lock.version_of("numpy")
    assert f"drift: {E2E_LOCK}.txt: numpy 1.26.0 -> {numpy}" in done.stdout
    assert f"[1/1] {E2E_LOCK}: 1 drifted" in done.stderr
    assert path.read_text() == older.text()  # --check writes nothing


JUPYTER_2_14 = [f"torch2.14.1-cu130-py3.10-{variant}{platform}" for variant in ("runtime", "devel", "jupyter",
                                                                              "devel-jupyter")
                for platform in ("", "-aarch64")]


@pytest.mark.network
def test_lock_check_of_the_default_os_jupyter_images_is_green(tmp_path: Path) -> None:
    """ubuntu22.04's Python 3.10: the jupyter and devel-jupyter sets of a PyPI build lock and match."""
    _uv()
    matrix = _copy_matrix(tmp_path)
    with _frozen_at(*JUPYTER_2_14) as index:
        done = imagebuilder("--matrix", str(matrix), "lock", "--torch", "2.14", "--os", "ubuntu22.04", "--python",
                            "3.10", "--index-url", index, "--check", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("torch2.14.1-cu130-py3.10-jupyter", "torch2.14.1-cu130-py3.10-devel-jupyter"):
        for platform in ("", "-aarch64"):
            assert f"{name}{platform}: ok" in done.stderr, done.stderr
    assert "8 locks match the index" in done.stdout


def test_the_frozen_index_hides_only_what_is_newer_than_a_pin() -> None:
    """The test index itself: a locked project's newer files go, its older and other files stay."""
    page = {"meta": {"api-version": "1.1"}, "name": "decorator", "versions": ["5.3.1", "5.3.2"], "files": [
        {"filename": "decorator-5.3.1-py3-none-any.whl", "url": "../../f/decorator-5.3.1-py3-none-any.whl"},
        {"filename": "decorator-5.3.2-py3-none-any.whl", "url": "https://files.example/decorator-5.3.2.whl"},
        {"filename": "decorator-5.3.2.tar.gz", "url": "decorator-5.3.2.tar.gz"}]}
    out = frozen_json(page, Version("5.3.1"), "https://index.example/simple/decorator/")
    assert [f["filename"] for f in out["files"]] == ["decorator-5.3.1-py3-none-any.whl"]
    assert out["files"][0]["url"] == "https://index.example/f/decorator-5.3.1-py3-none-any.whl"
    assert "versions" not in out
    assert len(frozen_json(page, None, "https://index.example/simple/decorator/")["files"]) == 3
    html = ('<html><a href="../../f/decorator-5.3.1.tar.gz#sha256=ab" data-requires-python="&gt;=3.8">'
            'decorator-5.3.1.tar.gz</a><br/><a href="x/decorator-5.3.2.tar.gz">decorator-5.3.2.tar.gz</a></html>')
    kept = frozen_html(html, Version("5.3.1"), "https://index.example/simple/decorator/")
    assert "decorator-5.3.2" not in kept
    assert 'href="https://index.example/f/decorator-5.3.1.tar.gz#sha256=ab"' in kept
    assert 'data-requires-python="&gt;=3.8"' in kept


def test_sigterm_stops_lock_as_ctrl_c_does_and_leaves_no_temporary_folder(tmp_path: Path) -> None:
    """A real SIGTERM (what a CI timeout sends) to a real `imagebuilder lock` while uv resolves:
    the uv it started and its imagebuilder-lock-* folder are gone, and it says so."""
    import signal
    import subprocess
    import time

    slow_uv = tmp_path / "uv"  # stands in for uv on a slow index: holds the run mid-resolution
    started = tmp_path / "started"
    slow_uv.write_text(f"#!/bin/sh\necho $$ > {started}\nexec sleep 60\n")
    slow_uv.chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "imagebuilder", "lock", "--torch", "2.6", "--cuda", "12.1", "--os", "debian12",
         "--variant", "jupyter", "--uv", str(slow_uv)],
        env={**os.environ, "TMPDIR": str(tmp), "DOCKER_HOST": "unix:///nonexistent"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    assert started.exists(), process.communicate()
    assert [p.name for p in tmp.iterdir() if p.name.startswith("imagebuilder-lock-")]  # the folder it must remove
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 130 and "interrupted" in err, out + err
    assert list(tmp.iterdir()) == []
    uv_pid = int(started.read_text())
    assert not Path(f"/proc/{uv_pid}").exists() or "zombie" in Path(f"/proc/{uv_pid}/status").read_text().lower()


@pytest.mark.network
def test_with_adds_a_package_under_the_torch_pins_and_refuses_one_wanting_another_torch(tmp_path: Path) -> None:
    _uv()
    matrix = _copy_matrix(tmp_path)
    base = ["--matrix", str(matrix), "lock", "--torch", "2.6", "--cuda", "12.1", "--os", "debian12",
            "--variant", "runtime"]
    done = imagebuilder(*base, "--with", "tqdm==4.67.1", timeout=300)
    assert done.returncode == 0, done.stderr
    extras = parse_extras(["tqdm==4.67.1"])
    name = lock_name(resolve(MATRIX, E2E), extras)
    lock = parse_lock(name, (tmp_path / "locks" / f"{name}.txt").read_text())
    assert lock.version_of("tqdm") == Version("4.67.1") and lock.version_of("torch") == Version("2.6.0")
    # and the build takes that lock when asked for the same --with:
    dockerfile = imagebuilder("--matrix", str(matrix), "render", "--torch", "2.6", "--cuda", "12.1", "--os",
                              "debian12", "--with", "tqdm==4.67.1", "--dry-run").stdout
    assert "--require-hashes" in dockerfile and "no lock" not in dockerfile
    done = imagebuilder(*base, "--with", "xformers==0.0.29.post1", timeout=300)  # requires torch==2.5.1
    assert done.returncode == 2  # uv proves the request unsatisfiable: a bad request (docs/exit-codes.md)
    assert "cannot lock" in done.stderr and "torch==2.5.1" in done.stderr


# --------------------------------------------------------------------------- inside the real image


def _run(docker_engine, image: str, *command: str, **kw) -> tuple[int, str]:
    result = docker_engine.run(image, list(command), timeout=600, **kw)
    assert not result.timed_out, result.output[-2000:]
    return result.exit_code, result.output


@pytest.mark.docker
@pytest.mark.slow
def test_pip_freeze_in_the_image_is_the_lock(docker_engine, runtime_image) -> None:
    code, out = _run(docker_engine, runtime_image["tags"][0], "python", "-m", "pip", "freeze", "--all")
    assert code == 0, out
    installed = {}
    for line in out.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            installed[canonicalize_name(name)] = version
    locked = {p.name: str(p.version) for p in LOCKS.locks[E2E_LOCK].pins}
    assert installed == locked


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.network
def test_pip_cannot_replace_the_images_torch(docker_engine, runtime_image) -> None:
    """The constraint file turns a torch downgrade, or a package that wants another torch,
    into the resolver's conflict; torch stays the image's."""
    ref = runtime_image["tags"][0]
    ca = os.environ.get("SSL_CERT_FILE")
    kw = {}
    if ca and Path(ca).is_file():  # behind a TLS-intercepting proxy pip needs its CA
        kw = {"volumes": {ca: "/tmp/ca.pem"}, "environment": {"PIP_CERT": "/tmp/ca.pem"}}
    script = ("pip install --no-cache-dir torch==2.5.1; echo rc=$?; "
              "pip install --no-cache-dir xformers==0.0.29.post1; echo rc=$?; "
              "python -c 'import torch; print(\"torch\", torch.__version__)'")
    code, out = _run(docker_engine, ref, "bash", "-c", script, **kw)
    assert code == 0, out
    assert out.count("rc=1") == 2, out
    assert "conflict" in out.lower() or "ResolutionImpossible" in out, out
    assert "torch 2.6.0" in out.splitlines()[-1]


@pytest.mark.docker
@pytest.mark.slow
def test_the_sbom_lists_torch_with_its_version_and_hash(docker_engine, runtime_image) -> None:
    ref = runtime_image["tags"][0]
    code, out = _run(docker_engine, ref, "cat", "/opt/imagebuilder/sbom.cdx.json")
    assert code == 0, out
    document = json.loads(out)
    assert document["bomFormat"] == "CycloneDX" and document["specVersion"] == "1.5"
    torch = next(c for c in document["components"] if c["purl"] == "pkg:pypi/torch@2.6.0")
    locked = next(p for p in LOCKS.locks[E2E_LOCK].pins if p.name == "torch")
    assert {f"sha256:{h['content']}" for h in torch["hashes"]} == set(locked.hashes)
    assert any(c["purl"].startswith("pkg:deb/debian/libc6@") for c in document["components"])
    labels = docker_engine.image_labels(ref)
    assert labels["io.imagebuilder.sbom.digest"] == "sha256:" + hashlib.sha256(out.encode()).hexdigest()


@pytest.mark.docker
def test_a_base_pinned_by_image_id_is_checked_before_the_build(docker_engine, base_image, tmp_path) -> None:
    """A local base without a registry digest: FROM keeps the tag, the build checks the id."""
    from imagebuilder.build.run import BaseImageChanged, build_image, check_base
    from imagebuilder.engine.classic import ClassicBuilder

    image_id, _ = docker_engine.image_identity(base_image)
    spec = resolve(MATRIX, replace(E2E, base_image=base_image))
    locks = replace(LOCKS, bases={base_image: BasePin(base_image, image_id=image_id)})
    image = render(spec, MATRIX, RenderOptions(locks=locks))
    assert f"ARG BASE_IMAGE={base_image}\n" in image.dockerfile and image_id in image.dockerfile
    check_base(docker_engine, image)  # the tag still names the locked image: no error
    moved = render(spec, MATRIX, RenderOptions(locks=replace(locks, bases={
        base_image: BasePin(base_image, image_id="sha256:" + "0" * 64)})))
    with pytest.raises(BaseImageChanged, match=f"base image {base_image} is {image_id}"):
        build_image(docker_engine, moved, builder=ClassicBuilder(docker_engine), matrix_path=REPO_ROOT / "matrix.yaml",
                    logs=tmp_path)


def test_a_matrix_level_extras_list_goes_into_every_images_lock(tmp_path: Path) -> None:
    site = parse_matrix(MATRIX.text + "\nextras: ['transformers==4.57.1', 'tqdm']\n", tmp_path / "site.yaml")
    spec = resolve(site, E2E)
    image = render(spec, site, RenderOptions(extras=("pandas==2.2.3",)))
    extras = parse_extras(["transformers==4.57.1", "tqdm", "pandas==2.2.3"])
    assert image.lock is None and "no lock for this image" in image.notices[-2]
    assert all(f"        {e} \\" in image.dockerfile or f"        {e}\n" in image.dockerfile for e in extras)
    assert lock_name(spec, extras) != E2E_LOCK  # a site's lock never shadows the default one
    with pytest.raises(Exception, match="extras is a list of requirements"):
        parse_matrix(MATRIX.text + "\nextras: transformers\n", tmp_path / "bad.yaml")


def test_an_image_built_with_extras_has_tags_of_its_own_and_a_matrix_level_list_does_not(tmp_path: Path) -> None:
    """Round five: `build --with 'pandas==2.2.3'` replaced the plain image's tags locally, and
    `publish --with` would have moved the published plain tags to the pandas image."""
    jupyter = replace(E2E, variant="jupyter")
    plain = render(resolve(MATRIX, jupyter), MATRIX)
    pandas = render(resolve(MATRIX, jupyter), MATRIX, RenderOptions(extras=("pandas==2.2.3",)))
    same = render(resolve(MATRIX, jupyter), MATRIX, RenderOptions(extras=("pandas == 2.2.3", "pandas==2.2.3")))
    suffix = "-" + with_suffix(parse_extras(["pandas==2.2.3"]))
    assert plain.tags and not set(plain.tags) & set(pandas.tags)
    assert pandas.tags == tuple(tag + suffix for tag in plain.tags) == same.tags
    # A jupyter image is built FROM its parent built with the same --with, not the plain one.
    assert f"pytorch:2.6.0-cuda12.1-cudnn9-debian12-runtime{suffix}\n" in pandas.dockerfile
    # A site's extras make its plain images: no suffix; a --with that repeats one adds nothing.
    site = parse_matrix(MATRIX.text + "\nextras: ['tqdm']\n", tmp_path / "site.yaml")
    assert render(resolve(site, E2E), site, RenderOptions(extras=("tqdm",))).tags == render(
        resolve(MATRIX, E2E), MATRIX).tags
    # publish joins the platforms' images under the same tags: those of the --with image.
    per_platform, index_platforms = publish_images(MATRIX, Selection(torch="2.6", cuda="12.1", os="debian12"),
                                                   RenderOptions(extras=("pandas==2.2.3",)), ["linux/amd64"],
                                                   multi=False, read_os_release=None, merge_only=False,
                                                   note=lambda text: None)
    assert index_platforms and all(ref.endswith(suffix) for ref in index_platforms)
    # and the command says so before it builds anything.
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.1", "--os", "debian12", "--with", "pandas==2.2.3",
                        "--dry-run", timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"would build pytorch:2.6.0-cuda12.1-cudnn9-debian12-runtime{suffix} " in done.stderr + done.stdout


class RecordingEngine:
    """The engine (and builder) calls build_image makes, answered from canned values."""

    kind: Literal["classic"] = "classic"

    def describe(self) -> str:
        return "a recording builder"

    def __init__(self, sbom: bytes | None) -> None:
        self.sbom = sbom
        self.builds: list[tuple[tuple[str, ...], str]] = []
        self.removed: list[tuple[str, bool]] = []

    def image_exists(self, ref: str) -> bool:
        return False

    def image_labels(self, ref: str) -> dict[str, str]:
        raise AssertionError("asked only when the image exists")

    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        return None

    def build(self, req, on_progress=None):
        from imagebuilder.engine.api import BuildResult

        self.builds.append((req.tags, (req.context / "Dockerfile").read_text()))
        return BuildResult(f"sha256:{len(self.builds)}", req.tags, 1, 1.0, 2, 0, 2, None)

    def read_file(self, image, path, *, platform=None):
        assert (image, path) == ("sha256:1", "/opt/imagebuilder/sbom.cdx.json")
        return self.sbom

    def remove_image(self, ref, force=True):
        self.removed.append((ref, force))

    def tag_image(self, source: str, ref: str) -> None:
        raise AssertionError(f"no build here moves a tag back ({ref})")


def test_the_build_labels_the_image_with_its_sboms_digest_and_only_that_image_takes_the_tags(tmp_path) -> None:
    from imagebuilder.build.run import SbomMissing, build_image
    from imagebuilder.trust.labels import SBOM_DIGEST

    image = render(resolve(MATRIX, E2E), MATRIX, RenderOptions(locks=LOCKS))
    engine = RecordingEngine(b'{"bomFormat": "CycloneDX"}\n')
    built = build_image(engine, image, builder=engine, matrix_path=REPO_ROOT / "matrix.yaml", logs=tmp_path)
    (first_tags, _), (tags, dockerfile) = engine.builds
    (unlabelled,) = first_tags
    # This run's own name (two builds of one tag at once share none): the pid and a random part.
    assert re.fullmatch(rf"{re.escape(image.ref)}-unlabelled-{os.getpid()}-[0-9a-f]{{8}}", unlabelled), unlabelled
    assert tags == image.refs
    digest = hashlib.sha256(b'{"bomFormat": "CycloneDX"}\n').hexdigest()
    assert dockerfile == f'FROM {unlabelled}\nLABEL {SBOM_DIGEST}="sha256:{digest}"\n'
    assert built.result.image_id == "sha256:2" and engine.removed == [(unlabelled, False)]
    with pytest.raises(SbomMissing, match="has no /opt/imagebuilder/sbom.cdx.json"):
        build_image(RecordingEngine(None), image, builder=RecordingEngine(None), matrix_path=REPO_ROOT / "matrix.yaml", logs=tmp_path)


class LostRecordEngine(RecordingEngine):
    """The labelled build names the image under its first two tags, then fails as BuildKit does
    when another job's prune removed its records (after the retry): the tags it moved must go."""

    def __init__(self, named: dict[str, str]) -> None:
        super().__init__(b"{}")
        self.named = dict(named)

    def image_identity(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        return (self.named[ref], ()) if ref in self.named else None

    def build(self, req, on_progress=None):
        from imagebuilder.engine.api import BuildResult
        from imagebuilder.engine.errors import BuildFailed

        self.builds.append((req.tags, ""))
        if len(self.builds) == 1:
            return BuildResult("sha256:1", req.tags, 1, 1.0, 2, 0, 2, None)
        self.named.update({tag: "sha256:new" for tag in req.tags[:2]})
        raise BuildFailed(step=None, total=2, instruction=None, error="not found", tail=(), log_path=None,
                          cause="lost-record")

    def remove_image(self, ref, force=True):
        self.removed.append((ref, force))
        self.named.pop(ref, None)

    def tag_image(self, source: str, ref: str) -> None:
        self.named[ref] = source


def test_a_build_that_failed_after_tagging_leaves_no_tag_on_what_it_made(tmp_path) -> None:
    """Round five: "the build failed: not found" left the image's local tags on the failed build's image."""
    from imagebuilder.build.run import build_image
    from imagebuilder.engine.errors import BuildFailed

    image = render(resolve(MATRIX, Request("2.6", "12.4", None, "runtime", None)), MATRIX, RenderOptions(locks=LOCKS))
    first, second, third, *_ = image.refs  # the default OS and Python: short aliases too
    engine = LostRecordEngine({first: "sha256:old", third: "sha256:old"})
    with pytest.raises(BuildFailed, match="not found"):
        build_image(engine, image, builder=engine, matrix_path=REPO_ROOT / "matrix.yaml", logs=tmp_path)
    # The tags it moved name what they named before, or nothing; the one it did not move stays;
    # the image it made goes.
    assert engine.named == {first: "sha256:old", third: "sha256:old"}
    assert [ref for ref, _ in engine.removed if ref in image.refs] == [second]
    assert ("sha256:new", False) in engine.removed


class InterruptedEngine(RecordingEngine):
    """Ctrl-C while the first build exports: the daemon has named the unlabelled image."""

    def __init__(self) -> None:
        super().__init__(None)
        self.named: set[str] = set()

    def build(self, req, on_progress=None):
        RecordingEngine.build(self, req, on_progress)  # type: ignore[no-untyped-call]
        self.named.update(req.tags)
        raise KeyboardInterrupt

    def remove_image(self, ref, force=True):
        super().remove_image(ref, force)  # type: ignore[no-untyped-call]
        self.named.discard(ref)


def test_ctrl_c_while_the_image_is_exported_removes_the_unlabelled_image(tmp_path, monkeypatch) -> None:
    """Issue 45: the clean-up ran on a failed build only, and Ctrl-C left a 2.7 GB image."""
    import tempfile

    from imagebuilder.build.run import build_image

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    image = render(resolve(MATRIX, E2E), MATRIX, RenderOptions(locks=LOCKS))
    engine = InterruptedEngine()
    with pytest.raises(KeyboardInterrupt):
        build_image(engine, image, builder=engine, matrix_path=REPO_ROOT / "matrix.yaml", logs=tmp_path)
    ((tags, _),) = engine.builds
    assert engine.named == set() and engine.removed == [(tags[0], False)]
    assert list(temp.iterdir()) == []  # the build's context and secrets went too


def test_two_builds_of_one_tag_name_different_intermediate_images(tmp_path) -> None:
    """Issue 45: two builds of one tag at once exported to one `-unlabelled` name: the second
    failed with "already exists" and its clean-up removed the first one's image."""
    from imagebuilder.build.run import build_image

    image = render(resolve(MATRIX, E2E), MATRIX, RenderOptions(locks=LOCKS))
    first, second = RecordingEngine(b"{}"), RecordingEngine(b"{}")
    for engine in (first, second):
        build_image(engine, image, builder=engine, matrix_path=REPO_ROOT / "matrix.yaml", logs=tmp_path)
    assert first.builds[0][0] != second.builds[0][0]
    # Each run removes its own intermediate image, never the other's.
    assert first.removed == [(first.builds[0][0][0], False)] and second.removed == [(second.builds[0][0][0], False)]


class LoggingEngine(RecordingEngine):
    """Its first build's log holds the SBOM step's output, as a BuildKit build that ran it does."""

    def __init__(self, log: str) -> None:
        super().__init__(None)
        self.log = log

    def build(self, req, on_progress=None):
        result = RecordingEngine.build(self, req, on_progress)  # type: ignore[no-untyped-call]
        if len(self.builds) > 1:
            return result
        req.log_path.write_text(self.log)
        return replace(result, log_path=req.log_path)

    def read_file(self, image, path, *, platform=None):
        raise AssertionError("the digest is in the build's log: the image is not read back")


def test_the_sboms_digest_comes_from_the_step_that_wrote_it_without_reading_the_image_back(tmp_path) -> None:
    """A foreign platform's image is not unpacked in the store after its build: reading the
    SBOM back would unpack GBs first. sbom.py prints the digest of what it wrote; the label is
    that (and where the step was cached, the image is read, as the test above shows)."""
    from imagebuilder.build.run import build_image
    from imagebuilder.trust.labels import SBOM_DIGEST
    from imagebuilder.trust.sbom import DIGEST_LINE

    image = render(resolve(MATRIX, E2E), MATRIX, RenderOptions(locks=LOCKS))
    digest = "sha256:" + "ab" * 32
    log = ("#26 [stage-1 15/16] RUN /opt/venv/bin/python /opt/imagebuilder/sbom.py /opt/venv /opt/x\n"
           f"#26 0.912 {DIGEST_LINE} {digest}\n#26 DONE 0.9s\n")
    engine = LoggingEngine(log)
    build_image(engine, image, builder=engine, matrix_path=REPO_ROOT / "matrix.yaml", logs=tmp_path)
    assert engine.builds[1][1] == f'FROM {engine.builds[0][0][0]}\nLABEL {SBOM_DIGEST}="{digest}"\n'


def test_sbom_py_prints_the_digest_of_the_file_it_wrote(tmp_path) -> None:
    from imagebuilder.trust.sbom import DIGEST_LINE

    venv = tmp_path / "venv"
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    out = tmp_path / "sbom.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "imagebuilder" / "trust" / "sbom.py"), str(venv), str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{DIGEST_LINE} sha256:{hashlib.sha256(out.read_bytes()).hexdigest()}\n"


# uv's answer when the index has no torch at all (a mirror without PyTorch's wheels).
NO_TORCH = "No solution found when resolving dependencies: Because torch was not found in the package registry"


@pytest.mark.parametrize(("extras", "error", "code", "says", "never"), [
    ((), locking.LocksFailed, 1, "the index offers nothing that satisfies them", "--with"),
    (("pandas==0.1",), locking.LocksUnsatisfiable, 2, "drop or change the --with that conflicts", "the other"),
])
def test_an_unsatisfiable_lock_blames_a_with_only_when_one_was_given(tmp_path: Path, extras: tuple[str, ...],
                                                                     error: type[Exception], code: int, says: str,
                                                                     never: str) -> None:
    failed = ResolutionFailed(name="torch2.6.0-cu124-py3.11-runtime", requirements="torch==2.6.0", detail=NO_TORCH)
    plan = locking.LockPlan((), {}, (), (failed,), extras)
    with pytest.raises(error) as caught:
        locking.check_or_write(plan, tmp_path, check_only=False, echo=print, note=print, err=print)
    message = str(caught.value)
    assert caught.value.exit_code == code and says in message and never not in message  # type: ignore[attr-defined]
    assert "the others are" not in message  # there are none
    assert list(tmp_path.iterdir()) == []
