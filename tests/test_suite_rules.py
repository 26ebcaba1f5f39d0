"""Rules over the test suite itself (read from its source, no Docker): what CI's minutes go to,
and that no proof can pass without having run."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# A skip that is a condition of the host, not a tool CI installs: (file, the skip's text).
HOST_CONDITIONS = {
    ("test_bad_inputs.py", 'pytest.skip(f"needs a {python} without torch")'),  # a host whose system Python has torch
    ("test_variant_checks.py", 'pytest.skip("this torch is a CUDA build")'),  # a GPU host's torch
}


def test_every_missing_tool_goes_through_the_one_helper():
    """A test that lacks what it needs calls conftest's _unavailable (or require_module), which
    fails under IMAGEBUILDER_REQUIRE_DOCKER=1: CI, which installs every such tool, cannot pass by
    skipping. A bare pytest.skip or importorskip would skip there too."""
    found = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name in ("conftest.py", Path(__file__).name):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"pytest\.(skip|importorskip)\(", line) and (path.name, line.strip()) not in HOST_CONDITIONS:
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, "use conftest._unavailable / require_module:\n" + "\n".join(found)
