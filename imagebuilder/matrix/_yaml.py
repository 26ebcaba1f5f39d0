"""matrix.yaml's YAML -> plain data, with a line for every key path (for the problems'
messages); aliases checked for cycles and for size ("billion laughs"); merge keys (`<<: *anchor`)
read as PyYAML's safe loader reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .model import KeyPath, MatrixError, Problem

_MERGE = "tag:yaml.org,2002:merge"  # the tag PyYAML's resolver gives a plain `<<` key
_MAX_NODES = 100_000  # far above any real matrix (matrix.yaml has about 2,000 values)


def compose(text: str, file: Path) -> tuple[Any, dict[KeyPath, int], list[Problem]]:
    import yaml  # here, not at the top: `imagebuilder --help` should not pay for it

    try:
        root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise MatrixError(file=file, problems=[Problem((), line, f"not valid YAML: {getattr(e, 'problem', e)}")]) from e
    lines: dict[KeyPath, int] = {}
    problems: list[Problem] = []
    scalars = yaml.SafeLoader("")
    inside: set[int] = set()  # the nodes being converted: an alias to one of them is a cycle
    budget = [_MAX_NODES]  # aliases can repeat a subtree exponentially ("billion laughs")

    def convert(node: Any, path: KeyPath) -> Any:
        lines.setdefault(path, node.start_mark.line + 1)
        budget[0] -= 1
        if budget[0] < 0:
            if budget[0] == -1:
                problems.append(Problem(path, node.start_mark.line + 1,
                                        f"over {_MAX_NODES} values once aliases are expanded; expand fewer aliases"))
            return None
        if id(node) in inside:
            problems.append(Problem(path, node.start_mark.line + 1,
                                    "a YAML alias inside the anchor it names (the value contains itself)"))
            return None
        if isinstance(node, yaml.MappingNode):
            inside.add(id(node))
            out: dict[str, Any] = merged(node, path)
            explicit: set[str] = set()
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = _key(key_node, path)
                if key in explicit:
                    problems.append(
                        Problem(path + (key,), key_node.start_mark.line + 1, "duplicate key")
                    )
                explicit.add(key)
                lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = convert(value_node, path + (key,))
            inside.discard(id(node))
            return out
        if isinstance(node, yaml.SequenceNode):
            inside.add(id(node))
            items = [convert(item, path + (str(i),)) for i, item in enumerate(node.value)]
            inside.discard(id(node))
            return items
        try:
            return scalars.construct_object(node)
        except yaml.YAMLError as e:
            problems.append(Problem(path, node.start_mark.line + 1, f"not a valid value: {getattr(e, 'problem', e)}"))
            return None

    def merged(node: Any, path: KeyPath) -> dict[str, Any]:
        """What the mapping's merge keys (`<<: *anchor`, `<<: [*a, *b]`) bring, as YAML 1.1 (and
        PyYAML) read them: the mapping's own keys override them (the caller sets those after), and
        an earlier anchor in a list wins over a later one."""
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE:
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in sources:
                if not isinstance(source, yaml.MappingNode):
                    problems.append(Problem(path, key_node.start_mark.line + 1,
                                            "a merge key (<<) takes an alias of a mapping, or a list of them"))
                    continue
                for key, value in (convert(source, path) or {}).items():
                    out.setdefault(key, value)
        return out

    def _key(node: Any, path: KeyPath) -> str:
        line = node.start_mark.line + 1
        if not isinstance(node, yaml.ScalarNode):
            problems.append(Problem(path, line, "a key must be a plain value, not a list or mapping"))
            return f"<key at line {line}>"
        try:
            return str(scalars.construct_object(node))
        except yaml.YAMLError as e:
            problems.append(Problem(path, line, f"not a valid key: {getattr(e, 'problem', e)}"))
            return f"<key at line {line}>"

    data = convert(root, ()) if root is not None else None
    return data, lines, problems
