"""Is the engine answering? ``GET`` its health endpoint each tick.

Exports ``kcops_engine_up`` (1 when it answered 2xx within the timeout this
tick), the age of the last good answer and the checks by outcome. This
collector does not fail when the engine does: "engine down" must read as
``up == 0``, not as absent. With an engine object it also feeds the engine's
lifecycle and exports it (``kcops_engine_state``, one-hot; ``stalled`` is the
stall watch's, which runs just before) with how long the current start has
lasted against ``engine.startup_timeout_s``, which ``KcopsEngineStartSlow`` compares.
"""

from __future__ import annotations

from kcops.agent.collectors.engine_http import EngineClient
from kcops.agent.engine import Engine, EngineState
from kcops.agent.engine import lifecycle as lc
from kcops.agent.samples import Sample, label_pairs


class HealthCollector:
    name = "engine_health"

    def __init__(self, client: EngineClient, engine: Engine | None = None) -> None:
        self.client = client
        self.engine = engine
        client.want_health = True
        self.last_ok_at: float | None = None
        self.last_error: str | None = None
        self._outcomes: dict[str, int] = {"ok": 0}

    async def stop(self) -> None:
        await self.client.stop()

    async def collect(self, now: float) -> list[Sample]:
        poll = await self.client.poll(now)
        f = poll.health
        ok = f is not None and f.ok
        outcome = "ok" if ok else (f.reason if f is not None else "none")
        self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1
        if ok:
            self.last_ok_at = now
            self.last_error = None
        else:
            self.last_error = f.error if f is not None else "no health check configured"
        out = [Sample("kcops_engine_up", (), 1.0 if ok else 0.0)]
        if self.last_ok_at is not None:
            out.append(
                Sample("kcops_engine_last_healthy_age_seconds", (), max(0.0, now - self.last_ok_at))
            )
        out += [
            Sample("kcops_engine_health_checks_total", label_pairs({"outcome": k}), float(v))
            for k, v in self._outcomes.items()
        ]
        if self.engine is not None:
            self.engine.observe(lc.Health(now, ok, "" if ok else outcome))
            out += lifecycle_samples(self.engine, now)
        return out


def lifecycle_samples(engine: Engine, now: float) -> list[Sample]:
    state = engine.state
    out = [
        Sample("kcops_engine_state", label_pairs({"state": s.value}), 1.0 if s is state else 0.0)
        for s in EngineState
    ]
    out.append(Sample("kcops_engine_startup_timeout_seconds", (), engine.startup_timeout_s))
    # The agent's own restart, until the engine is ready again, at most its startup timeout
    # (a start that overruns it is KcopsEngineStartSlow's, not inhibited).
    since = engine.lifecycle.restarting_since
    restarting = since is not None and now - since < engine.startup_timeout_s
    out.append(Sample("kcops_engine_restarting", (), 1.0 if restarting else 0.0))
    starting = engine.starting_overrun_s(now)
    if starting is not None:
        out.append(Sample("kcops_engine_starting_seconds", (), starting))
    return out
