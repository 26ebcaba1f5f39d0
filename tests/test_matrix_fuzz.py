"""An in-process fuzzer over the matrix loader and validator, bounded so that it runs in the
fast tests: whatever a matrix.yaml holds, loading it either gives a Matrix that every image
of it resolves from, or a MatrixError listing the problems; never another exception.

The mutations are what people write into a YAML file by mistake: a value of the wrong type,
an empty or null value, a version with a letter in it, a deleted or unknown key. On the code
before these tests, this found `min_driver: "550.x"` (a ValueError in driver_key) and
`python: null` in a torch block (max() of an empty sequence in resolve).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.fuzz import fuzz_examples

from imagebuilder.errors import BadRequest
from imagebuilder.matrix.load import load_matrix, parse_matrix
from imagebuilder.matrix.model import MatrixError
from imagebuilder.matrix.resolve import enumerate_matrix

SMALL = Path(__file__).parent / "data" / "matrix-small.yaml"
DATA = yaml.safe_load(SMALL.read_text())
FILE = Path("fuzzed.yaml")
Path_ = tuple[Any, ...]


def _paths(node: Any, path: Path_ = ()) -> list[Path_]:
    found = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, path + (key,))
    elif isinstance(node, list) and node:  # the first item stands for all: fewer paths, each tried more
        found += _paths(node[0], path + (0,))
    return found


PATHS = _paths(DATA)
# Each value is a mistake someone makes: null, empty, wrong type, YAML's number reading of a
# version, a version with a letter, a driver with a wildcard.
VALUES = st.one_of(
    st.none(),
    st.sampled_from(["", "550.x", "x", "12.10", 12.1, 3, -1, True, [], {}, [None], ["3.11"],
                     {"a": 1}, "3.99", "cu999", "linux/riscv64", "0.0.0", "nvidia/cuda:1"]),
    st.one_of(st.text(max_size=6), st.integers()),
)
MUTATION = st.tuples(st.sampled_from(PATHS), st.sampled_from(["set", "empty", "delete", "add"]), VALUES)


def _mutate(data: Any, path: Path_, op: str, value: Any) -> None:
    parent = data
    for key in path[:-1]:
        if isinstance(parent, dict) and key in parent or isinstance(parent, list) and isinstance(key, int) and key < len(parent):
            parent = parent[key]
        else:
            return  # an earlier mutation removed the way there
    last = path[-1]
    if op == "empty":  # `key:` with nothing after it, the commonest slip
        op, value = "set", None
    if isinstance(parent, dict):
        if op == "delete":
            parent.pop(last, None)
        elif op == "add":
            parent[f"{last}_extra"] = value
        else:
            parent[last] = value
    elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
        if op == "delete":
            del parent[last]
        else:
            parent[last] = value


def _check(text: str) -> None:
    try:
        matrix = parse_matrix(text, FILE)
    except MatrixError:
        return
    try:
        list(enumerate_matrix(matrix))
    except BadRequest:
        pass  # a valid matrix may hold images that cannot be built; they are left out, not a crash


@settings(max_examples=fuzz_examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(MUTATION, min_size=1, max_size=2))
def test_any_edit_of_a_matrix_loads_or_lists_its_problems(mutations: list[tuple[Path_, str, Any]]) -> None:
    data = copy.deepcopy(DATA)
    for path, op, value in mutations:
        _mutate(data, path, op, value)
    _check(yaml.dump(data, Dumper=yaml.CSafeDumper, sort_keys=False))


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(st.integers(min_value=0, max_value=len(SMALL.read_bytes())), st.binary(min_size=1, max_size=4))
def test_any_bytes_in_a_matrix_file_load_or_list_their_problems(tmp_path_factory: Any, at: int, junk: bytes) -> None:
    original = SMALL.read_bytes()
    path = tmp_path_factory.mktemp("fuzz") / "matrix.yaml"
    path.write_bytes(original[:at] + junk + original[at:])
    try:
        matrix = load_matrix(path)
    except MatrixError:
        return
    try:
        list(enumerate_matrix(matrix))
    except BadRequest:
        pass
