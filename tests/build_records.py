"""BuildKit's cache records: list them, and prune the ones added since a listing.

Shared by the tests' session fixtures (conftest) and bench/bench_publish.py: each removes the
records it added and no other, on a daemon that others use too.
"""

from __future__ import annotations

import json
import os
import subprocess


def build_cache_records(cli: str) -> dict[str, tuple[str, str]]:
    """BuildKit cache record id -> (when it was created, its type: regular, exec.cachemount, ...)."""
    done = subprocess.run([cli, "system", "df", "-v", "--format", "{{json .BuildCache}}"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not done.stdout.strip():
        return {}
    return {str(record["ID"]): (str(record["CreatedAt"]), str(record.get("CacheType", "")))
            for record in json.loads(done.stdout) or []}


def prune_records(cli: str, before: dict[str, tuple[str, str]], *, keep_cache_mounts: bool) -> None:
    """Prune the records that are not in `before` (the cache mounts too, unless kept)."""
    records = build_cache_records(cli)
    added = [(cache_id, created) for cache_id, (created, kind) in records.items()
             if cache_id not in before and not (keep_cache_mounts and kind == "exec.cachemount")]
    # One id per call (BuildKit takes one value per filter), newest first: children before parents.
    for cache_id, _created in sorted(added, key=lambda r: r[1], reverse=True):
        subprocess.run([cli, "builder", "prune", "--force", "--all", "--filter", f"id={cache_id}"],
                       env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, timeout=600)
