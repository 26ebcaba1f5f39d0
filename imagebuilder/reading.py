"""Values read from a file a person writes or edits (a lock, locks/base-images.json, a project's
[tool.imagebuilder], ...), each checked for its type and range where it is read: one that cannot be
used is one BadValue naming the file, the key path and the line (exit 2), never a library's
exception from deep inside the run.

    data, source = read_json(path)
    pins = source.mapping(data, ())
    digest = source.string(pins["ubuntu:22.04"].get("digest"), ("ubuntu:22.04", "digest"), pattern=DIGEST)
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any, NoReturn

from packaging.requirements import Requirement
from packaging.version import Version

from .errors import BadRequest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as pip vendors it (pip is in every venv imagebuilder runs from)
    from pip._vendor import tomli as tomllib

KeyPath = tuple[str | int, ...]
MAX_TEXT = 4096  # longer than any value these files hold: a longer one is a mistake (or an attack)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class BadValue(BadRequest):
    """A value of a file the run cannot use (exit 2)."""

    template = "{file}: {where}: {why}"


def path_text(path: KeyPath) -> str:
    """("images", 0, "digest") -> "images[0].digest"; () -> "the whole file"."""
    if not path:
        return "the whole file"
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def shown(value: Any, limit: int = 60) -> str:
    """A value as a message quotes it: repr (control characters escaped), at most `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def kind(value: Any) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", type(None): "nothing (null)"}.get(type(value), type(value).__name__)


@dataclass(frozen=True)
class Source:
    """One file's values: where each key path is (its line), and checks that fail naming them."""

    file: str
    lines: Mapping[KeyPath, int] = field(default_factory=dict, repr=False)

    def line(self, path: KeyPath) -> int | None:
        """The line of `path`, else of its nearest enclosing key that has one."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return None

    def fail(self, path: KeyPath, why: str, line: int | None = None) -> NoReturn:
        line = line if line is not None else self.line(path)
        where = path_text(path) + (f" (line {line})" if line is not None else "")
        raise BadValue(file=self.file, where=where, why=why)

    def mapping(self, value: Any, path: KeyPath, what: str = "a mapping") -> Mapping[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"is {kind(value)}, not {what}")
        return value

    def sequence(self, value: Any, path: KeyPath, what: str = "a list") -> list[Any]:
        if not isinstance(value, list):
            self.fail(path, f"is {kind(value)}, not {what}")
        return value

    def string(self, value: Any, path: KeyPath, *, pattern: re.Pattern[str] | None = None,
               what: str = "a non-empty string") -> str:
        """A non-empty string without control characters, at most MAX_TEXT long, matching `pattern` whole."""
        if not isinstance(value, str):
            self.fail(path, f"is {kind(value)}, not {what}")
        if not value.strip() or len(value) > MAX_TEXT or any(c < " " and c != "\t" for c in value) \
                or (pattern is not None and not pattern.fullmatch(value)):
            self.fail(path, f"{shown(value)} is not {what}")
        return value

    def strings(self, value: Any, path: KeyPath, *, pattern: re.Pattern[str] | None = None,
                what: str = "a non-empty string") -> list[str]:
        return [self.string(item, path + (i,), pattern=pattern, what=what)
                for i, item in enumerate(self.sequence(value, path, f"a list of {what.removeprefix('a ')}s"))]

    def integer(self, value: Any, path: KeyPath, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"is {kind(value)} {shown(value)}, not a whole number from {low} to {high}")
        if not low <= value <= high:
            self.fail(path, f"{shown(value)} is not from {low} to {high}")
        return value

    def number(self, value: Any, path: KeyPath, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not low <= value <= high:
            self.fail(path, f"{shown(value)} is not a number from {low} to {high}")
        return float(value)

    def version(self, value: Any, path: KeyPath, line: int | None = None) -> Version:
        if not isinstance(value, str) or len(value) > 100:
            self.fail(path, f"{shown(value)} is not a version (e.g. 2.6.0)", line)
        try:
            return Version(value)
        except ValueError:  # InvalidVersion, or a number too long for int()
            self.fail(path, f"{shown(value)} is not a version (e.g. 2.6.0)", line)


def unusable_specifier(requirement: Requirement) -> str | None:
    """Why a requirement that parsed still cannot be compared with a version (`x==` and 5,000
    digits: packaging parses the specifier and fails in int() when it compares); None when it can."""
    for spec in requirement.specifier:
        if spec.operator == "===":
            continue  # arbitrary equality compares strings
        try:
            Version(spec.version.removesuffix(".*"))
        except ValueError:
            return f"{shown(str(spec))} names no version it can be compared with"
    return None


def read_text(path: Path) -> str:
    """The file's text (UTF-8); one that cannot be read is a BadValue, not an OSError."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise BadValue(file=str(path), where=f"the whole file (line {line})", why="is not UTF-8 text") from e
    except OSError as e:
        raise BadValue(file=str(path), where="the whole file", why=f"cannot be read ({e.strerror or e})") from e


def read_json(path: Path) -> tuple[Any, Source]:
    """The file's JSON, with each key path's line. NaN and Infinity (Python's json writes them) are read
    as floats, which every check but a number's refuses, and number() refuses as not finite."""
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadValue(file=str(path), where=f"the whole file (line {e.lineno})", why=f"is not JSON ({e.msg})") from e
    except (ValueError, RecursionError) as e:
        raise BadValue(file=str(path), where="the whole file", why=f"is not JSON ({str(e)[:80] or 'nested too deep'})") from e
    return data, Source(str(path), json_lines(text))


_WS = re.compile(r"[ \t\n\r]*")
_ATOM = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|NaN|-?Infinity")


def json_lines(text: str) -> dict[KeyPath, int]:
    """Each key path's line in `text`, valid JSON (json.loads read it); {} where it cannot tell."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    lines: dict[KeyPath, int] = {}

    def line_at(i: int) -> int:
        low, high = 0, len(starts)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if starts[middle] <= i else (low, middle)
        return low + 1

    def value(i: int, path: KeyPath) -> int:
        i = _WS.match(text, i).end()  # type: ignore[union-attr]
        lines.setdefault(path, line_at(i))
        if text[i] in "{[":
            closing, index = ("}" if text[i] == "{" else "]"), 0
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            while text[i] != closing:
                if closing == "}":
                    key, i = scanstring(text, i + 1)
                    lines.setdefault(path + (key,), line_at(i))
                    i = value(_WS.match(text, i).end() + 1, path + (key,))  # type: ignore[union-attr]
                else:
                    i = value(i, path + (index,))
                    index += 1
                i = _WS.match(text, i).end()  # type: ignore[union-attr]
                if text[i] == ",":
                    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            return i + 1
        if text[i] == '"':
            return int(scanstring(text, i + 1)[1])
        return _ATOM.match(text, i).end()  # type: ignore[union-attr]

    try:
        value(0, ())
    except (IndexError, AttributeError, RecursionError, ValueError):
        return {}
    return lines


def read_toml(path: Path) -> tuple[dict[str, Any], Source]:
    """The file's TOML, with the line of each key (and table) as found by a plain scan of the text."""
    text = read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = re.search(r"line (\d+)", str(e))
        where = f"the whole file (line {line[1]})" if line else "the whole file"
        raise BadValue(file=str(path), where=where, why=f"is not TOML ({str(e).splitlines()[0]})") from e
    except RecursionError as e:
        raise BadValue(file=str(path), where="the whole file", why="is not TOML (nested too deep)") from e
    return data, Source(str(path), toml_lines(text))


_TOML_KEY = r'(?:"[^"]*"|\'[^\']*\'|[A-Za-z0-9_-]+)'
_TOML_DOTTED = re.compile(rf"\s*({_TOML_KEY}(?:\s*\.\s*{_TOML_KEY})*)\s*")


def _toml_keys(text: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in re.findall(_TOML_KEY, text))


def toml_lines(text: str) -> dict[KeyPath, int]:
    """Where each table and key starts: `[a.b]` and `c = ...` under it give ("a", "b", "c");
    the n-th `[[x]]` gives ("x", n). A heuristic over the lines (tomllib tells no positions):
    good for the files people write, and where it is wrong, the message still names the key path."""
    lines: dict[KeyPath, int] = {}
    table: KeyPath = ()
    arrays: dict[KeyPath, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        header = re.fullmatch(r"(\[\[?)(.+?)\]\]?\s*(#.*)?", line)
        if header and "=" not in header[2]:
            table = _toml_keys(header[2])
            if header[1] == "[[":
                arrays[table] = arrays.get(table, -1) + 1
                table = table + (arrays[table],)
            lines.setdefault(table, number)
            continue
        key = _TOML_DOTTED.match(line.split("=", 1)[0]) if "=" in line else None
        if key and key.end() == len(line.split("=", 1)[0]):
            lines.setdefault(table + _toml_keys(key[1]), number)
    return lines
