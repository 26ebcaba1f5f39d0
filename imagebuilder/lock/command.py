"""`imagebuilder lock`: many images -> their locks and base pins, each resolved once; drift check.

The lock file and the locks/ folder are lockfile.py's; resolving one lock through uv is
uv_compile.py's; pinning a base image is lock/base_pin.py's. Here: a selection of images, each
distinct lock resolved once (`workers` at a time), compared with the recorded locks or written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadRequest, ImageBuilderError
from ..matrix.model import Matrix
from ..matrix.resolve import BuildSpec
from .base_pin import BasePin
from .lockfile import BASES_FILE, Lock, LockError, LockSet, check_extras, load_locks, lock_name, write_locks
from .uv_compile import LockRequest, ResolutionFailed, Resolver, resolve_lock


class LocksFailed(LockError):
    template = "{failed} of {total} locks could not be resolved (above{why}){others}"


class LocksUnsatisfiable(BadRequest):
    template = ("{failed} of {total} locks cannot be satisfied (above: their requirements contradict each "
                "other){others}; drop or change the --with that conflicts")


def drift(recorded: Lock | None, fresh: Lock) -> list[str]:
    """What the index offers now that the recorded lock does not pin, one line per package."""
    if recorded is None:
        return [f"{fresh.filename}: no lock (run `imagebuilder lock`)"]
    old = {p.name: p for p in recorded.pins}
    new = {p.name: p for p in fresh.pins}
    lines = []
    for name in sorted(old.keys() | new.keys()):
        a, b = old.get(name), new.get(name)
        if a is None:
            lines.append(f"{fresh.filename}: {name} {b.version if b else ''} added")
        elif b is None:
            lines.append(f"{fresh.filename}: {name} {a.version} dropped")
        elif a.version != b.version:
            lines.append(f"{fresh.filename}: {name} {a.version} -> {b.version}")
        elif a.hashes != b.hashes:
            lines.append(f"{fresh.filename}: {name} {a.version} files changed on the index")
    return lines


@dataclass(frozen=True)
class LockPlan:
    """What `imagebuilder lock` computed for a selection of images."""

    locks: tuple[Lock, ...]
    bases: Mapping[str, BasePin]
    unpinned: tuple[str, ...]  # base images neither the engine nor a registry could pin
    failed: tuple[ResolutionFailed, ...] = ()  # sets the index cannot satisfy; the rest are locked
    extras: tuple[str, ...] = ()  # the --with asked for: without one, no set can contradict the user


def release_platforms(spec: BuildSpec) -> Sequence[str]:
    """Every platform the release has CUDA wheels for: each is locked, and built from its own lock."""
    return spec.torch.platforms


Outcome = Lock | ResolutionFailed


def lock_images(specs: Iterable[BuildSpec], matrix: Matrix, *, resolver: Resolver,
                pin: Callable[[str], BasePin | None], extras: Sequence[str] = (),
                index_url: str | None = None, extra_index_urls: Sequence[str] = (),
                platforms: Callable[[BuildSpec], Sequence[str]] = release_platforms, workers: int = 4,
                progress: Callable[[str, Outcome], None] = lambda name, outcome: None) -> LockPlan:
    """Resolve each distinct lock once and pin each distinct base image once: the runtime and
    devel sets first, then the jupyter sets under their parents' locks, `workers` resolutions
    at a time (each is mostly waiting on the index). `progress` hears of each set as it is
    done. A set the index cannot satisfy is reported, not fatal: one unsatisfiable image must
    not keep a night's refresh from the others."""
    specs = list(specs)
    for spec in specs:
        check_extras(spec, extras)
    done: dict[str, Lock] = {}
    failed: dict[str, ResolutionFailed] = {}

    def resolve_one(spec: BuildSpec, platform: str) -> tuple[str, Outcome]:
        name = lock_name(spec, extras, platform)
        parent = done.get(lock_name(spec.parent, extras, platform)) if spec.parent is not None else None
        request = LockRequest(spec, tuple(extras), index_url, tuple(extra_index_urls), platform)
        try:
            return name, resolve_lock(request, matrix, resolver, parent)
        except ResolutionFailed as e:
            return name, e

    for stage in (_distinct([s.parent or s for s in specs], extras, platforms),
                  _distinct([s for s in specs if s.parent is not None], extras, platforms)):
        # A jupyter set whose parent could not be locked cannot be locked either; it is left out.
        ready = [(s, p) for s, p in stage if s.parent is None or lock_name(s.parent, extras, p) in done]
        pool = ThreadPoolExecutor(max_workers=max(1, workers))
        futures = [pool.submit(resolve_one, spec, platform) for spec, platform in ready]
        try:
            for future in as_completed(futures):
                name, outcome = future.result()
                if isinstance(outcome, Lock):
                    done[name] = outcome
                else:
                    failed[name] = outcome
                progress(name, outcome)
        finally:
            # Not waiting: on Ctrl-C the resolver's owner stops the running ones (UvCompile's exit).
            pool.shutdown(wait=False, cancel_futures=True)
    bases: dict[str, BasePin] = {}
    unpinned: list[str] = []
    for spec in specs:
        base = (spec.parent or spec).base_image
        if base not in bases and base not in unpinned:
            found = pin(base)
            if found is None:
                unpinned.append(base)
            else:
                bases[base] = found
    return LockPlan(tuple(done[n] for n in sorted(done)), bases, tuple(unpinned),
                    tuple(failed[n] for n in sorted(failed)), tuple(extras))


