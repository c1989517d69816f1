"""Is the engine answering? ``GET`` its health endpoint each tick.

Exports ``kcops_engine_up`` (1 when it answered 2xx within the timeout this
tick, else 0), ``kcops_engine_last_healthy_age_seconds`` (seconds since the
last good answer; absent until there was one) and
``kcops_engine_health_checks_total{outcome}``. This collector does not fail
when the engine does: "engine down" must read as ``up == 0``, not as absent.
"""

from __future__ import annotations

from kcops.agent.collectors.engine_http import EngineClient
from kcops.agent.samples import Sample, label_pairs


class HealthCollector:
    name = "engine_health"

    def __init__(self, client: EngineClient) -> None:
        self.client = client
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
        return out
