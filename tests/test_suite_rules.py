"""Rules over the test suite itself (read from its source, no Docker): what CI's minutes go to,
and that no proof can pass without having run."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def sources() -> list[tuple[str, Path]]:
    """Every Python file of the suite, by its name under tests/ (support's as support/NAME.py)."""
    paths = sorted(TESTS.glob("*.py")) + sorted(TESTS.glob("support/*.py"))
    return [(path.relative_to(TESTS).as_posix(), path) for path in paths]

# A skip that is a condition of the host, not a tool CI installs: (file, the skip's text).
HOST_CONDITIONS = {
    ("test_bad_inputs.py", 'pytest.skip(f"needs a {python} without torch")'),  # a host whose system Python has torch
    ("test_variant_checks.py", 'pytest.skip("this torch is a CUDA build")'),  # a GPU host's torch
    ("test_verify.py", '@pytest.mark.skipif(HOST_HAS_GPU, reason="this host has GPUs")'),  # a GPU host
}
# What skips a test or excuses its failure: pytest.skip/importorskip/xfail calls and the skip,
# skipif and xfail marks (as decorators, in pytestmark, or in a pytest.param's marks).
SKIPPING = re.compile(r"pytest\.(?:skip|importorskip|xfail)\(|\bmark\.(?:skip|skipif|xfail)\b")


def skips_in(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line of `text` that skips a test or excuses its failure."""
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if SKIPPING.search(line)]


def test_every_missing_tool_goes_through_the_one_helper():
    """A test that lacks what it needs calls support.unavailable's _unavailable (or require_module),
    which fails under IMAGEBUILDER_REQUIRE_DOCKER=1: CI, which installs every such tool, cannot pass
    by skipping. A bare pytest.skip, importorskip, skipif or xfail would skip (or pass as expected
    to fail) there too; only a condition of the host (HOST_CONDITIONS) may skip."""
    found = []
    for name, path in sources():
        if name in ("support/unavailable.py", Path(__file__).name):
            continue
        found += [f"{name}:{number}: {line}" for number, line in skips_in(path.read_text())
                  if (name, line) not in HOST_CONDITIONS]
    assert not found, "use support.unavailable: _unavailable / require_module:\n" + "\n".join(found)


@pytest.mark.parametrize("line, skips", [
    ('pytest.skip("no docker")', True),
    ('docker = pytest.importorskip("docker")', True),
    ('@pytest.mark.skipif(sys.platform == "darwin", reason="linux only")', True),
    ('pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")', True),
    ('@pytest.mark.skip(reason="later")', True),
    ('@pytest.mark.xfail(reason="known bug")', True),
    ('pytest.xfail("the classic builder rebuilds")', True),
    ('pytest.param("x", marks=pytest.mark.xfail(strict=True))', True),
    ('_unavailable("cosign is missing")', False),
    ("# an xfail would hide it; skipif too", False),
    ('assert "skip" in statuses', False),
])
def test_the_rule_sees_every_way_to_skip(line, skips):
    assert bool(skips_in(line)) is skips


# --- every real torch build is a listed decision -----------------------------------------

# Calls that build (or publish) a real torch image whatever their arguments say.
BUILD_HELPERS = {"build_cli", "build_floor", "_build", "_publish"}
NOT_BUILDING = {"--dry-run", "--merge-only", "--help"}
# Calls that run the CLI with the arguments they are given: in a subprocess (conftest's), or in
# this process with a recorded smoke-test verdict (support.replay's).
CLI_CALLS = {"imagebuilder", "cli_replaying"}


def _is_publish_args(node: ast.AST) -> bool:
    """A call of a test module's _publish_args (the argument list of a real publish)."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_publish_args"


def _strings(node: ast.AST, assigned: Mapping[str, ast.AST]) -> set[str]:
    """The string constants in an argument list, a `*name` resolved where the same function
    assigns `name` a literal list or tuple."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.add(sub.value)
        elif _is_publish_args(sub):
            found.add("publish")  # test_publish's (or test_publish_buildkit's) argument list of a publish
        elif isinstance(sub, ast.Starred) and isinstance(sub.value, ast.Name) and sub.value.id in assigned:
            found |= _strings(assigned[sub.value.id], {})
    return found


def real_builds() -> set[tuple[str, str]]:
    """(file, function) of every function in tests/ that runs `imagebuilder build|publish` for
    real (not a dry run, not a merge of what is in a registry) or calls a build helper."""
    found = set()
    for file, path in sources():
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            assigned = {target.id: node.value for node in ast.walk(function) if isinstance(node, ast.Assign)
                        for target in node.targets if isinstance(target, ast.Name)
                        and (isinstance(node.value, (ast.List, ast.Tuple)) or _is_publish_args(node.value))}
            for call in ast.walk(function):
                if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                    continue
                called = call.func.id
                if called in BUILD_HELPERS and called != function.name:
                    found.add((file, function.name))
                elif called in CLI_CALLS:
                    words = _strings(ast.Tuple(elts=list(call.args), ctx=ast.Load()), assigned)
                    if {"build", "publish"} & words and not NOT_BUILDING & words:
                        found.add((file, function.name))
    return found


def test_every_real_torch_build_is_a_listed_decision():
    """A real torch image costs minutes of CI's 40 (docs/development.md): a new one is added to
    support.policy's OTHER_REAL_BUILDS (or reuses a family of IMAGE_FAMILIES) on purpose, never by
    accident; a listed one that is gone is taken off the list."""
    from support.policy import OTHER_REAL_BUILDS

    found = real_builds()
    assert found, "the scan finds no build at all: it no longer reads the tests"
    new = sorted(found - set(OTHER_REAL_BUILDS))
    assert not new, ("real torch builds outside support.policy's OTHER_REAL_BUILDS and IMAGE_FAMILIES (reuse a family's "
                     f"image, or list it with what it costs): {new}")
    gone = sorted(set(OTHER_REAL_BUILDS) - found)
    assert not gone, f"listed in OTHER_REAL_BUILDS but no longer building: {gone}"


# --- where fakes live, and what a test module may import ----------------------------------------

# A fake is a class named so: it stands in for a protocol of imagebuilder's (the engine, a registry,
# an index), and lives in tests/support/ (typed against that protocol there), however few use it.
FAKE_PREFIXES = ("Fake", "Canned", "Stub")


def imports_of_test_modules(text: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a test module (test_*, tests.test_*) in `text`, at any depth."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]
            found += [(node.lineno, name) for name in names if name.removeprefix("tests.").startswith("test_")]
    return found


def fake_classes(text: str) -> list[tuple[int, str]]:
    """(line, name) of every class `text` defines, at any depth, whose name says it is a fake."""
    return [(node.lineno, node.name) for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ClassDef) and node.name.startswith(FAKE_PREFIXES)]


def test_no_test_module_imports_another():
    """What two test modules share is in tests/support/: a test module imported by another runs
    its module-level code twice under two names, and mypy sees it untyped."""
    found = {file: imports for file, path in sources() if (imports := imports_of_test_modules(path.read_text()))}
    assert not found, f"imports of test modules (move what they share to tests/support/): {found}"


def test_fakes_are_defined_under_support_only():
    found = {file: classes for file, path in sources() if not file.startswith("support/")
             if (classes := fake_classes(path.read_text()))}
    assert not found, f"fakes (classes named {'*, '.join(FAKE_PREFIXES)}*) outside tests/support/: {found}"
    assert any(fake_classes(path.read_text()) for file, path in sources() if file.startswith("support/")), \
        "no fake found under tests/support/: the scan no longer reads it"


@pytest.mark.parametrize("text, imports, fakes", [
    ("from test_publish_runner import images\n", [(1, "test_publish_runner")], []),
    ("import test_verify as v\n", [(1, "test_verify")], []),
    ("def f():\n    from tests.test_publish import BOTH\n", [(2, "tests.test_publish")], []),
    ("from support.canned_engine import CannedEngine\nimport testing\n", [], []),
    ("class CannedRegistry:\n    pass\n", [], [(1, "CannedRegistry")]),
    ("def test_x():\n    class FakeEngine(Base):\n        pass\n", [], [(2, "FakeEngine")]),
    ("class StubIndex: ...\nclass Down(CannedPublished): ...\n", [], [(1, "StubIndex")]),
])
def test_the_layout_rules_see_what_they_forbid(text, imports, fakes):
    assert (imports_of_test_modules(text), fake_classes(text)) == (imports, fakes)
