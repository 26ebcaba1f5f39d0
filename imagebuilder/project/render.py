"""Pure: a project on a base -> the project image's Dockerfile and the small context files beside
it (templates/project.Dockerfile.j2). The project folder itself is the build's main context, so
its `.dockerignore` decides what reaches the code layer.

Three layers at most over the base's: the OS packages (when the project names some), the
dependencies (keyed by the lock alone: a code change leaves the layer cached) and the code.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from .. import __version__
from ..trust import labels as L
from ..lock.lockfile import Lock
from ..resources import templates_dir
from .source import Project

CODE_DIR = "/opt/project"
LOCK_IN_IMAGE = f"{CODE_DIR}/imagebuilder-project.lock"
# The project image's own labels, beside the base's, which it keeps.
PROJECT = f"{L.PREFIX}.project"
PROJECT_BASE_DIGEST = f"{L.PREFIX}.project.base.digest"
PROJECT_BASE_NAME = f"{L.PREFIX}.project.base.name"
PROJECT_LOCK = f"{L.PREFIX}.project.lock"
PROJECT_APT = f"{L.PREFIX}.project.apt"
"""The OS packages the project installed (space-separated; empty: none): a rebase needs none."""


@dataclass(frozen=True)
class BaseFacts:
    """What the project image takes from its base."""

    name: str
    """As the user named it (a tag, or a reference)."""
    from_ref: str
    """What FROM says: the base pinned to its digest ("" for a local base)."""
    digest: str
    image_id: str
    """The local engine's id of it (what a per-run name points at, where FROM names one)."""
    user: str
    python: str
    """The venv's interpreter, as the base's labels and venv say (3.11)."""
    venv: str
    venv_owner: str
    local: bool = False
    """Only in this engine (no registry holds it): FROM names it by a per-run alias, since BuildKit
    resolves a digest reference at a registry only."""


@dataclass(frozen=True)
class Rendered:
    dockerfile: str
    files: Mapping[str, str]
    """The named context `imagebuilder-project`: the lock's install files, by name."""
    labels: Mapping[str, str]


def render_project(project: Project, base: BaseFacts, lock: Lock, lock_digest: str, *, index_args: Sequence[str],
                   ca: bool, local_alias: str = "") -> Rendered:
    """`local_alias`: the per-run name a local base (`base.local`) is FROM; the caller points it
    at `base.image_id` for the build."""
    if base.local and not local_alias:
        raise ValueError(f"{base.name} exists only in this engine: render it FROM a per-run alias (local_alias)")
    isolated = [p for p in lock.pins if p.name not in project.no_build_isolation]
    not_isolated = [p for p in lock.pins if p.name in project.no_build_isolation]
    files = {name: "".join(p.line() + "\n" for p in pins)
             for name, pins in (("requirements.lock", isolated), ("no-build-isolation.lock", not_isolated)) if pins}
    installs = [(name, name == "requirements.lock") for name in files]
    labels = {PROJECT: project.name or project.path.name, PROJECT_BASE_NAME: base.name,
              PROJECT_BASE_DIGEST: base.digest, PROJECT_LOCK: lock_digest, PROJECT_APT: " ".join(project.apt)}
    text = _template().render(
        version=__version__, project=project.name or project.path.name, base_name=base.name,
        base_from=local_alias if base.local else base.from_ref, base_digest=base.digest,
        apt=list(project.apt), installs=installs, venv_owner=base.venv_owner, python=f"{base.venv}/bin/python",
        index_args="".join(f" {shlex.quote(a)}" for a in _for_pip(index_args)), ca=ca, code_dir=CODE_DIR,
        site_packages=f"{base.venv}/lib/python{base.python}/site-packages", package=project.name,
        user=base.user or "0", start=list(project.start) if project.start else None,
        labels=sorted(labels.items()))
    return Rendered(dockerfile=text, files=files, labels=labels)


def _for_pip(index_args: Sequence[str]) -> list[str]:
    """uv's index options as pip takes them: the same URLs; uv's --index-strategy is uv's alone;
    an index over plain http (an in-house one) is one pip ignores unless it is a trusted host."""
    out, skip, trusted = [], False, []
    for arg in index_args:
        if skip:
            skip = False
        elif arg == "--index-strategy":
            skip = True
        else:
            out.append(arg)
            url = urlsplit(arg)
            host = url.netloc.rpartition("@")[2]
            if url.scheme == "http" and host and host not in trusted:
                trusted.append(host)
    return out + [a for host in trusted for a in ("--trusted-host", host)]


@lru_cache(maxsize=1)
def _template() -> Any:
    import jinja2  # here, not at the top: `imagebuilder --help` should not pay for it

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    return env.get_template("project.Dockerfile.j2")
