"""The image variants as plain data: adding one is one entry (as docker-stacks keeps its image tree).

Every place that treats variants differently reads it here, never by comparing names:
resolve.py (the base image and where nvcc comes from), image_contents.py, render.py and the
Dockerfile template (OS packages, SSH, user, CMD, CUDA_HOME), lockfile.py (the toolchain's packages),
tags.py (the `latest` alias). The smoke tests run inside images without imagebuilder, so
smoke_tests/checks keeps its own table of variant checks; tests/test_variant_checks.py
holds it equal to `checks` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Variant:
    name: str
    parent: str | None = None
    """Built FROM this variant's image, plus JupyterLab's layer: every parent layer is shared."""
    base: Literal["runtime", "devel"] = "runtime"
    """Which of NVIDIA's images it starts FROM; devel: CUDA's compiler (nvcc) and headers."""
    root: bool = False
    """Runs as root (a workbench: people install into it); else the unprivileged user."""
    cmd: tuple[str, ...] = ("python3",)
    packages: tuple[str, ...] = ()
    """OS packages beyond those every image has."""
    ssh: bool = False
    """An SSH server (`ssh-server` as the command starts it): the images people work in."""
    checks: tuple[str, ...] = ()
    """The smoke checks of its promise, beyond those every image gets (its parent's too)."""
    latest: str = ""
    """The alias of the newest release's image: `latest-{name}` unless given."""

    @property
    def toolchain(self) -> bool:
        """nvcc, ninja and CUDA_HOME: torch.utils.cpp_extension builds extensions."""
        return self.base == "devel"

    @property
    def latest_tag(self) -> str:
        return self.latest or f"latest-{self.name}"


REGISTRY: dict[str, Variant] = {v.name: v for v in (
    Variant("runtime", latest="latest"),
    Variant("devel", base="devel", root=True, cmd=("/bin/bash",), packages=("git", "make"), ssh=True,
            checks=("devel",)),
    Variant("jupyter", parent="runtime", checks=("jupyter",)),
    Variant("devel-jupyter", parent="devel", checks=("jupyter",)),
)}

VARIANTS: tuple[str, ...] = tuple(REGISTRY)
JUPYTER_PARENTS: dict[str, str] = {v.name: v.parent for v in REGISTRY.values() if v.parent is not None}


def variant(name: str) -> Variant:
    """The registry's entry (names are validated where they enter: matrix.yaml, resolve)."""
    return REGISTRY[name]


def own(name: str) -> Variant:
    """The entry whose image layers a variant is: a jupyter variant is its parent's image
    plus JupyterLab, so it has its parent's base, toolchain, user and packages."""
    entry = REGISTRY[name]
    return REGISTRY[entry.parent] if entry.parent is not None else entry


def checks_of(name: str) -> tuple[str, ...]:
    """The variant's own checks and its parent's (devel-jupyter: devel's and jupyter's)."""
    entry = REGISTRY[name]
    inherited = checks_of(entry.parent) if entry.parent is not None else ()
    return tuple(dict.fromkeys((*inherited, *entry.checks)))
