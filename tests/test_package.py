"""The wheel ships templates/, matrix.yaml and smoke_tests/, and works from a fresh venv."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_installs_and_renders_in_a_fresh_venv(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("imagebuilder-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "imagebuilder/_data/matrix.yaml" in names
    assert "imagebuilder/_data/templates/Dockerfile.j2" in names
    assert "imagebuilder/_data/templates/jupyter.Dockerfile.j2" in names
    assert "smoke_tests/__main__.py" in names
    assert "imagebuilder/_data/locks/torch2.6.0-cu124-py3.10-runtime.txt" in names
    assert "imagebuilder/trust/sbom.py" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], check=True,
                   capture_output=True, timeout=600)
    # From an unrelated folder, so nothing of the source checkout can be picked up.
    done = subprocess.run([str(venv / "bin" / "imagebuilder"), "render", "--torch", "2.6", "--cuda", "12.1",
                           "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--require-hashes" in done.stdout  # the packaged lock is found beside the packaged matrix
    assert "note: torch 2.6.0 has no CUDA 12.1 wheels" in done.stderr
    assert "_data/matrix.yaml" in subprocess.run(
        [str(venv / "bin" / "python"), "-c", "from imagebuilder.resources import default_matrix_path as p; print(p())"],
        cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    done = subprocess.run([str(venv / "bin" / "imagebuilder"), "render", "--all", "-o", str(tmp_path / "all")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    context = next((tmp_path / "all").glob("2.6.0-cuda12.4-*-runtime"))
    assert (context / "imagebuilder" / "smoke_tests" / "__main__.py").is_file()
