"""The rules component: evaluates the alert table every agent tick.

Remediation reads alert states through it (an ``AlertsView``). Serves ``GET /api/v1/alerts``
(active alerts and their state) and ``GET /api/v1/rules`` (rules, last
evaluation, errors); both are open reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kcops.agent.rules.engine import RuleEngine
from kcops.agent.rules.loader import RuleSet

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext


class RulesComponent:
    name = "rules"

    def __init__(self, ctx: AgentContext, ruleset: RuleSet) -> None:
        self.ctx = ctx
        self.ruleset = ruleset
        self.engine = RuleEngine(ruleset, ctx.store)

    async def start(self) -> None:
        return None

    async def tick(self, now: float) -> None:
        with self.ctx.tracer.start_as_current_span("rules.evaluate") as span:
            transitions = self.engine.evaluate(now)
            span.set_attribute("kcops.rules", len(self.ruleset.rules))
            span.set_attribute("kcops.transitions", len(transitions))
        for tr in transitions:
            self.ctx.bus.publish(tr)

    async def stop(self) -> None:
        return None

    # -- the service other components use -----------------------------------------

    def is_firing(self, alertname: str, labels: Mapping[str, str] | None = None) -> bool:
        """True when an instance of ``alertname`` whose labels include ``labels`` is firing."""
        return self.engine.is_firing(alertname, labels)

    def active(self) -> list[dict[str, Any]]:
        """Pending and firing instances (alertname, labels, state, active_since, value, ...)."""
        return self.engine.active()

    def rule_names(self) -> list[str]:
        return [r.name for r in self.ruleset.rules]

    # -- component protocol --------------------------------------------------------

    def status(self) -> dict[str, Any]:
        errors = {n: h.error for n, h in self.engine.health.items() if h.error}
        active = self.engine.active()
        firing = sum(1 for a in active if a["state"] == "firing")
        pending = len(active) - firing
        summary = f"{len(self.ruleset.rules)} rules, {firing} firing, {pending} pending"
        if errors:
            summary += f", {len(errors)} failing"
        return {
            "healthy": not errors,
            "summary": summary,
            "source": self.ruleset.source,
            "last_evaluation": self.engine.last_eval,
            "evaluation_seconds": round(self.engine.last_duration_s, 6),
            "errors": errors,
        }

    def routes(self) -> list[web.RouteDef]:
        async def alerts(_: web.Request) -> web.Response:
            return web.json_response(
                {"alerts": self.engine.active(), "last_evaluation": self.engine.last_eval}
            )

        async def rules(_: web.Request) -> web.Response:
            return web.json_response(
                {
                    "source": self.ruleset.source,
                    "params": dict(self.ruleset.params),
                    "last_evaluation": self.engine.last_eval,
                    "evaluation_seconds": self.engine.last_duration_s,
                    "rules": self.engine.rules_info(),
                }
            )

        return [web.get("/api/v1/alerts", alerts), web.get("/api/v1/rules", rules)]
