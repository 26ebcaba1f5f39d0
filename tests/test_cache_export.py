"""The registry cache's export beside verify (cache_export.py): waited for with a line every
15 s, its directory removed once it has ended, stopped when asked. The real export, on the
real engine and registry, is checked in test_publish_buildkit.py."""

from __future__ import annotations

import pytest

from support.fakes import TickingBuild

from imagebuilder.build import cache_export
from imagebuilder.build.cache_export import CacheExport


def _export(busy: int, rc: int) -> tuple[CacheExport, TickingBuild, list[int]]:
    running, cleaned = TickingBuild(busy, rc), []
    return CacheExport(running, "r/imagebuilder-cache:k", None, lambda: cleaned.append(1)), running, cleaned


def test_the_wait_says_so_each_interval_and_cleans_up_once() -> None:
    exporting, _, cleaned = _export(busy=3, rc=0)
    said: list[float] = []
    assert exporting.wait(said.append) is None
    assert len(said) == 3 and all(s >= 0 for s in said)
    assert exporting.seconds is not None and cleaned == [1]
    assert exporting.wait() is None and cleaned == [1]  # ended: asked again, nothing more
    exporting.stop()
    assert cleaned == [1]


def test_a_failed_export_says_which_cache_and_where_its_log_is() -> None:
    exporting, _, cleaned = _export(busy=0, rc=1)
    failed = exporting.wait()
    assert failed is not None and "r/imagebuilder-cache:k" in failed and "exit 1" in failed
    assert cleaned == [1]


def test_stop_ends_a_running_export_and_cleans_up() -> None:
    exporting, running, cleaned = _export(busy=100, rc=0)
    exporting.stop()
    assert running.stopped and cleaned == [1] and exporting.seconds is not None
    assert exporting.wait() is not None  # it did not finish: the push uploads the layers


def test_the_interval_is_fifteen_seconds() -> None:
    assert cache_export.PROGRESS_EVERY == pytest.approx(15.0)


def test_a_failed_export_runs_once_more_and_counts_if_that_one_ends_well() -> None:
    first, second, cleaned = TickingBuild(busy=1, rc=1), TickingBuild(busy=1, rc=0), []
    again_logs = []

    def again():
        again_logs.append(1)
        return second, None

    exporting = CacheExport(first, "r/imagebuilder-cache:k", None, lambda: cleaned.append(1), again)
    said: list[float] = []
    assert exporting.wait(said.append) is None
    assert again_logs == [1] and cleaned == [1] and len(said) == 3  # a wait each, the restart's too


def test_a_second_failure_is_the_answer() -> None:
    exporting = CacheExport(TickingBuild(busy=0, rc=1), "r/imagebuilder-cache:k", None, lambda: None,
                            lambda: (TickingBuild(busy=0, rc=7), None))
    failed = exporting.wait()
    assert failed is not None and "exit 7" in failed


def test_a_second_run_that_cannot_start_leaves_the_first_failure() -> None:
    from imagebuilder.engine.errors import EngineError

    def again():
        raise EngineError("could not run docker")

    exporting = CacheExport(TickingBuild(busy=0, rc=3), "r/imagebuilder-cache:k", None, lambda: None, again)
    failed = exporting.wait()
    assert failed is not None and "exit 3" in failed and exporting.seconds is not None
