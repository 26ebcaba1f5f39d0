"""The start profile of an image: the files its start reads, in the order it first opens them.

`publish --compression estargz` writes these files first in each layer, then the prefetch
landmark, so a node that pulls the image lazily (the stargz snapshotter) fetches them in one
range request instead of one request per file as `import torch` faults them in. The start that
matters is TORCH_START: `import torch` and a first `torch.compile`, whose Inductor C++ compile
spawns the image's C++ compiler (its reads count too).

How it is recorded: the image runs once, detached, as its own user (or a given one), with no
network and no entrypoint. Its command first stops itself (SIGSTOP; docker's --init makes it a
child of tini, because a namespace's PID 1 ignores a SIGSTOP it sends itself); strace attaches
FROM THE HOST (the image has no strace, and a host binary would not run in any image) to the
stopped process, and only then is it continued, so nothing it opens is missed. `-y` has strace
print each returned descriptor's path as /proc/PID/fd shows it from the host: the container's
path of the real file, with its symlinks resolved (tests/test_estargz_profile.py checks this).

What strace cannot show: the kernel opens an executed file and its ELF interpreter (ld.so) or
`#!` interpreter without an open call, and execve's argument may be a symlink (/bin/sh ->
dash). After the run, the first bytes of each executed file are read from the exited container
(`docker cp -L`) to find its interpreter, and one more container of the image resolves those
paths with `readlink -f`. So an executed file is resolved against the image, not the run's
writable layer: a binary the start itself wrote and ran is not resolved (it is no image file).

Only a local daemon works: strace needs the container's process on this machine.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ImageBuilderError
from .pages import REPORT, chunk_map, parse_report
from .residency import CHUNK, drop, reads
from .trace import MARK, STRACE_FLAGS, Opened, interpreter_of, parse_trace, profile_files

PREFETCH_SHARE = 0.5

_HEAD_BYTES = 64 * 1024
"""Enough of an executable to hold its program headers and PT_INTERP, or its #! line."""

TORCH_START = ("python3", "-c", "import torch\ntry:\n    open(" + repr(MARK) + ")\nexcept OSError:\n    pass\n"
               + REPORT + "f = torch.compile(lambda x: (x.sin() + 1).sum())\nf(torch.ones(64))")
"""The start a GPU image's users wait for: import torch, the MARK, the pages the import touched
(pages.py), then a first torch.compile on the CPU (Inductor's C++ codegen and the compiler it
spawns). `python3` on the image's PATH, as verify's probes run it (the image's venv comes first there)."""

class ProfileError(ImageBuilderError):
    """Recording an image's start profile failed."""


class ProfileUnavailable(ProfileError):
    template = "cannot record the start profile of {ref}: {reason}"


class StartTimedOut(ProfileError):
    template = ("the start command of {ref} ({command}) did not end within {timeout:.0f} s under strace; "
                "the container was removed; give --start-command a start that ends by itself within that time "
                "(a server's start: one that exits once it is up), or a longer --start-timeout")


class StartFailed(ProfileError):
    template = ("the start command of {ref} ({command}) exited with {exit_code}, so its profile is not the "
                "image's start; fix the image or the command. It said: {tail}")


@dataclass(frozen=True)
class StartProfile:
    files: tuple[str, ...]
    """The image's files the start read, in first-open order (container paths, symlinks resolved)."""
    command: tuple[str, ...]
    user: str
    """The user it ran as: the image's (its Config.User, "" is root) or the one given."""
    seconds: float
    """The traced run's wall time, from the first instruction to the exit (strace slows opens)."""
    reads: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Each file's (size, bytes of the chunks the start read of it) (residency.py); a file not
    measured is missing."""
    first: int | None = None
    """How many of `files` the start opened before its MARK (TORCH_START: the import); None: it
    opened no MARK, all of them count."""
    pages: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """The byte ranges of each mapped file that the start reported touched (pages.py); {}: none reported."""

    def prefetched(self, whole: float = PREFETCH_SHARE, small: int = CHUNK, large: int = 8 * CHUNK) -> tuple[str, ...]:
        """The files worth fetching whole, in one read, before the start: of those opened before
        the MARK, the ones of at most `small` bytes (a lazy node's first read of one fetches its
        one chunk anyway), and the ones up to `large` of which the start read at least `whole`
        (chunks); unmeasured ones too. A library of 500 MB of which the import maps a few MB, and
        what the compile after the MARK opens, are left to on-demand reads and the background
        fetch. (The page cache over-counts what was read: the kernel reads ahead, up to the
        device's read_ahead_kb, 8 MB on the benchmark's host; hence the cap.)"""
        opened = self.files if self.first is None else self.files[:self.first]
        return tuple(path for path in opened
                     if path not in self.reads or self.reads[path][0] <= small
                     or (self.reads[path][0] <= large and self.reads[path][1] >= whole * self.reads[path][0]))

    def copied(self, chunk: int = CHUNK) -> dict[str, frozenset[int]]:
        """The chunks worth copying before the landmark (zstd:chunked): of the files opened before
        the MARK and not prefetched whole, the chunks whose pages the start reported touching."""
        opened = self.files if self.first is None else self.files[:self.first]
        whole = set(self.prefetched())
        return chunk_map(self.pages, (path for path in opened if path not in whole), chunk)

    def to_json(self) -> dict[str, Any]:
        return {"files": list(self.files), "command": list(self.command), "user": self.user,
                "seconds": round(self.seconds, 3), "reads": {path: list(read) for path, read in self.reads.items()},
                "before_mark": self.first, "prefetched": len(self.prefetched()),
                "pages": {path: [list(r) for r in ranges] for path, ranges in self.pages.items()}}


# --- I/O: the traced run ------------------------------------------------------------------


def _docker(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ProfileError(f"`docker {args[0]}` did not answer within {timeout:.0f} s") from e
    if check and done.returncode != 0:
        raise ProfileError(f"`docker {' '.join(args[:2])}` failed: {' '.join(done.stderr.split())[-300:]}")
    return done


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, T, ...), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _stopped_child(init: int, deadline: float) -> int:
    """The child of the container's init (tini) once it has stopped itself."""
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        except OSError:
            children = []
        if children and _state(int(children[0])) == "T":
            return int(children[0])
        time.sleep(0.02)
    raise TimeoutError


