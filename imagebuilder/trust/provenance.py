"""Pure: where an image was built from, read out of BuildKit's SLSA provenance attestation, and
written for a project image.

publish builds with `--provenance=mode=max`: the image's index then carries an in-toto
statement with the build's materials (the base image by digest), its Dockerfile and its
frontend parameters, among them the labels the build set: the source revision, and the
matrix and lock the image was rendered from (build/_build_labels.py). `verify` prints them.

`project --sign-key` attests its own (SLSA v1, signed with the image by cosign): the base by
digest and the project's lock by hash are its resolved dependencies, what a reader needs to
say which proven torch image and which pinned packages the project image is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .labels import LOCK, MATRIX, REVISION, SOURCE

SLSA_V1 = "https://slsa.dev/provenance/v1"
"""The predicate type of `cosign attest --type slsaprovenance1`."""
PROJECT_BUILD_TYPE = "urn:imagebuilder:project:v1"
"""What built a project image: `imagebuilder project` (docs/projects.md), its parameters below."""


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


@dataclass(frozen=True)
class ProjectBuild:
    """What a project image was made of and by, for its provenance."""

    project: str
    tag: str
    base_name: str
    base_repository: str
    """The base's repository (REGISTRY/REPOSITORY), or its local name where no registry holds it."""
    base_digest: str
    lock_file: str
    lock_digest: str
    checks: tuple[str, ...]
    builder_version: str
    invocation: str
    started: str
    finished: str
    """RFC 3339 times (UTC)."""


def project_provenance(build: ProjectBuild) -> dict[str, Any]:
    """The SLSA v1 provenance predicate of a project image: its base (by digest) and its lock (by
    sha256) are the resolved dependencies."""
    return {
        "buildDefinition": {
            "buildType": PROJECT_BUILD_TYPE,
            "externalParameters": {"project": build.project, "tag": build.tag, "base": build.base_name,
                                   "checks": list(build.checks)},
            "internalParameters": {},
            "resolvedDependencies": [
                {"name": "base", "uri": f"pkg:docker/{build.base_repository}", "digest": _digest(build.base_digest)},
                {"name": "lock", "uri": build.lock_file, "digest": _digest(build.lock_digest)},
            ],
        },
        "runDetails": {
            "builder": {"id": "urn:imagebuilder:project", "version": {"imagebuilder": build.builder_version}},
            "metadata": {"invocationId": build.invocation, "startedOn": build.started, "finishedOn": build.finished},
        },
    }


def resolved_dependencies(predicate: Mapping[str, Any]) -> dict[str, str]:
    """A SLSA v1 predicate's resolved dependencies, by name: "ALGORITHM:HEX" of each."""
    found = {}
    for dependency in (predicate.get("buildDefinition") or {}).get("resolvedDependencies") or []:
        digest = dependency.get("digest") or {}
        for algorithm, value in sorted(digest.items()):
            found[str(dependency.get("name") or dependency.get("uri"))] = f"{algorithm}:{value}"
    return found


def _digest(text: str) -> dict[str, str]:
    algorithm, _, value = text.partition(":")
    if not value:
        raise ValueError(f"not a digest (ALGORITHM:HEX): {text!r}")
    return {algorithm: value}
