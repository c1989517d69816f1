"""The rules component: runs each rule group on its own grid, driven by the agent's tick.

It publishes every alert transition on the event bus (remediation takes them from there).
Serves ``GET /api/v1/alerts``
(active alerts and their state) and ``GET /api/v1/rules`` (groups, rules, last
evaluation, errors); both are open reads. Alert ``for`` state is kept in the
state dir and restored after a restart (:mod:`kcops.agent.rules.forstate`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aiohttp import web

from kcops.agent.atomicfile import Writer
from kcops.agent.rules.engine import RuleEngine
from kcops.agent.rules.forstate import FILE_NAME, ForStateKeeper
from kcops.agent.rules.group import Group, build_groups
from kcops.agent.rules.inhibit import Inhibitor
from kcops.agent.rules.loader import RuleSet
from kcops.agent.rules.templatebound import MAX_OUTPUT_BYTES
from kcops.agent.rules.views import ActiveAlert, GroupInfo
from kcops.agent.samples import SeriesKey, label_pairs

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext

# Evaluations of a group before its alerts' `for` state is restored: Prometheus waits for
# the second, so recording rules and the data they read have caught up.
RESTORE_AFTER_EVALUATIONS = 2
GROUP_METRICS = (
    ("kcops_rule_group_interval_seconds", "gauge", "The interval of a rule group."),
    (
        "kcops_rule_group_last_evaluation_timestamp_seconds",
        "gauge",
        "The timestamp (its slot on the group's grid) of the last rule group evaluation.",
    ),
    (
        "kcops_rule_group_iterations_total",
        "counter",
        "Scheduled rule group evaluations, whether executed or missed.",
    ),
    (
        "kcops_rule_group_iterations_missed_total",
        "counter",
        "Rule group evaluations missed because a tick came late.",
    ),
)


class RulesComponent:
    name = "rules"

    def __init__(self, ctx: AgentContext, ruleset: RuleSet) -> None:
        self.ctx = ctx
        self.ruleset = ruleset
        self.engine = RuleEngine(ruleset, ctx.store)
        self.inhibitor = Inhibitor(ruleset.inhibit_rules)
        self.groups: list[Group] = build_groups(
            ruleset.groups, ruleset.source, ctx.config.agent.tick_s
        )
        section = ctx.config.rules
        self.for_state = ForStateKeeper(
            ctx.state_dir / FILE_NAME,
            self.engine,
            section.for_grace_period_s,
            section.for_outage_tolerance_s,
        )
        self._evaluations: dict[str, int] = {g.name: 0 for g in self.groups}
        self._durations: dict[str, float] = {g.name: 0.0 for g in self.groups}
        self._first = 0  # the group a tick starts with: the first one a spent budget left
        self._writer = Writer("alerts-for-state")
        for name, kind, help_text in GROUP_METRICS:
            ctx.store.set_meta(name, kind, help_text)

    async def start(self) -> None:
        return None

    async def tick(self, now: float) -> None:
        with self.ctx.tracer.start_as_current_span("rules.evaluate") as span:
            transitions = []
            t0 = time.perf_counter()
            deadline = t0 + self.ctx.config.rules.tick_budget_s
            evaluated = 0
            n = len(self.groups)
            first = self._first
            for i in range(n):
                if time.perf_counter() >= deadline:
                    # The tick's budget is spent: the rest stay due, and go first next tick.
                    self._first = (first + i) % n
                    break
                g = self.groups[(first + i) % n]
                slot = g.due(now)
                if slot is None:
                    continue
                evaluated += 1
                g0 = time.perf_counter()
                transitions += self.engine.evaluate_group(g.rules, slot, g.limit, deadline)
                self._durations[g.name] = time.perf_counter() - g0
                self._evaluations[g.name] += 1
                if not g.restored and self._evaluations[g.name] >= RESTORE_AFTER_EVALUATIONS:
                    self.for_state.restore(g, now)
                self.for_state.record(g, slot)
                self._write_group_series(g, slot)
            if evaluated:
                self.engine.last_eval = now
                self.engine.last_duration_s = time.perf_counter() - t0
            span.set_attribute("kcops.rules", len(self.ruleset.rules))
            span.set_attribute("kcops.groups", evaluated)
            span.set_attribute("kcops.transitions", len(transitions))
        firing = [(a["alertname"], label_pairs(a["labels"])) for a in self.engine.active()
                  if a["state"] == "firing"]  # fmt: skip
        for tr in self.inhibitor.apply(transitions, firing, now):
            self.ctx.bus.publish(tr)
        self._write_bound_series(now)
        if evaluated:
            await self._save()

    async def stop(self) -> None:
        await self._save()
        self._writer.close()

    async def _save(self) -> None:
        """The alerts' ``for`` state, written on its writer thread (never on the loop)."""
        payload = self.for_state.payload()
        if payload is not None:
            await self._writer.run(lambda: self.for_state.write(payload))

    def _write_group_series(self, g: Group, slot: float) -> None:
        labels = {"rule_group": g.name}
        store = self.ctx.store
        values = (g.interval_s, slot, float(g.iterations), float(g.missed))
        for (name, _, _), v in zip(GROUP_METRICS, values, strict=True):
            store.append(SeriesKey.of(name, labels), slot, v)

    def _write_bound_series(self, now: float) -> None:
        """The tick budget's cuts and the template bound (issue 24), catalogued in signals.py."""
        store, engine = self.ctx.store, self.engine
        for outcome, n in engine.cut.items():
            key = SeriesKey.of("kcops_rule_evaluations_cut_total", {"outcome": outcome})
            store.append(key, now, float(n))
        stats = engine.template_stats
        for name, v in (
            ("kcops_template_output_max_bytes", MAX_OUTPUT_BYTES),
            ("kcops_template_truncated_total", stats.truncated),
            ("kcops_template_work_exceeded_total", stats.over_work),
        ):
            store.append(SeriesKey.of(name, {}), now, float(v))

    # -- what the routes and the status show ---------------------------------------

    def active(self) -> list[ActiveAlert]:
        """Pending and firing instances, an inhibited one saying by which alert."""
        out = self.engine.active()
        for a in out:
            by = self.inhibitor.inhibited_by(a["alertname"], a["labels"])
            if by is not None:
                a["inhibited_by"] = by
        return out

    def groups_info(self) -> list[GroupInfo]:
        return [
            GroupInfo(
                name=g.name,
                interval_s=g.interval_s,
                on_tick=g.on_tick,
                offset_s=g.offset_s,
                limit=g.limit,
                rules=[r.name for r in g.rules],
                last_evaluation=g.last_slot if self._evaluations[g.name] else None,
                evaluation_seconds=self._durations[g.name],
                iterations_total=g.iterations,
                iterations_missed_total=g.missed,
                restored=g.restored,
            )
            for g in self.groups
        ]

    # -- component protocol --------------------------------------------------------

    def status(self) -> dict[str, object]:
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
            "for_state_restored": self.for_state.restored_total,
        }

    def routes(self) -> list[web.RouteDef]:
        async def alerts(_: web.Request) -> web.Response:
            return web.json_response(
                {"alerts": self.active(), "last_evaluation": self.engine.last_eval}
            )

        async def rules(_: web.Request) -> web.Response:
            return web.json_response(
                {
                    "source": self.ruleset.source,
                    "params": dict(self.ruleset.params),
                    "last_evaluation": self.engine.last_eval,
                    "evaluation_seconds": self.engine.last_duration_s,
                    "groups": self.groups_info(),
                    "rules": self.engine.rules_info(),
                }
            )

        return [web.get("/api/v1/alerts", alerts), web.get("/api/v1/rules", rules)]
