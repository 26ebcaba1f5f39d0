"""Bad values by class, generated: every leaf of a valid file imagebuilder reads (a lock,
locks/base-images.json, a project's pyproject.toml, an allowlist, matrix.yaml) set to a value of
the wrong type, empty, negative, huge, NaN or infinite, unicode, a list for a scalar..., and the
file given to the real CLI (click's CliRunner over imagebuilder.cli.cli, no daemon reachable).
Each must be exit 2 with one `error:` line that names the file, the key path and the line, and
no exception escaping the CLI, before any work: nothing reaches Docker.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from packaging.requirements import InvalidRequirement, Requirement
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.fuzz import fuzz_examples

from imagebuilder.cli import cli
from imagebuilder.reading import json_lines, path_text, toml_lines

REPO = Path(__file__).resolve().parents[1]
NO_DAEMON = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
HUGE = 10**30
# The classes of a value nobody can use where a string, a digest, a name or a version belongs.
BAD: list[Any] = [None, "", " ", -1, 0, HUGE, -HUGE, 1.5, math.nan, math.inf, -math.inf, True, False, [], {}, [1], ["?", ""],
       {"a": 1}, "ü\u202e", "\x00", "a" * 5000, "-1", "9" * 5000, "x\ny", [None], [[]]]
BAD_VALUES = st.sampled_from(BAD)
SETTINGS = settings(max_examples=fuzz_examples(60), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
KeyPath = tuple[Any, ...]


def leaves(node: Any, path: KeyPath = ()) -> list[KeyPath]:
    """Every key path of `node`: its mappings, lists and scalars (the whole file too)."""
    found = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            found += leaves(value, path + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += leaves(value, path + (index,))
    return found


def put(data: Any, path: KeyPath, value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(data)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return out


def at(data: Any, path: KeyPath) -> Any:
    for key in path:
        data = data[key]
    return data


def empty_of_its_kind(data: Any, path: KeyPath, value: Any) -> bool:
    """An empty list where a list was, an empty mapping where one was: no value, not a bad one."""
    try:
        original = at(data, path)
    except KeyError:
        return False  # a key the file did not have
    return type(value) is type(original) and isinstance(value, (list, dict)) and not value


def cli_run(*args: str) -> tuple[int, str]:
    result = CliRunner(env=NO_DAEMON).invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stderr


def assert_one_line_naming(code: int, stderr: str, file: Path, path: KeyPath, lines: dict[KeyPath, int]) -> None:
    """Exit 2, one `error:` line naming the file, the key path (or one enclosing it) and its line."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and len(stderr.strip().splitlines()) == 1, stderr
    said = re.match(rf"error: {re.escape(str(file))}: (.+?) \(line (\d+)\): ", errors[0])
    assert said, errors[0]
    named, line, asked = said[1], int(said[2]), path_text(path)
    # The value's own key path, or one enclosing it, or one inside it (a table that lacks a key).
    assert "the whole file" in (named, asked) or asked.startswith(named) or named.startswith(asked), errors[0]
    if named == asked and path in lines:
        assert line == lines[path], errors[0]


# --------------------------------------------------------------------------- locks/base-images.json

BASE = "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04"
BASES = {BASE: {"digest": "sha256:" + "a" * 64, "image_id": "sha256:" + "b" * 64}}
RENDER = ("render", "--dry-run", "--torch", "2.10", "--cuda", "12.8", "--python", "3.12", "--variant", "runtime")


def matrix_folder(tmp: Path) -> Path:
    """The shipped matrix.yaml with a locks/ of the one lock RENDER's image reads."""
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "matrix.yaml", tmp / "matrix.yaml")
    (tmp / "locks").mkdir(exist_ok=True)
    shutil.copy(REPO / "locks" / LOCK.name, tmp / "locks" / LOCK.name)
    return tmp


@SETTINGS
@given(path=st.sampled_from(leaves(BASES) + [(BASE, "digest2")]), value=BAD_VALUES)
def test_any_bad_value_in_base_images_json_is_one_line_naming_it(tmp_path_factory: Any, path: KeyPath,
                                                                  value: Any) -> None:
    if value is None and len(path) == 2 or empty_of_its_kind(BASES, path, value):
        return  # a null digest or image id is one not recorded; no pins at all
    folder = matrix_folder(tmp_path_factory.mktemp("bases"))
    file = folder / "locks" / "base-images.json"
    file.write_text(json.dumps(put(BASES, path, value), indent=2))
    code, stderr = cli_run("--matrix", str(folder / "matrix.yaml"), *RENDER)
    assert_one_line_naming(code, stderr, file, path, json_lines(file.read_text()))


