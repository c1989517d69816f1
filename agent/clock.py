"""Time is passed in, never read directly by logic, so tests need no sleeps."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def __call__(self) -> float:
        """Unix time in seconds."""
        ...


def system_clock() -> float:
    return time.time()
