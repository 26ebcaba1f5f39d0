"""The strace side of the start profile, pure: its flags, and its output -> the files opened.

profile.py runs the start under `strace STRACE_FLAGS`; parse_trace() reads what strace wrote,
profile_files() turns it into the profile (each image file once, where first opened), and
interpreter_of() says which interpreter the kernel loads for an executed file (no open shows it).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

MARK = "/.imagebuilder-start-mark"
"""A path the start tries to open (and cannot) where its first part ends: the trace shows the
failed open, and the files opened before it are the ones a lazy node should have first."""

STRACE_FLAGS = ("-f", "-qq", "-y", "-e", "trace=open,openat,openat2,execve,execveat", "-e", "signal=none")
"""Follow children; no attach/exit notes; decode descriptors to paths; only opens and execs."""

NOT_FILES = ("/proc", "/sys", "/dev")
"""Kernel file systems: nothing of the image's layers lives there."""

_CALL = re.compile(r"^(?:\[pid\s+(?P<bracket>\d+)\]\s+|(?P<pid>\d+)\s+)?(?P<rest>.*)$")
_RESULT = re.compile(r"\)\s+=\s+(?P<value>-?\d+)(?:<(?P<path>.*)>)?(?:\s+\w+\s+\(.*\))?$")
_STRING = r'"(?P<arg>(?:[^"\\]|\\.)*)"'
_ARGS = {
    "open": re.compile(rf"^{_STRING},\s*(?P<flags>[A-Z0-9_|]+)"),
    "openat": re.compile(rf"^[^,]*,\s*{_STRING},\s*(?P<flags>[A-Z0-9_|]+)"),
    "openat2": re.compile(rf"^[^,]*,\s*{_STRING},\s*\{{flags=(?P<flags>[A-Z0-9_|]+)"),
    "execve": re.compile(rf"^{_STRING}"),
    "execveat": re.compile(rf"^\d+(?:<(?P<dir>[^>]*)>)?,\s*{_STRING}"),
}


@dataclass(frozen=True)
class Opened:
    """One successful open or exec the trace shows."""

    path: str
    executed: bool = False
    """An execve target: the path as given (perhaps a symlink), its interpreter not shown."""



def _unescape(text: str) -> str:
    """strace's C-style quoting (\\", \\\\, \\n, \\xNN, \\NNN) undone."""
    if "\\" not in text:
        return text
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode(
        "utf-8", "replace")


def _complete_calls(lines: Iterable[str]) -> Iterator[str]:
    """Each call's whole line: `-f` splits a call another process interrupted into
    `NAME(ARGS <unfinished ...>` and, later, `<... NAME resumed>REST` on the same pid."""
    pending: dict[str, str] = {}
    for line in lines:
        match = _CALL.match(line.rstrip("\n"))
        if match is None:
            continue
        pid, rest = match["bracket"] or match["pid"] or "", match["rest"]
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
            continue
        resumed = re.match(r"^<\.\.\. \w+ resumed>\s?(?P<tail>.*)$", rest)
        if resumed is not None:
            start = pending.pop(pid, None)
            if start is None:
                continue  # the call began before strace attached
            rest = start + resumed["tail"] if resumed["tail"].startswith((")", ",")) else start + " " + resumed["tail"]
        yield rest


def parse_trace(lines: Iterable[str]) -> tuple[Opened, ...]:
    """The successful reading opens and execs of an `strace STRACE_FLAGS` output, in order.

    An open counts with the path `-y` decoded from its returned descriptor (the real file);
    a directory (O_DIRECTORY) or a write-only open does not; a failed call (`= -1 ENOENT`) does
    not. An exec counts with its path argument, as given (`-y` decodes no return value there).
    """
    found: list[Opened] = []
    for call in _complete_calls(lines):
        name, _, args = call.partition("(")
        pattern = _ARGS.get(name)
        result = _RESULT.search(call)
        matched = pattern.match(args) if pattern is not None else None
        if matched is not None and name.startswith("open") and _unescape(matched["arg"]) == MARK:
            found.append(Opened(MARK))  # where the start's first part ended (its open fails)
            continue
        if pattern is None or result is None or int(result["value"]) < 0:
            continue
        if matched is None:
            continue
        if name.startswith("execve"):
            target = _unescape(matched["arg"])
            directory = matched.groupdict().get("dir")
            if not target.startswith("/") and directory:
                target = f"{directory.rstrip('/')}/{target}"
            found.append(Opened(target, executed=True))
            continue
        flags = set(matched["flags"].split("|"))
        if "O_DIRECTORY" in flags or "O_WRONLY" in flags or result["path"] is None:
            continue
        path = _unescape(result["path"]).removesuffix(" (deleted)")
        found.append(Opened(path))
    return tuple(found)


def profile_files(opened: Iterable[Opened], resolved: Mapping[str, Sequence[str]], *,
                  directories: Collection[str] = (), excluded: Sequence[str] = ()) -> tuple[str, ...]:
    """The profile: each path once, where it was first opened. An executed path stands for
    `resolved[path]` (its real file and its interpreters' real files; the path itself where
    absent). `directories` drop, and so do paths under NOT_FILES or `excluded` (mounts that
    are no part of the image)."""
    skipped = tuple(prefix.rstrip("/") for prefix in (*NOT_FILES, *excluded))
    seen: dict[str, None] = {}
    for entry in opened:
        for path in (resolved.get(entry.path) or (entry.path,)) if entry.executed else (entry.path,):
            if path not in directories and not any(path == prefix or path.startswith(prefix + "/") for prefix in skipped):
                seen.setdefault(path, None)
    return tuple(seen)


def interpreter_of(head: bytes) -> str | None:
    """The program that the kernel loads to run a file beginning with `head`: an ELF's PT_INTERP
    (ld.so; None for a static binary), a script's #! program, None for anything else."""
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].split()
        return words[0].decode("utf-8", "replace") if words else None
    if not head.startswith(b"\x7fELF") or len(head) < 52:
        return None
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    if wide and len(head) < 64:
        return None
    if wide:
        phoff, = struct.unpack_from(order + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 54)
    else:
        phoff, = struct.unpack_from(order + "I", head, 28)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 42)
    for index in range(phnum):
        at = phoff + index * phentsize
        if at + phentsize > len(head):
            return None
        kind, = struct.unpack_from(order + "I", head, at)
        if kind != 3:  # PT_INTERP
            continue
        # p_offset, then (past p_vaddr and p_paddr) p_filesz
        offset, size = (struct.unpack_from(order + "Q16xQ", head, at + 8) if wide
                        else struct.unpack_from(order + "I8xI", head, at + 4))
        return head[offset: offset + size].split(b"\0", 1)[0].decode("utf-8", "replace") or None
    return None
