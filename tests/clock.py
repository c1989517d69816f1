"""A clock tests move by hand (production passes ``kcops.agent.clock.system_clock``)."""

from __future__ import annotations


class ManualClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
