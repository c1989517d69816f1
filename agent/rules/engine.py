"""Runs a rule set over a store: evaluation, the state machine, ALERTS and state series.

Shared by the agent's rules component (one :meth:`RuleEngine.evaluate` per
tick) and ``kcops alerts replay`` (one per evaluation step of a test file).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kcops.agent.events import AlertTransition
from kcops.agent.promql.budget import Limits, SharedBudgetSpent
from kcops.agent.promql.evaluator import DEFAULT_STEP_S, Evaluator
from kcops.agent.promql.gofmt import go_float
from kcops.agent.promql.model import NAME, Elem, EvalError, Labels, Vector, labels_of
from kcops.agent.rules.alerting import Instance, Result, step
from kcops.agent.rules.loader import AlertRule, RecordingRule, Rule, RuleSet
from kcops.agent.rules.templatebound import TemplateStats
from kcops.agent.rules.views import ActiveAlert, RuleInfo, StepInfo
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store

STATES = ("inactive", "pending", "firing")
FAILURES = "kcops_rule_evaluation_failures_total"
MAX_ERROR_CHARS = 500
TICK_BUDGET_SPENT = (
    "not evaluated: the rules' evaluation budget of this tick was spent by the rules "
    "before it (rules.tick_budget_s); make the costly rules cheaper"
)


def _error_text(exc: BaseException) -> str:
    """The message shown as ``lastError``: typed errors as they are, bugs with their type."""
    text = str(exc) if isinstance(exc, EvalError) else f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


@dataclass
class RuleHealth:
    """What the last evaluation of one rule did, for ``/api/v1/rules``."""

    last_eval: float | None = None
    duration_s: float = 0.0
    error: str | None = None
    errors_total: int = 0
    series: set[SeriesKey] = field(default_factory=set)


class RuleEngine:
    def __init__(
        self,
        ruleset: RuleSet,
        store: Store,
        *,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
        write_series: bool = True,
        limits: Limits | None = None,
        default_step_s: float = DEFAULT_STEP_S,
    ) -> None:
        """``default_step_s``: the step of a subquery written without one (``x[5m:]``),
        Prometheus's global evaluation interval; ``kcops alerts replay`` passes the
        test file's, as promtool does."""
        self.ruleset = ruleset
        self.store = store
        self.evaluator = Evaluator(store, default_step_s=default_step_s, limits=limits)
        self.external_labels = dict(external_labels or {})
        self.external_url = external_url
        self.write_series = write_series
        self.states: dict[str, dict[Labels, Instance]] = {r.name: {} for r in ruleset.alerts()}
        self.health: dict[str, RuleHealth] = {r.name: RuleHealth() for r in ruleset.rules}
        self.last_eval: float | None = None
        self.last_duration_s = 0.0
        # Evaluations the shared deadline cut: stopped at it, or not begun past it.
        self.cut: dict[str, int] = {"stopped": 0, "not_evaluated": 0}
        self.template_stats = TemplateStats()
        if write_series:
            store.set_meta(
                FAILURES, "counter", "Rule evaluations that failed, by rule group and rule."
            )

    # -- evaluation --------------------------------------------------------------

    def evaluate(self, now: float) -> list[AlertTransition]:
        """Evaluate every group at ``now`` (Unix s), in file order; returns the transitions.

        What ``promtool test rules`` and ``kcops alerts replay`` do at each
        step: every group, whatever its interval (the agent runs each group
        on its own grid instead, :mod:`kcops.agent.rules.group`)."""
        t0 = time.perf_counter()
        transitions: list[AlertTransition] = []
        for group in self.ruleset.groups:
            transitions += self.evaluate_group(group.rules, now, group.limit or 0)
        self.last_eval = now
        self.last_duration_s = time.perf_counter() - t0
        return transitions

    def evaluate_group(
        self, rules: Sequence[Rule], now: float, limit: int = 0, deadline: float | None = None
    ) -> list[AlertTransition]:
        """Evaluate one group's rules at ``now``, in order; returns the transitions.

        A rule whose evaluation raises anything is marked failed and the next rule
        still runs: one bad rule must never silence the others, whatever the bug is.
        ``limit`` (> 0): a rule producing more series or alerts fails, as in Prometheus.
        ``deadline`` (``time.perf_counter()`` seconds): the tick's budget shared by all
        rules; a rule reached after it fails at once (:data:`TICK_BUDGET_SPENT`).
        """
        transitions: list[AlertTransition] = []
        for rule in rules:
            h = self.health[rule.name]
            r0 = time.perf_counter()
            try:
                if deadline is not None and r0 >= deadline:
                    self.cut["not_evaluated"] += 1
                    raise EvalError(TICK_BUDGET_SPENT)
                transitions += self._evaluate_rule(rule, now, h, limit, deadline)
                h.error = None
            except Exception as exc:
                if isinstance(exc, SharedBudgetSpent):
                    self.cut["stopped"] += 1
                h.error = _error_text(exc)
                h.errors_total += 1
            h.last_eval = now
            h.duration_s = time.perf_counter() - r0
            if self.write_series:
                key = SeriesKey.of(FAILURES, {"rule_group": rule.group, "rule": rule.name})
                self.store.append(key, now, float(h.errors_total))
        return transitions

    def _evaluate_rule(
        self, rule: Rule, now: float, h: RuleHealth, limit: int, deadline: float | None = None
    ) -> list[AlertTransition]:
        # A fresh budget per rule: one expensive rule fails alone (budget.py).
        value = self.evaluator.run(rule.node, now, deadline)
        if not isinstance(value, list):
            if isinstance(rule, RecordingRule) and isinstance(value, float):
                value = [Elem((), value)]
            else:
                raise EvalError("rule expression must return an instant vector")
        if isinstance(rule, AlertRule):
            return self._alert(rule, value, now, h, limit)
        self._record(rule, value, now, h, limit)
        return []

    def _expand(self, rule: AlertRule, value: Vector) -> list[Result]:
        results: list[Result] = []
        seen: set[Labels] = set()
        for labels, v in value:
            tmpl_labels = dict(labels)
            lab = {k: val for k, val in labels if k != NAME}
            ext, url, stats = self.external_labels, self.external_url, self.template_stats
            for k, tmpl in rule.labels.items():
                lab[k] = tmpl.render(tmpl_labels, v, ext, url, stats)
            lab["alertname"] = rule.name
            final = labels_of(lab)
            if final in seen:
                raise EvalError(
                    "vector contains metrics with the same labelset after applying alert labels"
                )
            seen.add(final)
            ann = {
                k: t.render(tmpl_labels, v, ext, url, stats) for k, t in rule.annotations.items()
            }
            results.append(Result(final, v, ann))
        return results

    def _alert(
        self, rule: AlertRule, value: Vector, now: float, h: RuleHealth, limit: int
    ) -> list[AlertTransition]:
        results = self._expand(rule, value)
        new_state, transitions = step(rule, self.states[rule.name], results, now)
        if 0 < limit < len(new_state):
            # Prometheus (rules/alerting.go): the rule's alerts are all dropped, without
            # resolving them, and the evaluation fails; no ALERTS samples are written.
            self.states[rule.name] = {}
            raise EvalError(f"exceeded limit of {limit} with {len(new_state)} alerts")
        self.states[rule.name] = new_state
        if self.write_series:
            self._write_alert_series(rule, new_state, now, h)
        return transitions

    def _write_alert_series(
        self, rule: AlertRule, state: dict[Labels, Instance], now: float, h: RuleHealth
    ) -> None:
        written: set[SeriesKey] = set()
        counts = dict.fromkeys(STATES, 0)
        for inst in state.values():
            counts[inst.state] += 1
            key = SeriesKey("ALERTS", labels_of((*inst.labels, ("alertstate", inst.state))))
            self.store.append(key, now, 1.0)
            written.add(key)
        counts["inactive"] = 1 if not state else 0
        for st in STATES:
            key = SeriesKey.of("kcops_alert_state", {"alertname": rule.name, "state": st})
            self.store.append(key, now, float(counts[st]))
        for key in h.series - written:
            self.store.mark_stale(key, now)
        h.series = written

    def _record(
        self, rule: RecordingRule, value: Vector, now: float, h: RuleHealth, limit: int
    ) -> None:
        out: dict[SeriesKey, float] = {}
        for labels, v in value:
            lab = {k: val for k, val in labels if k != NAME}
            lab.update(rule.labels)
            key = SeriesKey(rule.name, labels_of(lab))
            if key in out:
                raise EvalError(
                    "vector contains metrics with the same labelset after applying rule labels"
                )
            out[key] = v
        if 0 < limit < len(out):
            # Prometheus (rules/recording.go): nothing of this evaluation is written.
            raise EvalError(f"exceeded limit of {limit} with {len(out)} series")
        for key, v in out.items():
            self.store.append(key, now, v)
        written = set(out)
        for key in h.series - written:
            self.store.mark_stale(key, now)
        h.series = written

    # -- queries ---------------------------------------------------------------

    def active(self) -> list[ActiveAlert]:
        out: list[ActiveAlert] = []
        for name, insts in self.states.items():
            for inst in insts.values():
                out.append(
                    ActiveAlert(
                        alertname=name,
                        labels=dict(inst.labels),
                        state=inst.state,
                        active_since=inst.active_at,
                        fired_at=inst.fired_at,
                        value=inst.value if math.isfinite(inst.value) else None,
                        value_string=go_float(inst.value),
                        annotations=dict(inst.annotations),
                    )
                )
        out.sort(key=lambda a: (a["alertname"], sorted(a["labels"].items())))
        return out

    def rules_info(self) -> list[RuleInfo]:
        out = []
        for r in self.ruleset.rules:
            h = self.health[r.name]
            info = RuleInfo(
                name=r.name,
                type=r.kind,
                group=r.group,
                expr=r.expr,
                last_evaluation=h.last_eval,
                evaluation_seconds=h.duration_s,
                health="unknown" if h.last_eval is None else ("err" if h.error else "ok"),
                last_error=h.error,
                errors_total=h.errors_total,
            )
            if isinstance(r, AlertRule):
                insts = self.states[r.name].values()
                info["for_s"] = r.for_s
                info["keep_firing_for_s"] = r.keep_firing_for_s
                info["labels"] = {k: t.source for k, t in r.labels.items()}
                info["annotations"] = {k: t.source for k, t in r.annotations.items()}
                info["remediation"] = [
                    StepInfo(action=s.action, params=dict(s.params), verify_s=s.verify_s)
                    for s in r.remediation
                ]
                info["state"] = _rule_state(list(insts))
                info["active"] = len(insts)
            out.append(info)
        return out


def _rule_state(insts: list[Instance]) -> str:
    if any(i.state == "firing" for i in insts):
        return "firing"
    if insts:
        return "pending"
    return "inactive"
