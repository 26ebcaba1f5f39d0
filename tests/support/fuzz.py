"""hypothesis: the same examples on every run, a deep run on demand (conftest loads the profile)."""

from __future__ import annotations

import os


# By default (CI, the fast run) the fuzzers are derandomized: every run tries the same examples
# (seeded from each test), so a red CI run is the code's doing and reproduces as it is.
# IMAGEBUILDER_FUZZ=deep: random examples, FUZZ_SCALE times as many (tests/test_matrix_fuzz.py
# multiplies its bounds by fuzz_examples), for hunting before a release.
FUZZ_DEEP = os.environ.get("IMAGEBUILDER_FUZZ") == "deep"
FUZZ_SCALE = 20


def fuzz_examples(n: int) -> int:
    """A fuzzer's max_examples: `n` in CI and the fast run, FUZZ_SCALE times that in a deep run."""
    return n * FUZZ_SCALE if FUZZ_DEEP else n


def hypothesis_profiles() -> None:
    from hypothesis import settings

    settings.register_profile("derandomized", derandomize=True, database=None)
    settings.register_profile("deep", derandomize=False)
    settings.load_profile("deep" if FUZZ_DEEP else "derandomized")
