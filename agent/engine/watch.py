"""The stall watch: progress (:mod:`~kcops.agent.engine.progress`) and the canary, each tick.

A collector that runs after the engine's scrape and the probe receiver (it
reads what they wrote this tick from the store) and before the health
collector (which exports the lifecycle this tick decided). It exports pending
requests, how long they have been stalled, whether stall detection is watching,
and the canary's series.

The engine is judged ``stalled`` once pending work has had no progress for
``engine.stall_after_s`` and, with the canary on, a canary sent after the last
progress failed or timed out; progress ends it. The verdict goes to the
engine's lifecycle as a :class:`~kcops.agent.engine.lifecycle.Stall` event, so
``GET /api/v1/engine/ready`` answers 503 from that tick on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import JsonValue

from kcops.agent.engine import lifecycle as lc
from kcops.agent.engine import progress as pg
from kcops.agent.engine.canary import Canary
from kcops.agent.engine.lifecycle import EngineState
from kcops.agent.samples import Sample
from kcops.agent.store import Store

if TYPE_CHECKING:
    from kcops.agent.engine.engine import Engine
    from kcops.agent.engine.kinds import EngineKind

# States in which the engine should be serving, so the canary may ask it.
_ASKABLE = (EngineState.READY, EngineState.STALLED)


def kind_counters(kind: EngineKind) -> tuple[str, ...]:
    """The progress counters an engine kind's adapter maps (the heartbeat comes from the probe)."""
    mapped = {m.target + "_total" for m in kind.adapter.maps}
    return tuple(c for c in pg.COUNTERS if c in mapped)


class StallWatch:
    name = "engine_progress"

    def __init__(
        self,
        store: Store,
        engine: Engine,
        stall_after_s: float,
        canary: Canary | None = None,
        lookback_s: float = 3.0,
    ) -> None:
        self.store = store
        self.engine = engine
        self.stall_after_s = stall_after_s
        self.canary = canary
        self.lookback_s = lookback_s
        self.state = pg.ProgressState()
        self.judgement: pg.Judgement | None = None
        self.stalled = False
        deadline = canary.config.deadline_s if canary is not None else 0.0
        self._ask_after_s = max(0.0, stall_after_s - deadline)
        engine.watch = self

    async def stop(self) -> None:
        if self.canary is not None:
            await self.canary.stop()

    def _sum(self, name: str, now: float) -> float | None:
        got = [self.store.latest(k, now, self.lookback_s) for k in self.store.keys(name)]
        values = [v for _, v in (g for g in got if g is not None)]
        return sum(values) if values else None

    def read(self, now: float) -> pg.Reading:
        pending = [v for v in (self._sum(n, now) for n in pg.PENDING) if v is not None]
        counters = {n: v for n in pg.PROGRESS if (v := self._sum(n, now)) is not None}
        return pg.Reading(sum(pending) if pending else None, counters)

    def collect(self, now: float) -> list[Sample]:
        self.state, j = pg.step(self.state, self.read(now), now)
        self.judgement = j
        canary = self.canary
        askable = self.engine.state in _ASKABLE
        working = j.verdict in (pg.ProgressVerdict.PROGRESSING, pg.ProgressVerdict.STILL)
        # "Progress stopped" once it has been still for stall_after_s - deadline_s: the
        # canary's verdict is then in by the stall threshold, and a one-tick pause of a
        # busy engine sends nothing.
        still = j.verdict is pg.ProgressVerdict.STILL and (j.stalled_s or 0.0) >= self._ask_after_s
        if canary is not None and askable and working and canary.due(now, j.progress_at, still):
            canary.launch(now)
        self.stalled = askable and self._stalled(j)
        self.engine.observe(lc.Stall(now, self.stalled))
        out = [
            Sample(
                "kcops_engine_progress_watched",
                (),
                0.0 if j.verdict is pg.ProgressVerdict.UNKNOWN else 1.0,
            )
        ]
        if j.pending is not None:
            out.append(Sample("kcops_engine_pending_requests", (), j.pending))
        if j.stalled_s is not None:
            out.append(Sample("kcops_engine_stalled_seconds", (), j.stalled_s))
        if canary is not None:
            out += canary.samples()
        return out

    def _stalled(self, j: pg.Judgement) -> bool:
        if j.stalled_s is None or j.stalled_s < self.stall_after_s or j.progress_at is None:
            return False
        c = self.canary
        if c is None or not c.config.enabled:
            return True
        return c.failed_since(j.progress_at)

    def report(self) -> dict[str, object]:
        """The engine section of ``kcops status``: what the watch sees and what it lacks."""
        j = self.judgement
        out: dict[str, object] = {
            "stall_after_s": self.stall_after_s,
            "stalled": self.stalled,
        }
        kind = self.engine.kind
        if kind is not None and not kind_counters(kind):
            out["kind_lacks"] = (
                f"{kind.name} exports no progress counter (tokens or engine steps); "
                f"stall detection needs the probe's heartbeat ({pg.HEARTBEAT})"
            )
        if j is not None:
            out.update(
                verdict=j.verdict.value,
                watched=j.verdict is not pg.ProgressVerdict.UNKNOWN,
                pending=j.pending,
                stalled_s=None if j.stalled_s is None else round(j.stalled_s, 3),
                missing=list(j.missing),
            )
            if j.verdict is pg.ProgressVerdict.UNKNOWN:
                what = "pending requests" if j.pending is None else "every progress counter"
                out["why"] = f"not watched: {what} unknown; the engine does not read as healthy"
        c = self.canary
        if c is not None:
            out["canary"] = {
                "enabled": c.config.enabled,
                "in_flight": c.in_flight_since is not None,
                "last": c.last.report() if c.last is not None else None,
            }
        return out

    def evidence(self) -> dict[str, JsonValue]:
        """What a restart records: stalled for N s with M requests pending, the canary's result."""
        j = self.judgement
        out: dict[str, JsonValue] = {
            "state": self.engine.state.value,
            "stalled_s": None if j is None or j.stalled_s is None else round(j.stalled_s, 1),
            "pending": None if j is None else j.pending,
        }
        if self.canary is not None and self.canary.last is not None:
            out["canary"] = self.canary.last.report()
        return out
