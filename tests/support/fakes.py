"""Fakes shared by several test modules, each behaving as the real thing does where the tests look."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class TickingBuild:
    """A fake background build (engine.api.Running): it runs for `busy` waits, then ends with
    `rc`, noting "cache exported" in `timeline` when one is given; stopping ends it with -2."""

    busy: int
    rc: int
    timeline: list[str] | None = None
    stopped: bool = False
    ended_at = None

    def wait(self, timeout: float | None = None) -> int | None:
        if self.stopped:
            return -2
        if self.busy > 0:
            self.busy -= 1
            return None
        if self.timeline is not None:
            self.timeline.append("cache exported")
        return self.rc

    def stop(self) -> None:
        self.stopped = True
