"""The session's BuildKit records and real images: pruned after every module and every released
image (the disk is shared), except a family's records while the family has users left
(policy.IMAGE_FAMILIES); an image removed right after the last test that uses it. conftest's
fixtures and hooks drive this state; the family fixtures and their users call family_build,
released_after_last_use and prune_session_build_cache.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator

import pytest
from build_records import prune_records

from .policy import FAMILY_OF


def _buildkit_cli() -> str | None:
    """A docker CLI that speaks to BuildKit's cache (the one `engine.select.decide` would pick)."""
    from imagebuilder.engine.select import docker_clis

    for cli in docker_clis():
        # A docker 23+ CLI without buildx refuses `builder prune`; the probe id matches nothing.
        done = subprocess.run([cli, "builder", "prune", "--force", "--filter", "id=imagebuilder-probe"],
                              env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, text=True,
                              timeout=60)
        if done.returncode == 0:
            return cli
    return None


# The BuildKit CLI and the records that existed before this session, once it has started.
_SESSION_CACHE: list[tuple[str, dict[str, tuple[str, str]]]] = []

# The families whose fixtures have built and whose last user has not run yet.
_OPEN_FAMILIES: set[str] = set()
# family -> the node id of the last collected test that uses one of its fixtures
_FAMILY_LAST_USERS: dict[str, str] = {}


@contextlib.contextmanager
def family_build(request: pytest.FixtureRequest) -> Iterator[None]:
    """Around a family fixture's builds (IMAGE_FAMILIES): from here until the family's last
    user has run, no prune runs (prune_session_build_cache), so its users build from its layers."""
    family = FAMILY_OF.get(request.fixturename or "")
    assert family is not None, f"{request.fixturename} is in no IMAGE_FAMILIES entry"
    _OPEN_FAMILIES.add(family)
    yield


# --- a real image is removed after the last test that uses it -----------------------------

# fixture name -> the cleanup of the image it yielded, while that has not run yet
_RELEASES: dict[str, Callable[[], None]] = {}
# fixture name -> the node id of the last collected test that uses it (filled at the first teardown)
_LAST_USERS: dict[str, str] = {}


@contextlib.contextmanager
def released_after_last_use(request: pytest.FixtureRequest, cleanup: Callable[[], None]) -> Iterator[None]:
    """Around a fixture's build and yield: `cleanup` (removing the image) runs right after the
    last test that uses the fixture, not when its scope ends; a session or module image would
    otherwise keep its GBs on the shared disk while later tests build theirs. The session's new
    BuildKit records (the image's layers) are pruned with it. Runs once, on failure too."""
    done = False

    def release() -> None:
        nonlocal done
        if done:
            return
        done = True
        try:
            cleanup()
        finally:
            prune_session_build_cache()

    name = request.fixturename
    assert name is not None, "released_after_last_use belongs in a fixture"
    _RELEASES[name] = release
    try:
        yield
    finally:
        _RELEASES.pop(name, None)
        release()


def prune_session_build_cache(*, families_too: bool = False) -> None:
    """Prune the BuildKit records this session added (its layers; the cache mounts stay), unless
    a family has users left (all the same with families_too: test_publish_buildkit's second
    engine, whose copy of torch must not share the disk with the first's).

    Not "all but the family's records": on Docker 26 (containerd store, BuildKit 0.13) any
    prune that removes a record makes the daemon forget the cache keys of every record it
    keeps; the next build of the same steps runs them all again (measured: two RUNs built,
    an unrelated record pruned by id, the same Dockerfile again: no step CACHED). The
    families' layers are GBs the disk holds until their last user (IMAGE_FAMILIES)."""
    if not _SESSION_CACHE or (_OPEN_FAMILIES and not families_too):
        return
    cli, before = _SESSION_CACHE[0]
    prune_records(cli, before, keep_cache_mounts=True)


def after_test(item: pytest.Item) -> None:
    """After each test's teardown (conftest's hook): release the images whose last user it was,
    close the families whose last user it was, and prune what is no longer held."""
    if not _LAST_USERS:
        for collected in item.session.items:
            for name in getattr(collected, "fixturenames", ()):
                _LAST_USERS[name] = collected.nodeid
                if name in FAMILY_OF:
                    _FAMILY_LAST_USERS[FAMILY_OF[name]] = collected.nodeid
    for name in [name for name in _RELEASES if _LAST_USERS.get(name) == item.nodeid]:
        _RELEASES.pop(name)()
    closed = {family for family in _OPEN_FAMILIES if _FAMILY_LAST_USERS.get(family) == item.nodeid}
    _OPEN_FAMILIES.difference_update(closed)
    if closed:
        prune_session_build_cache()
