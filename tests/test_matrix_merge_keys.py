"""YAML merge keys in matrix.yaml (issue 45, part 5): read as PyYAML's safe loader reads them (a
common way to share a block's fields), with the merged keys' lines where they are written; a
merge key of anything but mappings is one problem naming its line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from imagebuilder.matrix._yaml import compose
from imagebuilder.matrix.load import parse_matrix
from imagebuilder.matrix.model import MatrixError

SMALL = Path(__file__).parent / "data" / "matrix-small.yaml"

MERGES = """\
a: &x
  k: 1
  j: 0
b:
  <<: *x
  j: 2
c:
  <<: [*x, {k: 9, z: 3}]
"""


def test_merge_keys_read_as_pyyaml_reads_them() -> None:
    data, lines, problems = compose(MERGES, Path("m.yaml"))
    assert problems == [] and data == yaml.safe_load(MERGES)
    assert data["b"] == {"k": 1, "j": 2} and data["c"] == {"k": 1, "j": 0, "z": 3}
    assert lines[("b", "k")] == 2 and lines[("b", "j")] == 6  # the merged value's own line, the override's


def test_a_matrix_written_with_anchors_and_merge_keys_is_the_same_matrix(tmp_path: Path) -> None:
    text = SMALL.read_text()
    same = '{jupyterlab: "4.6.6", ipykernel: "7.4.0", ipywidgets: "8.1.9", pandas: "3.1.1", matplotlib: "3.11.2"'
    line_312 = next(line for line in text.splitlines() if line.startswith('    "3.12": ') and same in line)
    line_313 = next(line for line in text.splitlines() if line.startswith('    "3.13": ') and same in line)
    merged = (text.replace(line_312, line_312.replace('"3.12": {', '"3.12": &nb {'))
              .replace(line_313, '    "3.13": {<<: *nb, source: "test"}'))
    assert merged != text
    path = tmp_path / "matrix.yaml"
    assert compose(merged, path)[0] == compose(text, path)[0]
    matrix = parse_matrix(merged, path)
    assert matrix.tools == parse_matrix(text, path).tools


def test_a_merge_key_of_a_scalar_is_one_problem_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    text = SMALL.read_text().replace("defaults:\n", "defaults:\n  <<: 5\n", 1)
    with pytest.raises(MatrixError) as raised:
        parse_matrix(text, path)
    problems = raised.value.fields["problems"]
    assert len(problems) == 1 and problems[0].line == 4, problems
    assert "a merge key (<<) takes an alias of a mapping" in problems[0].message
