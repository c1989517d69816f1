"""Is the engine making progress on the work it holds? A pure step per tick.

An engine that answers ``/health`` and ``/metrics`` may still serve nothing
(vLLM's API server up, its EngineCore stopped), and latency alerts go quiet
exactly then. Progress is read from counters instead: tokens generated, prompt
tokens taken in, engine steps, and the probe's attention calls (the in-engine
heartbeat, which moves inside a long prefill). Work pending is running +
waiting requests.

:func:`step` turns one tick's :class:`Reading` into a :class:`Judgement`:
``stalled_s`` is how long pending work has seen no counter move; None while the
engine is idle or what it needs is unknown (an engine kind that lacks the
counters is not watched, never reported healthy). Any counter moving resets the
clock, and a healthy engine moves one at least once per step, so the stall
threshold only has to exceed one step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

PENDING = ("kcops_requests_running", "kcops_requests_waiting")
# Progress counters an engine kind maps from its /metrics, then the probe's heartbeat.
COUNTERS = (
    "kcops_generation_tokens_total",
    "kcops_prompt_tokens_total",
    "kcops_engine_iterations_total",
)
HEARTBEAT = "kcops_attention_calls_total"
PROGRESS = (*COUNTERS, HEARTBEAT)


class ProgressVerdict(StrEnum):
    UNKNOWN = "unknown"  # pending work or every progress counter is not known
    IDLE = "idle"  # nothing pending
    PROGRESSING = "progressing"  # a counter moved this tick
    STILL = "still"  # work pending, no counter moved this tick


@dataclass(frozen=True)
class Reading:
    """One tick: pending requests (None: unknown) and each known counter's value."""

    pending: float | None
    counters: Mapping[str, float]


@dataclass(frozen=True)
class ProgressState:
    last: tuple[tuple[str, float], ...] = ()  # the counters of the previous tick
    progress_at: float | None = None  # last tick a counter moved, or the engine was idle


@dataclass(frozen=True)
class Judgement:
    verdict: ProgressVerdict
    stalled_s: float | None  # None: idle or unknown (the series is absent)
    pending: float | None
    progress_at: float | None  # when progress was last seen (the stall began after it)
    missing: tuple[str, ...]  # progress counters not on the page this tick


def step(state: ProgressState, reading: Reading, now: float) -> tuple[ProgressState, Judgement]:
    """The state after ``reading`` at ``now``, and the tick's judgement (pure)."""
    counters = tuple(sorted((k, v) for k, v in reading.counters.items() if k in PROGRESS))
    missing = tuple(name for name in PROGRESS if name not in reading.counters)
    if reading.pending is None or not counters:
        return ProgressState(counters, None), Judgement(
            ProgressVerdict.UNKNOWN, None, reading.pending, None, missing
        )
    if reading.pending <= 0:
        # The clock of the next stall starts when work arrives, not at the last token.
        return ProgressState(counters, now), Judgement(
            ProgressVerdict.IDLE, None, 0.0, now, missing
        )
    # A counter that appears, disappears, grows or resets (an engine restart) moved.
    if state.progress_at is None or counters != state.last:
        return ProgressState(counters, now), Judgement(
            ProgressVerdict.PROGRESSING, 0.0, reading.pending, now, missing
        )
    stalled = max(0.0, now - state.progress_at)
    return ProgressState(counters, state.progress_at), Judgement(
        ProgressVerdict.STILL, stalled, reading.pending, state.progress_at, missing
    )
