"""Where the packaged data lives: templates/, matrix.yaml and smoke_tests/; the files every image carries.

In a wheel they sit inside the package (imagebuilder/_data/...); in a source checkout
(editable install, tests) they sit at the repository root.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data_root() -> Path:
    packaged = _PACKAGE / "_data"
    return packaged if (packaged / "matrix.yaml").is_file() else _PACKAGE.parent


def templates_dir() -> Path:
    return _data_root() / "templates"


def default_matrix_path() -> Path:
    return _data_root() / "matrix.yaml"


def smoke_tests_dir() -> Path:
    # find_spec, not import: smoke_tests may import torch, which the host need not have.
    spec = importlib.util.find_spec("smoke_tests")
    if spec is None or spec.origin is None:
        raise RuntimeError("the smoke_tests package is missing from this installation")
    return Path(spec.origin).resolve().parent


@lru_cache(maxsize=1)
def carried_files() -> Mapping[str, bytes]:
    """The files of imagebuilder every image carries, by their path in the build context: the
    smoke tests and the SBOM's writer (read once per process; image_plan puts them into each
    build context)."""
    root = smoke_tests_dir()
    files = {f"imagebuilder/smoke_tests/{p.relative_to(root).as_posix()}": p.read_bytes()
             for p in sorted(root.rglob("*.py"))}
    files["imagebuilder/sbom.py"] = (_PACKAGE / "trust" / "sbom.py").read_bytes()
    return files
