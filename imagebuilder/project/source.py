"""What a project is: its folder read once into a `Project` value (pure but for reading DIR and
running `uv export` for a uv.lock).

A project declares its Python requirements in exactly one of (first found wins, in this order):
- `pyproject.toml` with a PEP 621 `[project]` table: its `dependencies`, and the project itself
  is installed as a package (its `[build-system] requires` are resolved with the rest, so the
  package builds without fetching anything and under the base's pins);
- `uv.lock` (uv's lock, read through `uv export`; beside a pyproject.toml, which it locks);
- `pylock.toml` (PEP 751): each `[[packages]]` entry's name and version;
- `requirements.txt`.
Optional, in pyproject.toml's `[tool.imagebuilder]` (or `imagebuilder.toml` for a project
without one): `apt = ["libsndfile1", ...]` (OS packages), `start = "python -m app"` (the image's
command), `no-build-isolation = ["flash-attn"]` (sdists that build against the venv's torch).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from ..errors import BadRequest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as pip vendors it (pip is in every venv imagebuilder runs from)
    from pip._vendor import tomli as tomllib

LOCK_FILE = "imagebuilder-project.lock"
"""The project's resolved lock, written into the project folder and reused by later runs."""
_APT_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")  # Debian policy's package name
_TOOL_KEYS = frozenset({"apt", "start", "no-build-isolation"})


class NotAProject(BadRequest):
    template = "{path}: {why}"


@dataclass(frozen=True)
class Project:
    path: Path
    kind: str
    """Which file declared the requirements: pyproject.toml, uv.lock, pylock.toml, requirements.txt."""
    requirements: tuple[str, ...]
    """The requirements to resolve under the base (the build backend's included for a package)."""
    name: str | None = None
    """The package the project installs itself as (pyproject.toml), else None."""
    apt: tuple[str, ...] = ()
    start: tuple[str, ...] | None = None
    no_build_isolation: tuple[str, ...] = ()


def read_project(path: Path, uv: str = "uv") -> Project:
    if not path.is_dir():
        raise NotAProject(path=path, why="not a folder; give the project's folder (with pyproject.toml, "
                                        "requirements.txt, uv.lock or pylock.toml)")
    pyproject = _toml(path / "pyproject.toml") if (path / "pyproject.toml").is_file() else None
    tool = _tool(path, pyproject)
    if (path / "uv.lock").is_file():
        kind, reqs = "uv.lock", _uv_export(path, uv)
    elif (path / "pylock.toml").is_file():
        kind, reqs = "pylock.toml", _pylock(path / "pylock.toml")
    elif pyproject is not None and "project" in pyproject:
        kind, reqs = "pyproject.toml", _list(pyproject["project"], "dependencies", path / "pyproject.toml", "project")
    elif (path / "requirements.txt").is_file():
        kind, reqs = "requirements.txt", _requirements_txt(path / "requirements.txt")
    else:
        raise NotAProject(path=path, why="no pyproject.toml with a [project] table, uv.lock, pylock.toml or "
                                        "requirements.txt; add one that lists the project's dependencies")
    name = None
    if pyproject is not None and "project" in pyproject:
        name = str(pyproject["project"].get("name") or "")
        if not name:
            raise NotAProject(path=path / "pyproject.toml", why="[project] has no name; give the package a name")
        build = pyproject.get("build-system", {})
        reqs += _list(build, "requires", path / "pyproject.toml", "build-system") if "requires" in build \
            else ["setuptools>=40.8.0"]  # PEP 517's fallback backend
    for text in reqs:
        _requirement(text, path / kind)
    return Project(path=path, kind=kind, requirements=tuple(dict.fromkeys(reqs)), name=name, **tool)


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise NotAProject(path=path, why=f"not valid TOML ({str(e).splitlines()[0]}); fix the file") from e


