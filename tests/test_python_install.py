"""Where the image's Python comes from: the OS's own python3 where it packages that Python,
else `uv python install` from GitHub or from --python-mirror; and what a failed download says."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner

from support.real_images import TEST_REPOSITORY_PREFIX, ca_bundle_args, imagebuilder
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.build.run import python_download_hint
from imagebuilder.cli import cli
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve
from imagebuilder.resources import default_matrix_path

M = load_matrix(default_matrix_path())
MIRROR = "https://python-mirror.example/pbs"

# Each OS's own python3 (matrix.yaml's os.python): asked for, or the default, it is the OS's.
OS_PYTHONS = [("debian13", "3.13"), ("ubuntu24.04", "3.12"), ("ubuntu22.04", "3.10"), ("debian12", "3.11")]


@pytest.mark.parametrize(("os_name", "python"), OS_PYTHONS)
@pytest.mark.parametrize("asked", [True, False], ids=["--python", "default"])
def test_the_os_python_is_used_where_the_os_packages_it(os_name, python, asked):
    spec = resolve(M, Request("2.6", "12.4", python=python if asked else None, os=os_name))
    assert spec.python_from_os and str(spec.python) == python
    text = render(spec, M, RenderOptions(python_mirror=MIRROR)).dockerfile
    assert f"--python /usr/bin/python{python} /opt/venv" in text
    assert "uv python install" not in text and "UV_PYTHON_INSTALL_MIRROR" not in text


def test_a_python_the_os_lacks_is_downloaded_from_the_mirror():
    spec = resolve(M, Request("2.6", "12.4", python="3.12", os="debian12"))
    assert not spec.python_from_os
    assert "--python-mirror" in " ".join(spec.notices)
    plain = render(spec, M).dockerfile
    mirrored = render(spec, M, RenderOptions(python_mirror=MIRROR)).dockerfile
    assert "/tmp/uv/bin/uv python install 3.12" in plain and "UV_PYTHON_INSTALL_MIRROR" not in plain
    assert f"UV_PYTHON_INSTALL_MIRROR={MIRROR} /tmp/uv/bin/uv python install 3.12" in mirrored


@pytest.mark.parametrize("how", ["option", "env"])
def test_render_takes_the_mirror_from_the_option_or_the_environment(how):
    args = ["render", "--torch", "2.6", "--cuda", "12.4", "--os", "debian12", "--python", "3.12", "--dry-run"]
    env = {"IMAGEBUILDER_PYTHON_MIRROR": MIRROR + "/"} if how == "env" else {}
    result = CliRunner().invoke(cli, args + (["--python-mirror", MIRROR + "/"] if how == "option" else []), env=env)
    assert result.exit_code == 0, result.output
    assert f"UV_PYTHON_INSTALL_MIRROR={MIRROR} /tmp/uv/bin/uv python install 3.12" in result.stdout


def test_a_mirror_that_is_no_url_is_a_bad_flag():
    result = CliRunner().invoke(cli, ["render", "--torch", "2.6", "--cuda", "12.4", "--dry-run",
                                      "--python-mirror", "mirror.example/pbs"])
    assert result.exit_code == 2 and "--python-mirror" in result.output and "Traceback" not in result.output


# uv 0.13's own words when `uv python install` cannot download (seen here: GitHub unreachable,
# and a mirror on a port nothing listens on).
GITHUB_UNREACHABLE = [
    "error: Failed to install cpython-3.12.7-linux-x86_64-gnu",
    "  cause: Request failed after 3 retries in 8.1s",
    "  cause: Failed to download `https://github.com/astral-sh/python-build-standalone/releases/download/"
    "20241016/cpython-3.12.7%2B20241016-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz`",
    "  cause: dns error",
]
MIRROR_REFUSED = [
    "error: Failed to install cpython-3.12.7-linux-x86_64-gnu",
    "  cause: Failed to download `http://127.0.0.1:9/20241016/cpython-3.12.7%2B20241016-x86_64-unknown-linux-gnu"
    "-install_only_stripped.tar.gz`",
    "  cause: Connection refused (os error 111)",
]


@pytest.mark.parametrize(("tail", "host"), [(GITHUB_UNREACHABLE, "github.com"), (MIRROR_REFUSED, "127.0.0.1:9")])
def test_a_failed_python_download_names_the_mirror_option(tail, host):
    image = render(resolve(M, Request("2.6", "12.4", python="3.12", os="debian12")), M)
    hint = python_download_hint(tail, image)
    assert hint is not None
    assert f"could not download CPython from {host}" in hint
    assert "--python-mirror URL" in hint and "IMAGEBUILDER_PYTHON_MIRROR" in hint
    assert "--python 3.11" in hint  # debian12's own, which torch 2.6 ships wheels for


def test_other_failures_get_no_python_hint():
    image = render(resolve(M, Request("2.6", "12.4", python="3.12", os="debian12")), M)
    assert python_download_hint(["error: Failed to fetch: `http://127.0.0.1:9/simple/torch/`"], image) is None


# --- real builds --------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.beside_builds  # the classic builder, failing at the interpreter download (FAILING_EARLY)
def test_a_refusing_python_mirror_fails_the_build_with_one_line_naming_it(docker_engine, base_image, free_port):
    """The interpreter download fails for real (a mirror on a loopback port nothing listens
    on, inside the build); the error line names the host and --python-mirror."""
    repository = f"{TEST_REPOSITORY_PREFIX}/pymirror-{uuid.uuid4().hex[:8]}"
    mirror = f"http://127.0.0.1:{free_port}"
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.1", "--os", "debian12", "--python", "3.12",
                        "--base-image", base_image, "--repository", repository, "--python-mirror", mirror,
                        *ca_bundle_args(), timeout=1200)
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert f"could not download CPython from 127.0.0.1:{free_port}" in errors[0]
    assert "--python-mirror URL" in errors[0] and "--python 3.11" in errors[0]
    assert "--index-url" not in errors[0]  # the package index was not the problem
    assert "Traceback" not in done.stderr
    assert not docker_engine.image_exists(f"{repository}:2.6.0-cuda12.1-cudnn9-py3.12-debian12-runtime")


TRIXIE_BASE = "imagebuilder-base:trixie"  # .ci/base-image.sh imagebuilder-base:trixie trixie


@pytest.mark.docker
@pytest.mark.slow
def test_a_debian13_image_runs_on_the_os_python(docker_engine, tmp_path):
    """Debian 13 packages Python 3.13, which torch 2.6 ships wheels for: the venv is made from
    /usr/bin/python3.13, nothing is downloaded besides the wheels (no /opt/python)."""
    if not docker_engine.image_exists(TRIXIE_BASE):
        from support.unavailable import _unavailable

        _unavailable(f"{TRIXIE_BASE} does not exist; create it with .ci/base-image.sh {TRIXIE_BASE} trixie")
    repository = f"{TEST_REPOSITORY_PREFIX}/trixie-{uuid.uuid4().hex[:8]}"
    report = tmp_path / "report.json"
    # No --os and no --python: debian13 is read from the base image, and 3.13 is its own.
    # BuildKit, its own parent (Debian 13's apt layer): every wheel of its lock comes down
    # (.ci/setup --tests makes the base).
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.4", "--base-image", TRIXIE_BASE, "--builder", "buildkit",
                        "--repository", repository, "--report", str(report),
                        "--python-mirror", "http://127.0.0.1:9", *ca_bundle_args())
    assert done.returncode == 0, done.stderr[-4000:]
    tags = json.loads(report.read_text())["images"][0]["tags"]
    try:
        result = docker_engine.run(tags[0], ["bash", "-c", "readlink -f /opt/venv/bin/python; "
                                             "test -e /opt/python && echo downloaded || echo none; "
                                             "/opt/venv/bin/python -c 'import sys, torch; "
                                             "print(sys.version_info[:2], torch.__version__)'"], timeout=300)
        assert result.exit_code == 0, result.output
        assert result.output.split() [:2] == ["/usr/bin/python3.13", "none"], result.output
        assert "(3, 13) 2.6.0" in result.output
    finally:
        for ref in tags:
            docker_engine.remove_image(ref)
