"""Which shell functions assign a variable they did not declare `local`.

bash's scoping is dynamic: a function's assignment to an undeclared name lands in the nearest
caller that declared it local (or in the script's globals). .ci/stargz-install.sh's `answers` set
`status`, which its caller `step` had declared `local status=0`, and so `step` failed a check that
had passed. A name assigned or declared at the script's top level is a deliberate global of that
script (.ci/setup's `pids`), which its functions may assign; `_` is the throwaway name.

A small lexer, not a parser: comments, quoted strings and here-documents are blanked, then the
words at every command position are read. It reads assignments (`n=`, `n+=`, `n[i]=`, but not a
command's `N=v cmd` environment), `local`/`declare`/`typeset`, `read`, `mapfile`/`readarray`,
`printf -v`, `getopts`, `for n in` and `(( n = ... ))`.
"""

from __future__ import annotations

import re

_HEREDOC = re.compile(r"(?<!<)<<-?(?!<)\s*(['\"]?)([A-Za-z_]\w*)\1")
_FUNCTION = re.compile(r"^[ \t]*(?:function[ \t]+)?([A-Za-z_][\w-]*)[ \t]*\(\)[ \t]*\{", re.M)
# Where a command starts: after an operator, a newline, `!`, `{ ` or a keyword.
_COMMAND_START = re.compile(r"(?:^|[;&|()!\n]|\{(?=\s)|\b(?:then|do|else|elif|if|while|until|time)\b)[ \t]*", re.M)
_ASSIGNMENT = re.compile(r"([A-Za-z_]\w*)(?:\[[^\]]*\])?\+?=")
_ARITHMETIC = re.compile(r"\(\(\s*(?:([A-Za-z_]\w*)\s*(?:(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+|--)|(?:\+\+|--)([A-Za-z_]\w*))")
_DECLARES = {"local", "declare", "typeset"}
# Options whose argument is the next word, per command (read -a's argument is a name: kept).
_OPTION_ARGS = {"read": set("dinNptu"), "mapfile": set("dnOsuCc"), "readarray": set("dnOsuCc")}


def _blank(script: str) -> str:
    """The script with comments, quoted text and here-documents' bodies removed (quotes kept)."""
    lines, out, end = script.splitlines(), [], None
    for line in lines:
        if end is not None:
            end = None if line.strip() == end else end
            continue
        out.append(line)
        if (found := _HEREDOC.search(line)) is not None:
            end = found.group(2)
    text, blanked, i = "\n".join(out).replace("\\\n", "  "), [], 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            blanked.append(text[i:i + 2])
            i += 2
        elif char in "'\"":
            close = i + 1
            while close < len(text) and text[close] != char:
                close += 2 if char == '"' and text[close] == "\\" else 1
            blanked.append(char * 2)
            i = close + 1
        elif char == "#" and (i == 0 or text[i - 1] in " \t\n;&|()"):
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
        else:
            blanked.append(char)
            i += 1
    return "".join(blanked)


def _words(text: str, i: int) -> list[str]:
    """The words of the command at i, up to its end (`;`, `&`, `|`, a newline or an unopened `)`)."""
    words, word, depth = [], "", 0
    while i < len(text):
        char = text[i]
        if depth == 0 and (char in ";&|\n)" or (char in " \t" and word)):
            if word:
                words.append(word)
                word = ""
            if char not in " \t":
                break
        elif char not in " \t" or depth:
            depth = max(0, depth + (char in "({") - (char in ")}"))
            word += char
        i += 1
    return words + [word] if word else words


def _names(command: str, args: list[str]) -> list[str]:
    """The names that `command ARGS` assigns."""
    return [name for name in _operands(command, args) if re.fullmatch(r"[A-Za-z_]\w*", name)]


def _operands(command: str, args: list[str]) -> list[str]:
    """The words of ARGS that `command` takes as names (unchecked)."""
    if command in _DECLARES:
        return [m.group(0) for a in args if not a.startswith("-") and (m := re.match(r"[A-Za-z_]\w*", a))]
    if command in ("for", "getopts"):
        return args[int(command == "getopts"):][:1]
    if command == "printf":
        return args[1:2] if args[:1] == ["-v"] else []
    if command not in _OPTION_ARGS:
        return []
    names, skip = [], False
    for arg in args:
        if re.match(r"\d*[<>]", arg):
            break
        if not skip and not arg.startswith("-"):
            names.append(arg)
        skip = not skip and arg.startswith("-") and arg[-1] in _OPTION_ARGS[command]
    return names[-1:] if command != "read" else names


def assigned(text: str) -> tuple[set[str], set[str]]:
    """(names assigned, names declared by local/declare/typeset) in blanked shell text."""
    found: set[str] = set()
    declared: set[str] = set()
    for start in _COMMAND_START.finditer(text):
        words = _words(text, start.end())
        command = next((n for n, word in enumerate(words) if not _ASSIGNMENT.match(word)), None)
        if command is None:  # assignments alone set variables; before a command, only its environment
            found.update(m.group(1) for m in map(_ASSIGNMENT.match, words) if m is not None)
        else:
            names = _names(words[command], words[command + 1:])
            (declared if words[command] in _DECLARES else found).update(names)
    found.update(a or b for a, b in _ARITHMETIC.findall(text))
    return found, declared


def undeclared(script: str) -> dict[str, list[str]]:
    """Each function of SCRIPT -> the names it assigns that are neither its locals nor globals."""
    text = _blank(script)
    functions, top, last = [], [], 0
    for match in _FUNCTION.finditer(text):
        if match.start() < last:
            continue  # a function defined inside another: checked as part of it
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        functions.append((match.group(1), text[match.end():end]))
        top.append(text[last:match.start()])
        last = end + 1
    globals_ = set().union(*assigned("\n".join(top) + "\n" + text[last:]))
    missing = {}
    for name, body in functions:
        found, declared = assigned(body)
        if names := sorted(found - declared - globals_ - {"_"}):
            missing[name] = names
    return missing
