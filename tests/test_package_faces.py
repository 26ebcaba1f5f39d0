"""Each package's face (its __init__.py) exports what code outside the package uses, and nothing else.

The names used are read from the source with ast (imports from the package, and attributes of the
package imported as a module), so this cannot drift from the code: a name a caller starts using must
be added to the face, a name no caller uses any more must leave it. Tests import from the module that
defines a name, never through a face, so a face stays the callers' interface and not the tests'.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("build", "engine", "lock", "matrix", "project", "publish", "registry", "scan", "trust", "verify")
# The code outside a package that may use its face: the rest of imagebuilder, and bench/.
CALLERS = (REPO / "imagebuilder", REPO / "bench")


def _module_name(path: Path, repo: Path) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The module a `from ... import` names, for relative imports too."""
    if level == 0:
        return target or ""
    base = module.split(".")[: None if is_package else -1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _face(package: str, repo: Path = REPO) -> tuple[set[str], set[str]]:
    """The names a package's __init__.py binds, and its submodules' names."""
    folder = repo / "imagebuilder" / package
    tree = ast.parse((folder / "__init__.py").read_text())
    bound = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom) and node.level
             for alias in node.names}
    submodules = {path.stem for path in folder.glob("*.py") if path.stem != "__init__"}
    return bound, submodules


def _uses(package: str, roots: tuple[Path, ...], repo: Path = REPO) -> dict[str, set[str]]:
    """name -> the modules (outside the package) that use it through the package's face."""
    dotted = f"imagebuilder.{package}"
    bound, submodules = _face(package, repo)

    def through_face(name: str) -> bool:  # a face name, or anything that is not a submodule
        return name in bound or name not in submodules

    used: dict[str, set[str]] = {}
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        module = _module_name(path, repo)
        if module == dotted or module.startswith(dotted + "."):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(module, path.name == "__init__.py", node.level, node.module)
                for alias in node.names:
                    if source == dotted and through_face(alias.name):
                        used.setdefault(alias.name, set()).add(module)
                    elif f"{source}.{alias.name}" == dotted:
                        aliases.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                aliases.update(alias.asname for alias in node.names if alias.name == dotted and alias.asname)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and through_face(node.attr)):
                used.setdefault(node.attr, set()).add(module)
    return used


@pytest.mark.parametrize("package", PACKAGES)
def test_a_face_exports_exactly_what_callers_outside_the_package_use(package: str) -> None:
    face = importlib.import_module(f"imagebuilder.{package}")
    used = _uses(package, CALLERS)
    assert used, f"nothing outside imagebuilder.{package} uses its face: the scan is broken"
    assert sorted(face.__all__) == sorted(used), {
        "unused, remove from the face": sorted(set(face.__all__) - set(used)),
        "used, add to the face": {name: sorted(used[name]) for name in set(used) - set(face.__all__)},
    }
    bound, _ = _face(package)
    assert bound == set(face.__all__), "the face binds names its __all__ does not list, or the reverse"


@pytest.mark.parametrize("package", PACKAGES)
def test_tests_import_from_the_defining_module_not_the_face(package: str) -> None:
    used = _uses(package, (REPO / "tests",))
    assert used == {}, f"import these from their imagebuilder.{package}.<module>: {used}"


def test_the_scan_sees_imports_relative_absolute_and_as_a_module(tmp_path: Path) -> None:
    """The scanner itself: each way a caller can reach a face name is counted, a submodule is not."""
    assert _absolute("imagebuilder.cli", False, 1, "publish") == "imagebuilder.publish"
    assert _absolute("imagebuilder.publish.run", False, 2, "verify") == "imagebuilder.verify"
    assert _absolute("imagebuilder.publish", True, 1, "plan") == "imagebuilder.publish.plan"
    assert _absolute("bench.x", False, 0, "imagebuilder.engine") == "imagebuilder.engine"
    root = tmp_path / "caller"
    root.mkdir()
    (root / "a.py").write_text("from imagebuilder.publish import Ledger, squashfs\n")
    (root / "b.py").write_text("from imagebuilder import publish\npublish.publish_command()\npublish.push.x\n")
    (root / "c.py").write_text("import imagebuilder.publish as p\np.Step\n")
    (tmp_path / "imagebuilder").mkdir()
    (tmp_path / "imagebuilder" / "publish").symlink_to(REPO / "imagebuilder" / "publish")
    assert {name: sorted(modules) for name, modules in _uses("publish", (root,), tmp_path).items()} == {
        "Ledger": ["caller.a"], "publish_command": ["caller.b"], "Step": ["caller.c"]}


def test_at_most_twelve_modules_stay_at_the_top() -> None:
    """imagebuilder/ holds packages by concept; at its top only the command line's entry points, the
    errors and what every package shares (docs/architecture.md): at most 12 modules."""
    top = sorted(path.name for path in (REPO / "imagebuilder").glob("*.py"))
    assert "errors.py" in top and "__main__.py" in top  # the scan reads the real folder
    assert len(top) <= 12, top
    assert not [name for name in top if name.startswith("cli")], "the command line lives in imagebuilder/cli/"


def _imports(path: Path, repo: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that the module at `path` imports when it runs: at any depth (a
    function's deferred import too), but not under `if TYPE_CHECKING:`. A name imported from a
    package is its submodule where one is called so, else the package (its __init__ runs)."""
    module = _module_name(path, repo)
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, path.name == "__init__.py", node.level, node.module)
                found.update(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                             for alias in node.names)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])
                elif isinstance(child, ast.ExceptHandler):
                    visit(child.body)

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    named = set()
    for name in found:  # `import a.b.c` runs a.b.c (and its packages): the nearest module of ours
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            named.add(name)
    return named


def import_cycles(root: Path, repo: Path = REPO) -> list[list[str]]:
    """Each set of modules under `root` that import each other round a circle (Tarjan's strongly
    connected components of more than one module), sorted."""
    paths = {_module_name(path, repo): path for path in sorted(root.rglob("*.py"))}
    graph = {module: sorted(_imports(path, repo, set(paths))) for module, path in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                connect(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in graph:
        if module not in index:
            connect(module)
    return sorted(cycles)


def test_no_module_imports_itself_round_a_circle() -> None:
    """Issue 54: each module's imports lead away from it, deferred ones included: a circle would
    make two modules one concept in two files (and a deferred import the way to hide it)."""
    assert import_cycles(REPO / "imagebuilder") == []


def test_the_cycle_scan_sees_a_circle_through_a_face_and_a_deferred_import(tmp_path: Path) -> None:
    pkg = tmp_path / "imagebuilder" / "p"
    pkg.mkdir(parents=True)
    (tmp_path / "imagebuilder" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "a.py").write_text("def f():\n    from ..b import B\n")
    (tmp_path / "imagebuilder" / "b.py").write_text("from typing import TYPE_CHECKING\nfrom .p import A\n"
                                                   "if TYPE_CHECKING:\n    from .c import C\n")
    (tmp_path / "imagebuilder" / "c.py").write_text("from . import b\n")
    assert import_cycles(tmp_path / "imagebuilder", tmp_path) == [
        ["imagebuilder.b", "imagebuilder.p", "imagebuilder.p.a"]]


def test_no_module_is_over_400_lines() -> None:
    """A module that grows past 400 lines holds more than one concept: split it by them (docs/architecture.md)."""
    sizes = {path.relative_to(REPO).as_posix(): len(path.read_text().splitlines())
             for path in (REPO / "imagebuilder").rglob("*.py")}
    assert len(sizes) > 100  # the scan reads the real package
    assert {name: lines for name, lines in sizes.items() if lines > 400} == {}
