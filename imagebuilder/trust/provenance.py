"""Pure: where an image was built from, read out of BuildKit's SLSA provenance attestation.

publish builds with `--provenance=mode=max`: the image's index then carries an in-toto
statement with the build's materials (the base image by digest), its Dockerfile and its
frontend parameters, among them the labels the build set: the source revision, and the
matrix and lock the image was rendered from (build/_build_labels.py). `verify` prints them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .labels import LOCK, MATRIX, REVISION, SOURCE


@dataclass(frozen=True)
class BuiltFrom:
    revision: str | None
    source: str | None
    matrix: str | None
    lock: str | None
    base: tuple[str, ...]
    """The materials: the base image(s) by digest, as BuildKit recorded them."""
    predicate_type: str

    def lines(self) -> list[str]:
        return [
            f"built from: revision {self.revision or 'unknown'}"
            + (f" of {self.source}" if self.source else "")
            + f", matrix {self.matrix or 'unknown'}, lock {self.lock or 'none'}",
            f"  base {', '.join(self.base) or 'unknown'} (provenance: {self.predicate_type})",
        ]

    def to_json(self) -> dict[str, Any]:
        return {"revision": self.revision, "source": self.source, "matrix": self.matrix, "lock": self.lock,
                "base": list(self.base), "predicate_type": self.predicate_type}


def built_from(predicate: Mapping[str, Any]) -> BuiltFrom:
    """The provenance predicate (SLSA v0.2 as BuildKit 0.11+ writes it) -> BuiltFrom."""
    invocation = predicate.get("invocation") or {}
    args = dict((invocation.get("parameters") or {}).get("args") or {})
    labels = {key.removeprefix("label:"): str(value) for key, value in args.items() if key.startswith("label:")}
    base = []
    for material in predicate.get("materials") or []:
        digest = (material.get("digest") or {}).get("sha256")
        base.append(f"{material.get('uri', '?')}" + (f"@sha256:{digest}" if digest else ""))
    return BuiltFrom(revision=labels.get(REVISION), source=labels.get(SOURCE), matrix=labels.get(MATRIX),
                     lock=labels.get(LOCK), base=tuple(base),
                     predicate_type=str(predicate.get("predicateType") or "SLSA provenance"))
