"""The one way a test says that what it needs is missing: a skip, or in CI a failure.

CI sets IMAGEBUILDER_REQUIRE_DOCKER=1 so that a missing daemon, base image or registry
fails the run instead of skipping it: CI can never pass by skipping the real tests.
tests/test_suite_rules.py refuses a pytest.skip, skipif, xfail or importorskip anywhere else.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import NoReturn

import pytest


def _require_docker() -> bool:
    return os.environ.get("IMAGEBUILDER_REQUIRE_DOCKER") == "1"


def _unavailable(reason: str) -> NoReturn:
    """The one way a test (or a test module) says that what it needs is missing: a skip, or under
    IMAGEBUILDER_REQUIRE_DOCKER=1 (CI, whose .ci/setup --tests installs every tool the tests use: Docker,
    docker-registry, cosign, torch, gcc, jq, uv, sshd, the base images) a failure, so CI cannot
    pass by skipping. tests/test_suite_rules.py refuses a pytest.skip or importorskip elsewhere."""
    if _require_docker():
        pytest.fail(f"{reason} (IMAGEBUILDER_REQUIRE_DOCKER=1: not skipping)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, why: str) -> ModuleType:
    """`import name`, or _unavailable (a skip, a failure in CI) saying why the test needs it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        _unavailable(f"{name} is not importable ({e}): {why}")