def _tool(path: Path, pyproject: Mapping[str, Any] | None) -> dict[str, Any]:
    where = path / "pyproject.toml"
    table = (pyproject or {}).get("tool", {}).get("imagebuilder")
    if table is None and (path / "imagebuilder.toml").is_file():
        where = path / "imagebuilder.toml"
        table = _toml(where)
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise NotAProject(path=where, why="[tool.imagebuilder] must be a table")
    unknown = sorted(set(table) - _TOOL_KEYS)
    if unknown:
        raise NotAProject(path=where, why=f"[tool.imagebuilder] has unknown key(s) {', '.join(unknown)}; "
                                         f"known: {', '.join(sorted(_TOOL_KEYS))}")
    apt = _list(table, "apt", where, "tool.imagebuilder")
    for name in apt:
        if not _APT_NAME.match(name):
            raise NotAProject(path=where, why=f"tool.imagebuilder.apt: {name!r} is not a Debian package name")
    start = table.get("start")
    command: tuple[str, ...] | None = None
    if start is not None:
        if isinstance(start, str):
            try:
                command = tuple(shlex.split(start))
            except ValueError as e:
                raise NotAProject(path=where, why=f"tool.imagebuilder.start: {e} in {start!r}") from e
        elif isinstance(start, list) and all(isinstance(w, str) for w in start):
            command = tuple(start)
        if not command:
            raise NotAProject(path=where, why="tool.imagebuilder.start must be a command: a non-empty string or "
                                             "list of strings")
    no_isolation = _list(table, "no-build-isolation", where, "tool.imagebuilder")
    return {"apt": tuple(apt), "start": command, "no_build_isolation": tuple(no_isolation)}


def _list(table: Mapping[str, Any], key: str, where: Path, prefix: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NotAProject(path=where, why=f"{prefix}.{key} must be a list of strings")
    return list(value)


def _requirement(text: str, where: Path) -> Requirement:
    try:
        req = Requirement(text)
    except InvalidRequirement as e:
        raise NotAProject(path=where, why=f"{text!r} is not a requirement ({str(e).splitlines()[0]})") from e
    if req.url:
        raise NotAProject(path=where, why=f"{text!r}: a direct URL cannot be locked with hashes under the base; "
                                         "publish the package to an index or vendor it into the project")
    return req


def _requirements_txt(path: Path) -> list[str]:
    reqs = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise NotAProject(path=path, why=f"line {number}: {line.split()[0]} is not supported; list requirements "
                                            "only (indexes come from --index-url and the base)")
        reqs.append(line.split(" --hash")[0].rstrip(" \\"))
    return reqs


def _pylock(path: Path) -> list[str]:
    doc = _toml(path)
    packages = doc.get("packages")
    if not isinstance(packages, list):
        raise NotAProject(path=path, why="no [[packages]] array; is it a PEP 751 lock?")
    reqs = []
    for index, package in enumerate(packages):
        if not isinstance(package, dict) or not isinstance(package.get("name"), str):
            raise NotAProject(path=path, why=f"packages[{index}] has no name")
        version = package.get("version")
        if version is None:  # a path or VCS entry: the project itself, or something we cannot lock
            continue
        reqs.append(f"{package['name']}=={version}")
    return reqs


def _uv_export(path: Path, uv: str) -> list[str]:
    try:
        done = subprocess.run([uv, "export", "--frozen", "--format", "requirements-txt", "--no-hashes",
                               "--no-header", "--no-annotate", "--no-emit-project", "--directory", str(path)],
                              capture_output=True, text=True, timeout=120)
    except FileNotFoundError as e:
        raise NotAProject(path=path / "uv.lock", why=f"uv not found at {uv}; install uv to read a uv.lock") from e
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise NotAProject(path=path / "uv.lock", why=f"uv export failed: {last}")
    return [line.strip() for line in done.stdout.splitlines()
            if line.strip() and not line.lstrip().startswith(("#", "-e", "."))]
