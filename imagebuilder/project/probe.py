"""What an image's venv holds, read inside the image: every distribution's name and version, and
for the torch family (torch, torchvision, torchaudio, triton, every nvidia-*) the digest of its
RECORD and whether every file RECORD names still has the hash RECORD gives it.

The same probe runs in the base and in the project image: the project image is proven only when
the family is byte-for-byte the base's (the same RECORDs, every file matching them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engine.api import Runner
from ..errors import ImageBuilderError

PROBE_TIMEOUT_S = 300
FAMILY_PREFIXES = ("nvidia-",)
FAMILY = frozenset({"torch", "torchvision", "torchaudio", "triton", "pytorch-triton"})

# Runs as `python3 -c`: the image's venv python (PATH), standard library only.
PROBE = r'''
import base64, hashlib, json, os, sys
from importlib import metadata
def family(name):
    return name in %(family)r or name.startswith(%(prefixes)r)
out = {"python": "%%d.%%d" %% sys.version_info[:2], "dists": {}, "family": {}}
for dist in metadata.distributions():
    name = dist.metadata["Name"].lower().replace("_", "-").replace(".", "-")
    out["dists"][name] = dist.version
    if not family(name):
        continue
    record = dist.read_text("RECORD") or ""
    bad = []
    for line in record.splitlines():
        path, _, rest = line.partition(",")
        algo_hash = rest.rpartition(",")[0]
        if not algo_hash:
            continue
        algo, _, want = algo_hash.partition("=")
        full = os.path.join(str(dist.locate_file("")), path)
        try:
            with open(full, "rb") as f:
                got = base64.urlsafe_b64encode(hashlib.new(algo, f.read()).digest()).rstrip(b"=").decode()
        except OSError:
            got = None
        if got != want:
            bad.append(path)
    out["family"][name] = {"version": dist.version, "record": hashlib.sha256(record.encode()).hexdigest(),
                           "bad": bad[:5], "bad_count": len(bad)}
print("IMAGEBUILDER-PROBE " + json.dumps(out, sort_keys=True))
''' % {"family": tuple(sorted(FAMILY)), "prefixes": FAMILY_PREFIXES}


class ProbeFailed(ImageBuilderError):
    template = "could not read the Python packages of {image}: {detail}"


@dataclass(frozen=True)
class Venv:
    python: str
    dists: Mapping[str, str]
    """Every installed distribution: canonical name -> version."""
    family: Mapping[str, Mapping[str, Any]]
    """The torch family's: name -> version, RECORD digest, files that differ from RECORD."""


def in_family(name: str) -> bool:
    return name in FAMILY or name.startswith(FAMILY_PREFIXES)


def probe(engine: Runner, image: str) -> Venv:
    run = engine.run(image, ["python3", "-c", PROBE], timeout=PROBE_TIMEOUT_S, environment={"PYTHONNOUSERSITE": "1"})
    line = next((x for x in run.output.splitlines() if x.startswith("IMAGEBUILDER-PROBE ")), None)
    if run.exit_code != 0 or line is None:
        tail = " | ".join(run.output.strip().splitlines()[-3:]) or f"exit {run.exit_code}"
        raise ProbeFailed(image=image, detail=tail)
    doc = json.loads(line.split(" ", 1)[1])
    return Venv(python=doc["python"], dists=doc["dists"], family=doc["family"])


def family_differences(base: Venv, project: Venv) -> list[str]:
    """Each way the project image's torch family is not the base's, one line each; [] when it is."""
    problems = []
    for name in sorted(set(base.family) | set(project.family)):
        was, now = base.family.get(name), project.family.get(name)
        if now is None:
            problems.append(f"{name} {was['version'] if was else '?'} is gone from the project image")
        elif was is None:
            problems.append(f"{name} {now['version']} was added (the base has none): it would shadow the base's stack")
        elif now["version"] != was["version"]:
            problems.append(f"{name} was replaced: base {was['version']}, project image {now['version']}")
        elif now["record"] != was["record"]:
            problems.append(f"{name} {now['version']} was reinstalled: its RECORD differs from the base's")
        elif now["bad_count"]:
            shown = ", ".join(str(p) for p in now["bad"])
            problems.append(f"{name} {now['version']}: {now['bad_count']} file(s) differ from RECORD ({shown})")
    return problems
