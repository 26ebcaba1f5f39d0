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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from ..errors import BadRequest
from ..reading import KeyPath, Source, read_text, read_toml, shown, unusable_specifier

LOCK_FILE = "imagebuilder-project.lock"
"""The project's resolved lock, written into the project folder and reused by later runs."""
_APT_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")  # Debian policy's package name
_PACKAGE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,200}[A-Za-z0-9])?")  # PEP 508
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
    data, source = read_toml(path / "pyproject.toml") if (path / "pyproject.toml").is_file() else ({}, None)
    tool = _tool(path, data, source)
    project = source.mapping(data["project"], ("project",), "a table") if source and "project" in data else None
    reqs: list[tuple[str, Source, KeyPath]]
    if (path / "uv.lock").is_file():
        kind, reqs = "uv.lock", _uv_export(path, uv)
    elif (path / "pylock.toml").is_file():
        kind, reqs = "pylock.toml", _pylock(path / "pylock.toml")
    elif source is not None and project is not None:
        kind = "pyproject.toml"
        reqs = [(text, source, ("project", "dependencies", i)) for i, text in
                enumerate(source.strings(project.get("dependencies", []), ("project", "dependencies"),
                                         what="a requirement"))]
    elif (path / "requirements.txt").is_file():
        kind, reqs = "requirements.txt", _requirements_txt(path / "requirements.txt")
    else:
        raise NotAProject(path=path, why="no pyproject.toml with a [project] table, uv.lock, pylock.toml or "
                                        "requirements.txt; add one that lists the project's dependencies")
    name = None
    if source is not None and project is not None:
        name = source.string(project.get("name"), ("project", "name"), pattern=_PACKAGE_NAME, what="a package name")
        build = source.mapping(data.get("build-system", {}), ("build-system",), "a table")
        requires = source.strings(build["requires"], ("build-system", "requires"), what="a requirement") \
            if "requires" in build else ["setuptools>=40.8.0"]  # PEP 517's fallback backend
        reqs += [(text, source, ("build-system", "requires", i)) for i, text in enumerate(requires)]
    for text, where, key in reqs:
        _requirement(text, where, key)
    return Project(path=path, kind=kind, requirements=tuple(dict.fromkeys(text for text, _, _ in reqs)), name=name,
                   **tool)


def _tool(path: Path, pyproject: Mapping[str, Any], source: Source | None) -> dict[str, Any]:
    prefix: KeyPath = ("tool", "imagebuilder")
    tools = source.mapping(pyproject.get("tool", {}), ("tool",), "a table") if source else {}
    table = tools.get("imagebuilder")
    if table is None and (path / "imagebuilder.toml").is_file():
        table, source = read_toml(path / "imagebuilder.toml")
        prefix = ()
    if table is None or source is None:
        return {}
    table = source.mapping(table, prefix, "a table")
    for key in sorted(set(table) - _TOOL_KEYS):
        source.fail(prefix + (key,), f"is not a key of [tool.imagebuilder]; known: {', '.join(sorted(_TOOL_KEYS))}")
    apt = source.strings(table.get("apt", []), prefix + ("apt",), pattern=_APT_NAME, what="a Debian package name")
    start = table.get("start")
    command: tuple[str, ...] | None = None
    if start is not None:
        what = "a command: a non-empty string or list of strings"
        if isinstance(start, list):
            command = tuple(source.strings(start, prefix + ("start",), what="a word of a command"))
        else:
            try:
                command = tuple(shlex.split(source.string(start, prefix + ("start",), what=what)))
            except ValueError as e:
                source.fail(prefix + ("start",), f"{e} in {shown(start)}")
        if not command:
            source.fail(prefix + ("start",), f"is empty, not {what}")
    no_isolation = source.strings(table.get("no-build-isolation", []), prefix + ("no-build-isolation",),
                                  pattern=_PACKAGE_NAME, what="a package name")
    return {"apt": tuple(apt), "start": command, "no_build_isolation": tuple(no_isolation)}


def _requirement(text: str, source: Source, key: KeyPath, line: int | None = None) -> Requirement:
    try:
        req = Requirement(text)
    except InvalidRequirement as e:
        source.fail(key, f"{shown(text)} is not a requirement ({str(e).splitlines()[0][:80]})", line)
    why = unusable_specifier(req)
    if why is not None:
        source.fail(key, why, line)
    if req.url:
        source.fail(key, f"{shown(text)}: a direct URL cannot be locked with hashes under the base; "
                         "publish the package to an index or vendor it into the project", line)
    return req


def _requirements_txt(path: Path) -> list[tuple[str, Source, KeyPath]]:
    source = Source(str(path))
    reqs: list[tuple[str, Source, KeyPath]] = []
    for number, raw in enumerate(read_text(path).splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            source.fail((), f"{line.split()[0]} is not supported; list requirements only (indexes come from "
                            "--index-url and the base)", number)
        text = line.split(" --hash")[0].rstrip(" \\")
        _requirement(text, source, (), number)
        reqs.append((text, source, ()))
    return reqs


def _pylock(path: Path) -> list[tuple[str, Source, KeyPath]]:
    doc, source = read_toml(path)
    if "packages" not in doc:
        source.fail(("packages",), "is missing: no [[packages]] array; is it a PEP 751 lock?")
    reqs: list[tuple[str, Source, KeyPath]] = []
    for index, package in enumerate(source.sequence(doc["packages"], ("packages",), "an array of tables")):
        package = source.mapping(package, ("packages", index), "a table")
        name = source.string(package.get("name"), ("packages", index, "name"), pattern=_PACKAGE_NAME,
                             what="a package name")
        version = package.get("version")
        if version is None:  # a path or VCS entry: the project itself, or something we cannot lock
            continue
        version = source.version(version, ("packages", index, "version"))
        reqs.append((f"{name}=={version}", source, ("packages", index)))
    return reqs


def _uv_export(path: Path, uv: str) -> list[tuple[str, Source, KeyPath]]:
    try:
        done = subprocess.run([uv, "export", "--frozen", "--format", "requirements-txt", "--no-hashes",
                               "--no-header", "--no-annotate", "--no-emit-project", "--directory", str(path)],
                              capture_output=True, text=True, timeout=120)
    except FileNotFoundError as e:
        raise NotAProject(path=path / "uv.lock", why=f"uv not found at {uv}; install uv to read a uv.lock") from e
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise NotAProject(path=path / "uv.lock", why=f"uv export failed: {last}")
    source = Source(f"{path / 'uv.lock'} (as `uv export` reads it)")
    return [(line.strip(), source, ()) for line in done.stdout.splitlines()
            if line.strip() and not line.lstrip().startswith(("#", "-e", "."))]
