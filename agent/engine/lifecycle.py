"""Engine lifecycle: starting -> ready -> stalled | hung | down, as a pure step.

``starting`` lasts until the engine's first healthy answer: an engine that was
never ready is loading, not down, so ``KcopsEngineDown`` counts only from
``ready`` (a slow start has ``KcopsEngineStartSlow``). After ``ready``, a health
check that times out is ``hung`` and any other failure ``down``; a :class:`Stall`
event (:mod:`kcops.agent.engine.progress`) moves a ready engine to ``stalled``
and back.

A :class:`Restarting` event marks the agent's own restart of the engine: until
the engine is ready again (``restarting_since``) the alerts the restart itself
causes are inhibited (``kcops_engine_restarting``, the rule file's
``inhibit_rules``), not paged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class EngineState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    STALLED = "stalled"
    HUNG = "hung"
    DOWN = "down"


@dataclass(frozen=True)
class Lifecycle:
    state: EngineState
    since: float  # Unix s the state began
    started_at: float  # Unix s of the start (agent start or spawn)
    restarting_since: float | None = None  # the agent's own restart, until ready again


@dataclass(frozen=True)
class Health:
    """One tick's health answer: ``ok``, or the failure's reason (timeout, connect, ...)."""

    t: float
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class Spawned:
    """The supervisor started a new engine process at ``t``."""

    t: float


@dataclass(frozen=True)
class Exited:
    """The supervised engine process exited at ``t``."""

    t: float


@dataclass(frozen=True)
class Stall:
    """The progress watch's verdict at ``t``: stalled (True) or not (False)."""

    t: float
    stalled: bool


@dataclass(frozen=True)
class Restarting:
    """The agent itself began to restart the engine at ``t`` (drain, kill, respawn)."""

    t: float


Event = Health | Spawned | Exited | Stall | Restarting


def initial(now: float) -> Lifecycle:
    return Lifecycle(EngineState.STARTING, now, now)


def step(lc: Lifecycle, ev: Event) -> Lifecycle:
    """The lifecycle after ``ev`` (pure)."""
    if isinstance(ev, Restarting):
        return replace(lc, restarting_since=ev.t)
    if isinstance(ev, Spawned):
        return Lifecycle(EngineState.STARTING, ev.t, ev.t, lc.restarting_since)
    if isinstance(ev, Exited):
        # A process that dies while loading is respawned by the supervisor (which
        # pages on a crash loop): it has not been ready, so it is not "down".
        return lc if lc.state is EngineState.STARTING else _to(lc, EngineState.DOWN, ev.t)
    if isinstance(ev, Stall):
        if ev.stalled and lc.state is EngineState.READY:
            return _to(lc, EngineState.STALLED, ev.t)
        if not ev.stalled and lc.state is EngineState.STALLED:
            return _to(lc, EngineState.READY, ev.t)
        return lc  # starting, hung or down: the health checks decide
    if ev.ok and lc.state is EngineState.STALLED:
        return lc  # answering health is what a stalled engine does: progress ends it
    if ev.ok:
        if lc.state is EngineState.READY:
            return lc  # (a restart still draining the old engine stays one)
        return replace(_to(lc, EngineState.READY, ev.t), restarting_since=None)
    if lc.state is EngineState.STARTING:
        return lc  # still loading: not down until it was ready once
    return _to(lc, EngineState.HUNG if ev.reason == "timeout" else EngineState.DOWN, ev.t)


def _to(lc: Lifecycle, state: EngineState, t: float) -> Lifecycle:
    return lc if lc.state is state else replace(lc, state=state, since=t)