def test_a_valid_base_images_json_renders(tmp_path: Path) -> None:
    folder = matrix_folder(tmp_path)
    (folder / "locks" / "base-images.json").write_text(json.dumps(BASES))
    code, stderr = cli_run("--matrix", str(folder / "matrix.yaml"), *RENDER)
    assert code == 0, stderr


# --------------------------------------------------------------------------- a lock file

LOCK = REPO / "locks" / "torch2.10.0-cu128-py3.12-runtime.txt"


def lock_tokens(text: str) -> list[tuple[int, int, str, str, int]]:
    """(start, end, package, "version" or "hash", the pin's first line) of every value in the lock."""
    out = []
    for pin in re.finditer(r"(?m)^([a-z0-9._-]+)==(\S+)((?: \\\n\s*--hash=\S+)*)", text):
        line = text.count("\n", 0, pin.start()) + 1
        out.append((pin.start(2), pin.end(2), pin[1], "version", line))
        out += [(pin.start(3) + h.start(1), pin.start(3) + h.end(1), pin[1], "hash", line)
                for h in re.finditer(r"--hash=(\S+)", pin[3])]
    return out


TOKENS = lock_tokens(LOCK.read_text())


@SETTINGS
@given(token=st.sampled_from(TOKENS), value=st.one_of(st.sampled_from([str(v) for v in BAD]), st.text(max_size=8)))
def test_any_bad_version_or_hash_in_a_lock_is_one_line_naming_the_package_and_line(
        tmp_path_factory: Any, token: tuple[int, int, str, str, int], value: str) -> None:
    start, end, package, what, line = token
    text = LOCK.read_text()
    if what == "version" and re.fullmatch(r"[0-9]+(\.[0-9]+)*", value) and len(value) < 100:
        return  # a version packaging reads (another version is a stale lock, not a bad value)
    folder = matrix_folder(tmp_path_factory.mktemp("lock"))
    file = folder / "locks" / LOCK.name
    file.write_text(text[:start] + value + text[end:])
    code, stderr = cli_run("--matrix", str(folder / "matrix.yaml"), *RENDER)
    errors = [e for e in stderr.splitlines() if e.startswith("error:")]
    assert code == 2 and len(errors) == 1 and len(stderr.strip().splitlines()) == 1, stderr
    assert errors[0].startswith(f"error: {file}: "), errors[0]
    said = int(re.search(r"\(line (\d+)\)", errors[0])[1])  # type: ignore[index]
    if re.search(r"\s|\\|#", value) or not value:
        # The value broke the line it was written into: the message names where the break is.
        assert line <= said <= line + text[start:].count("\n", 0, 2000), errors[0]
    else:
        assert f" {package}.{what} (line {line}):" in errors[0], errors[0]


# --------------------------------------------------------------------------- pyproject.toml

PYPROJECT = {
    "project": {"name": "app", "version": "0.1", "dependencies": ["pandas==2.2.3"]},
    "build-system": {"requires": ["setuptools>=61"]},
    "tool": {"imagebuilder": {"apt": ["libsndfile1"], "start": "python -m app", "no-build-isolation": ["flash-attn"]}},
}
# Paths whose whole file or table is also a valid project when a value leaves it: not tested here.
_KEEP = {(), ("tool",), ("project", "version")}


def is_requirement(value: Any) -> bool:
    try:
        return isinstance(value, str) and len(value) < 4096 and bool(Requirement(value))
    except InvalidRequirement:
        return False


def toml_value(value: Any) -> str:
    if value is None:
        return '""'  # TOML has no null: the nearest a person writes is an empty value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_text(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """A small TOML writer: a table's own values, then its sub-tables under [headers]."""
    out = "".join(f"{json.dumps(k) if not re.fullmatch(r'[A-Za-z0-9_-]+', k) else k} = {toml_value(v)}\n"
                  for k, v in data.items() if not isinstance(v, dict))
    for key, value in data.items():
        if isinstance(value, dict):
            header = ".".join(prefix + (key,))
            out += f"\n[{header}]\n" + toml_text(value, prefix + (key,))
    return out


@SETTINGS
@given(path=st.sampled_from([p for p in leaves(PYPROJECT) if p not in _KEEP]), value=BAD_VALUES)
def test_any_bad_value_in_a_pyproject_is_one_line_naming_it(tmp_path_factory: Any, path: KeyPath, value: Any) -> None:
    if path[-1] == "start" and isinstance(value, str) and value.strip() and "\x00" not in value and len(value) < 4096:
        return  # any other string is a command
    if isinstance(value, dict) and path == ("build-system",) or empty_of_its_kind(PYPROJECT, path, value) \
            or path[-2:-1] in (("dependencies",), ("requires",)) and is_requirement(value):
        return  # [build-system] has keys of its own; an empty [tool.imagebuilder] or apt asks for nothing
    folder = tmp_path_factory.mktemp("project")
    file = folder / "pyproject.toml"
    file.write_text(toml_text(put(PYPROJECT, path, value)))
    code, stderr = cli_run("project", str(folder), "--base", "b:1", "--tag", "t:1")
    assert_one_line_naming(code, stderr, file, path, toml_lines(file.read_text()))