def _traced(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return re.search(r"^TracerPid:\s*[1-9]", status, re.M) is not None


def _wait(name: str, seconds: float) -> int | None:
    """The container's exit code once it ends; None if it has not within `seconds`."""
    try:
        done = subprocess.run(["docker", "wait", name], capture_output=True, text=True, timeout=max(1.0, seconds))
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise ProfileError(f"`docker wait {name}` failed: {' '.join(done.stderr.split())[-300:]}")
    return int(done.stdout.strip())


def _stop(tracer: subprocess.Popen[str], *, ended: bool) -> None:
    """strace ends by itself when the last traced process has `ended` (after writing the trace
    out); it is stopped at once otherwise, or if it has not ended within 10 s."""
    try:
        tracer.wait(timeout=10 if ended else 0.01)
    except subprocess.TimeoutExpired:
        tracer.terminate()
        tracer.wait(timeout=30)


@contextmanager
def _container(name: str) -> Iterator[None]:
    """Removes the container `name` however the block ends (Ctrl-C included)."""
    try:
        yield
    finally:
        _docker("rm", "-f", name, check=False)


def _head(container: str, path: str) -> bytes:
    """The first _HEAD_BYTES of `path` (symlinks followed) in a container, running or not."""
    with subprocess.Popen(["docker", "cp", "-L", f"{container}:{path}", "-"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as copy:
        assert copy.stdout is not None
        data = copy.stdout.read(_HEAD_BYTES + 4096)
        copy.kill()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
            member = tar.next()
            extracted = tar.extractfile(member) if member is not None else None
            return extracted.read(min(member.size, _HEAD_BYTES)) if extracted and member else b""
    except (tarfile.TarError, OSError):
        return b""


_ASK = """while IFS= read -r line; do
  path=${line#? }
  case $line in
    x*) readlink -f -- "$path" || echo "$path" ;;
    *) if [ -d "$path" ]; then echo d; else echo -; fi ;;
  esac
done"""
"""Answers, a line per question: `x PATH` -> the real path; `f PATH` -> d for a directory, else -.
[ is sh's builtin: thousands of files cost no process each."""


@dataclass(frozen=True)
class ImageAnswers:
    resolved: dict[str, list[str]]
    """Each executed path -> its real path, then its interpreters' real paths."""
    directories: frozenset[str]
    """Opened paths that are directories in the image (opened without O_DIRECTORY: glibc's locale lookup)."""


def _ask_image(ref: str, exited: str, opened: Sequence[Opened], user: str, timeout: float) -> ImageAnswers:
    """Executed paths resolved, with their interpreters (read from the exited container `exited`),
    and the directories among the opened paths: one container of `ref` answers all of it."""
    chains: dict[str, list[str]] = {}
    for target in dict.fromkeys(entry.path for entry in opened if entry.executed):
        chain = [target]
        while len(chain) < 4:
            interpreter = interpreter_of(_head(exited, chain[-1]))
            if interpreter is None or interpreter in chain:
                break
            chain.append(interpreter)
        chains[target] = chain
    executed = list(dict.fromkeys(path for chain in chains.values() for path in chain))
    files = list(dict.fromkeys(entry.path for entry in opened if not entry.executed))
    questions = [f"x {path}" for path in executed] + [f"f {path}" for path in files if "\n" not in path]
    name = f"imagebuilder-profile-ask-{uuid.uuid4().hex[:12]}"
    with _container(name):
        try:
            done = subprocess.run(["docker", "run", "-i", "--name", name, "--entrypoint", "", "--network", "none",
                                   "--user", user or "0", ref, "sh", "-c", _ASK], input="\n".join(questions) + "\n",
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise ProfileError(f"resolving the profile's paths in {ref} took over {timeout:.0f} s") from e
    answers = done.stdout.splitlines()
    if done.returncode != 0 or len(answers) != len(questions):
        raise ProfileError(f"resolving the profile's paths in {ref} failed: {' '.join(done.stderr.split())[-300:]}")
    real = dict(zip(executed, answers))
    return ImageAnswers(resolved={target: [real[path] for path in chain] for target, chain in chains.items()},
                        directories=frozenset(path for question, answer in zip(questions[len(executed):],
                                                                               answers[len(executed):])
                                              if answer == "d" for path in (question[2:],)))


def start_profile(ref: str, command: Sequence[str] = TORCH_START, *, user: str | None = None,
                  timeout: float = 600, env: Mapping[str, str] | None = None) -> StartProfile:
    """Run `command` in a container of `ref` under strace (attached from this host) and return the
    files it read, in first-open order. Raises StartFailed when the command fails, StartTimedOut
    after `timeout` s, ProfileUnavailable without strace or a local daemon. The container (and
    the one that resolves executed paths) is removed in every case."""
    strace = shutil.which("strace")
    if strace is None:
        raise ProfileUnavailable(ref=ref, reason="strace is not installed on this host (apt-get install strace)")
    inspected = _docker("image", "inspect", "-f", "{{.Config.User}}", ref, check=False)
    if inspected.returncode != 0:
        raise ProfileUnavailable(ref=ref, reason=f"no such local image ({' '.join(inspected.stderr.split())[-200:]})")
    user = inspected.stdout.strip() if user is None else user
    name = f"imagebuilder-profile-{uuid.uuid4().hex[:12]}"
    deadline = time.monotonic() + timeout
    with _container(name), tempfile.TemporaryDirectory(prefix="imagebuilder-profile-") as scratch:
        environment = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
        _docker("run", "-d", "--init", "--name", name, "--entrypoint", "", "--network", "none",
                *(["--user", user] if user else []), *environment, ref,
                "sh", "-c", 'kill -STOP $$; exec "$@"', "sh", *command)
        init = int(_docker("inspect", "-f", "{{.State.Pid}}", name).stdout.strip() or 0)
        if init <= 0 or not Path(f"/proc/{init}").exists():
            raise ProfileUnavailable(ref=ref, reason="the container's process is not on this machine: "
                                                     "a start profile needs a local Docker daemon")
        try:
            pid = _stopped_child(init, min(deadline, time.monotonic() + 30))
        except TimeoutError:
            raise ProfileUnavailable(ref=ref, reason="its start command did not stop itself within 30 s "
                                                     "(does the image have /bin/sh?)") from None
        drop(Path(f"/proc/{pid}/root"))  # what the start reads is what it brings into the page cache
        trace = Path(scratch) / "trace"
        tracer = subprocess.Popen([strace, *STRACE_FLAGS, "-o", str(trace), "-p", str(pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        exit_code: int | None = None
        try:
            while not _traced(pid):
                if tracer.poll() is not None or time.monotonic() > deadline:
                    raise ProfileUnavailable(ref=ref, reason=f"strace could not attach: {tracer.communicate()[1][-300:]}")
                time.sleep(0.01)
            started = time.monotonic()
            os.kill(pid, signal.SIGCONT)
            exit_code = _wait(name, deadline - time.monotonic())
            if exit_code is None:
                raise StartTimedOut(ref=ref, command=" ".join(command), timeout=timeout)
            seconds = time.monotonic() - started
        finally:
            _stop(tracer, ended=exit_code is not None)
        if exit_code != 0:
            logs = _docker("logs", "--tail", "20", name, check=False)
            tail = " ".join((logs.stdout + logs.stderr).split())[-500:] or "nothing"
            raise StartFailed(ref=ref, command=" ".join(command), exit_code=exit_code, tail=tail)
        opened = parse_trace(trace.read_text(errors="replace").splitlines())
        pages = parse_report(_docker("logs", name, check=False).stdout)
        answers = _ask_image(ref, name, opened, user, max(10.0, deadline - time.monotonic()))
    marked = profile_files(opened, answers.resolved, directories=answers.directories)
    first = marked.index(MARK) if MARK in marked else None
    files = tuple(path for path in marked if path != MARK)
    return StartProfile(files, tuple(command), user, seconds, _measure(ref, files, user, deadline), first, pages)


def _measure(ref: str, files: Sequence[str], user: str, deadline: float) -> Mapping[str, tuple[int, int]]:
    """residency.reads() of `files`, through the root of a stopped container of `ref`."""
    name = f"imagebuilder-profile-read-{uuid.uuid4().hex[:12]}"
    with _container(name):
        _docker("run", "-d", "--init", "--name", name, "--entrypoint", "", "--network", "none",
                *(["--user", user] if user else []), ref, "sh", "-c", "kill -STOP $$")
        init = int(_docker("inspect", "-f", "{{.State.Pid}}", name).stdout.strip() or 0)
        try:
            pid = _stopped_child(init, min(deadline, time.monotonic() + 30))
        except TimeoutError:
            return {}
        return reads(Path(f"/proc/{pid}/root"), files)