def _distinct(specs: Iterable[BuildSpec], extras: Sequence[str],
              platforms: Callable[[BuildSpec], Sequence[str]]) -> list[tuple[BuildSpec, str]]:
    """One (image, platform) per lock name, in the order given."""
    seen: dict[str, tuple[BuildSpec, str]] = {}
    for spec in specs:
        for platform in platforms(spec):
            seen.setdefault(lock_name(spec, extras, platform), (spec, platform))
    return list(seen.values())


def set_names(specs: Iterable[BuildSpec], extras: Sequence[str] = (),
              platforms: Callable[[BuildSpec], Sequence[str]] = release_platforms) -> set[str]:
    """The name of every lock `lock_images` resolves for these images (their parents' included)."""
    specs = list(specs)
    return {name for s in [*specs, *(s.parent for s in specs if s.parent)] for name in
            (lock_name(s, extras, p) for p in platforms(s))}


def pypi_builds(specs: Iterable[BuildSpec]) -> list[BuildSpec]:
    """The images whose torch comes from the default index (each release's PyPI build): what
    `lock` covers unless a --cuda asks for another build, from PyTorch's own index."""
    return [s for s in specs if (s.parent or s).wheel.name == s.torch.pypi_variant]


def outcome_line(name: str, outcome: Outcome, recorded: LockSet | None = None) -> str:
    """One line per set as it is done: resolved (written later: `wrote PATH` says so), matching
    the recorded lock or drifted from it, or failed."""
    if isinstance(outcome, ResolutionFailed):
        return f"{name}: failed: {outcome.detail}"
    if recorded is None:
        return f"{name}: resolved, {len(outcome.pins)} packages"
    moved = drift(recorded.locks.get(name), outcome)
    return f"{name}: {len(moved)} drifted" if moved else f"{name}: ok"


def check(plan: LockPlan, current: LockSet) -> list[str]:
    """Drift between what the index (and the bases' registries) offer now and the locks."""
    lines = []
    for lock in plan.locks:
        lines += drift(current.locks.get(lock.name), lock)
    for image, pin in plan.bases.items():
        recorded = current.bases.get(image)
        if recorded is None or recorded.identity != pin.identity:
            was = recorded.identity if recorded else "not recorded"
            lines.append(f"{BASES_FILE}: {image} {was} -> {pin.identity}")
    return lines


def check_or_write(plan: LockPlan, directory: Path, *, check_only: bool, echo: Callable[[str], None],
                   note: Callable[[str], None], err: Callable[[str], None]) -> None:
    """`lock`'s result: with `check_only`, each drift (an error when there is any), else the
    locks written; then an error when some set could not be resolved (the others are done).
    `echo` prints the result, `note` and `err` what the user should know on stderr."""
    for image in plan.unpinned:
        note(f"base image {image}: neither the engine nor its registry gave a digest; it stays FROM by tag")
    for failure in plan.failed:
        err(f"error: {failure}")
    if check_only:
        lines = check(plan, load_locks(directory))
        for line in lines:
            echo(f"drift: {line}")
        if lines:
            raise ImageBuilderError(f"{len(lines)} locked pins differ from what the index offers; "
                                    "refresh with `imagebuilder lock` (same filters)")
        echo(f"{len(plan.locks)} locks match the index")
    else:
        for path in write_locks(directory, plan.locks, plan.bases):
            echo(f"wrote {path}")
    if plan.failed:
        unsatisfiable = all(f.unsatisfiable for f in plan.failed)
        others = f"; the other {len(plan.locks)} are {'checked' if check_only else 'written'}" if plan.locks else ""
        if unsatisfiable and plan.extras:
            raise LocksUnsatisfiable(failed=len(plan.failed), total=len(plan.failed) + len(plan.locks), others=others)
        # Without a --with, what the index lacks (torch itself, a mirror without PyTorch's wheels) is its answer.
        why = ": the index offers nothing that satisfies them; check that it serves these releases" if unsatisfiable else ""
        raise LocksFailed(failed=len(plan.failed), total=len(plan.failed) + len(plan.locks), why=why, others=others)