def test_a_valid_pyproject_gets_past_reading_to_the_daemon(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(toml_text(PYPROJECT))
    code, stderr = cli_run("project", str(tmp_path), "--base", "b:1", "--tag", "t:1")
    assert code == 1 and "pyproject.toml" not in stderr and "docker" in stderr.lower(), stderr


# --------------------------------------------------------------------------- an allowlist

ALLOWLIST = [{"id": "CVE-2025-4802", "reason": "glibc's static setuid binaries", "expires": "2027-03-31"}]


@SETTINGS
@given(path=st.sampled_from([p for p in leaves(ALLOWLIST) if p and p[-1] != "reason"]), value=BAD_VALUES)
def test_any_bad_value_in_an_allowlist_is_one_line_naming_the_entry_and_line(tmp_path_factory: Any, path: KeyPath,
                                                                               value: Any) -> None:
    file = tmp_path_factory.mktemp("allow") / "allowlist.yaml"
    file.write_text(yaml.safe_dump(put(ALLOWLIST, path, value), allow_unicode=True))
    code, stderr = cli_run("scan", "some/image:1", "--allowlist", str(file))
    errors = [e for e in stderr.splitlines() if e.startswith("error:")]
    assert code == 2 and len(errors) == 1 and len(stderr.strip().splitlines()) == 1, stderr
    assert errors[0].startswith(f"error: {file}: "), errors[0]
    key = path[-1] if isinstance(path[-1], str) else None
    assert "entry 1 (line 1)" in errors[0] and (key is None or key in errors[0]), errors[0]


# --------------------------------------------------------------------------- matrix.yaml

SMALL_MATRIX = yaml.safe_load((Path(__file__).parent / "data" / "matrix-small.yaml").read_text())


@settings(max_examples=fuzz_examples(80), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(leaves(SMALL_MATRIX)[1:]), value=BAD_VALUES)
def test_any_bad_value_in_a_matrix_is_exit_2_naming_each_problem_with_its_key_path_and_line(
        tmp_path_factory: Any, path: KeyPath, value: Any) -> None:
    data = put(SMALL_MATRIX, path, value)
    file = tmp_path_factory.mktemp("matrix") / "matrix.yaml"
    file.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    code, stderr = cli_run("--matrix", str(file), "matrix", "check")
    if code == 0:
        return  # the value is one the matrix can use there (a list of one Python, say)
    lines = stderr.strip().splitlines()
    assert code == 2 and lines[0].startswith(f"error: {file} has "), stderr
    for problem in lines[1:]:
        assert re.match(rf"  {re.escape(str(file))}:\d+: \S", problem), problem


# --------------------------------------------------------------------------- version flags

# Each a value no version flag can use: 5,000 digits (packaging's Version fails in int() with a
# ValueError that is not InvalidVersion), NaN and infinities as text, a negative, control characters,
# digits of another script, an empty value.
NOT_VERSIONS = ["9" * 5000, "2." + "9" * 5000, "nan", "inf", "1e400", "-1", "2.6\x00", "\u0662.\u0666", "ü", "", " "]
FLAGS = {"--torch": ("--cuda", "12.4"), "--cuda": ("--torch", "2.6"), "--python": ("--torch", "2.6", "--cuda", "12.4")}


@settings(max_examples=fuzz_examples(40), deadline=None)
@given(flag=st.sampled_from(sorted(FLAGS)), value=st.sampled_from(NOT_VERSIONS),
       command=st.sampled_from([("render", "--dry-run"), ("matrix",)]))
def test_a_version_flag_that_is_no_version_is_one_line(flag: str, value: str, command: tuple[str, ...]) -> None:
    code, stderr = cli_run(*command, *FLAGS[flag], flag, value)
    assert code == 2 and "Traceback" not in stderr, stderr[-500:]
    assert len([line for line in stderr.splitlines() if line.startswith(("error:", "Error:"))]) == 1, stderr[-500:]


@pytest.mark.parametrize("requirement", ["torch==" + "9" * 5000, "pandas>=" + "9" * 5000, "numpy~=2." + "9" * 5000])
def test_a_with_whose_version_cannot_be_compared_is_one_line(requirement: str) -> None:
    code, stderr = cli_run("render", "--dry-run", "--torch", "2.6", "--cuda", "12.4", "--with", requirement)
    assert code == 2 and stderr.startswith("error: --with ") and "names no version it can be compared with" in stderr
    assert len(stderr.strip().splitlines()) == 1
