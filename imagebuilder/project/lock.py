"""The project's lock: its requirements resolved under the base with uv, every package the base
holds pinned to the base's version (an exact constraint), with hashes; written into the project
folder (LOCK_FILE) and reused while neither the requirements nor the base's packages change.

A requirement the base cannot satisfy (another torch, another nvidia-*, a triton, or anything
that would move a base package) is a `ConflictsWithBase` (exit 2) before anything is built.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..errors import BadRequest, ImageBuilderError
from ..lock.lockfile import Lock, parse_lock
from ..reading import read_text
from .probe import in_family
from .source import LOCK_FILE, Project

UV_TIMEOUT_S = 600
_HEADER = "# imagebuilder project lock: do not edit; `imagebuilder project` refreshes it when its inputs change."


class ConflictsWithBase(BadRequest):
    template = "{project}: {detail}"

    def details(self) -> list[str]:
        return list(self.fields.get("more", []))


class StaleLock(BadRequest):
    template = "{path} is stale ({why}) and --locked forbids resolving; run without --locked to refresh it"


class ResolutionFailed(ImageBuilderError):
    template = "resolving {project} under the base failed: {detail}"


@dataclass(frozen=True)
class ProjectLock:
    text: str
    pins: Lock
    inputs: str
    """The hash of what it was resolved from (requirements, the base's packages, platform)."""
    reused: bool

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.text.encode()).hexdigest()


def inputs_hash(project: Project, base_dists: Mapping[str, str], python: str, platform: str,
                index_args: Sequence[str]) -> str:
    doc = "\n".join([*project.requirements, "--", *(f"{n}=={v}" for n, v in sorted(base_dists.items())), "--",
                     python, platform, *index_args])
    return hashlib.sha256(doc.encode()).hexdigest()


def check_against_base(project: Project, base_dists: Mapping[str, str], base_name: str) -> None:
    """A direct requirement the base's version does not satisfy: named with both versions, before uv."""
    for text in project.requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        have = base_dists.get(name)
        if have is None or not req.specifier:
            continue
        try:
            ok = req.specifier.contains(Version(have), prereleases=True)
        except ValueError:  # InvalidVersion, or a number too long for int()
            continue
        if not ok:
            what = "the base's torch stack" if in_family(name) else "a package the base holds"
            raise ConflictsWithBase(project=project.path, detail=(
                f"{text} conflicts with {base_name}'s {name} {have} ({what}); nothing was built"),
                more=[f"  drop or relax the requirement, or use a base image whose {name} satisfies {req.specifier}"])


def constraints_text(base_dists: Mapping[str, str]) -> str:
    return "".join(f"{name}=={version}\n" for name, version in sorted(base_dists.items()))


def resolve(project: Project, *, uv: str, base_dists: Mapping[str, str], base_name: str, python: str,
            platform: str, index_args: Sequence[str], locked: bool) -> ProjectLock:
    """The lock in the project folder when its inputs are today's; else resolved anew and written
    (refused under `locked`)."""
    inputs = inputs_hash(project, base_dists, python, platform, index_args)
    path = project.path / LOCK_FILE
    existing = read_text(path) if path.is_file() else None
    if existing is not None and f"# inputs: {inputs}\n" in existing:
        return ProjectLock(existing, parse_lock(LOCK_FILE, existing, str(path)), inputs, reused=True)
    if locked:
        why = "no lock yet" if existing is None else "the requirements or the base's packages changed"
        raise StaleLock(path=path, why=why)
    check_against_base(project, base_dists, base_name)
    with tempfile.TemporaryDirectory(prefix="imagebuilder-project-") as tmp:
        constraints = Path(tmp) / "base.txt"
        constraints.write_text(constraints_text(base_dists))
        # An sdist's metadata may need a build: its build dependencies under the base's pins too
        # (never another torch fetched to read a version).
        cmd = [uv, "pip", "compile", "--no-config", "--generate-hashes", "--no-header", "--no-annotate",
               "--no-python-downloads", "--python-version", python, "--python-platform", platform,
               "--constraint", str(constraints), "--build-constraint", str(constraints), *index_args, "-"]
        try:
            done = subprocess.run(cmd, input="\n".join(project.requirements) + "\n", capture_output=True, text=True,
                                  timeout=UV_TIMEOUT_S, env={**os.environ, "UV_NO_PROGRESS": "1"})
        except FileNotFoundError as e:
            raise ResolutionFailed(project=project.path, detail=f"uv not found at {uv}; install uv or pass --uv") from e
        except subprocess.TimeoutExpired as e:
            raise ResolutionFailed(project=project.path, detail=f"uv took over {UV_TIMEOUT_S} s") from e
    if done.returncode != 0:
        raise _failure(project, done.stderr, base_dists, base_name)
    resolved = parse_lock(LOCK_FILE, done.stdout)
    # What the base holds at the same version is installed already: the lock keeps only the rest.
    own = tuple(p for p in resolved.pins if base_dists.get(p.name) != str(p.version))
    for pin in own:
        if in_family(pin.name):  # cannot pass the constraints; a last guard all the same
            raise ConflictsWithBase(project=project.path, detail=f"resolution added {pin.name} {pin.version} beside "
                                                                  f"{base_name}'s torch stack; nothing was built")
    body = Lock(LOCK_FILE, tuple(project.requirements), platform, python, own).text()
    text = f"{_HEADER}\n# inputs: {inputs}\n# base: {base_name}\n" + _without_header(body)
    tmp_path = path.with_name(f".{LOCK_FILE}.tmp")
    tmp_path.write_text(text)
    tmp_path.replace(path)  # a reader never sees half a lock
    return ProjectLock(text, parse_lock(LOCK_FILE, text), inputs, reused=False)


def _without_header(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if not line.startswith("# imagebuilder lock"))


def _failure(project: Project, stderr: str, base_dists: Mapping[str, str], base_name: str) -> ImageBuilderError:
    lines = [line.strip(" ╰─▶│") for line in stderr.splitlines() if line.strip()]
    reason = " ".join(line for line in lines if not line.startswith(("warning:", "error:", "×", "hint:")))
    reason = re.sub(r"\s+", " ", reason).strip()
    named = sorted({n for n in base_dists if re.search(rf"\b{re.escape(n)}[=<>!~ ]", reason)}, key=len, reverse=True)
    reason = reason.removeprefix("cause: ")
    if "no solution" in stderr.lower() and named:
        name = named[0]
        because = re.search(rf"Because (\S+) depends on ({re.escape(name)}\S*)", reason)
        who = f"{because[1]} needs {because[2].rstrip(',')}" if because else f"its requirements need another {name}"
        return ConflictsWithBase(project=project.path, detail=(
            f"{who}, but {base_name} holds {name} {base_dists[name]}; nothing was built"),
            more=[f"  uv: {reason[:300]}"])
    return ResolutionFailed(project=project.path, detail=(reason or stderr.strip())[:400])
