"""The alert state machine of one rule: a pure, time-driven step.

``step(rule, state, results, now) -> (state, transitions)`` follows
Prometheus's rules/alerting.go: an instance (rule + label set) becomes
pending when the expression first returns it (``active_at`` = that
evaluation), firing once ``now - active_at >= for``, and inactive when the
expression stops returning it - after ``keep_firing_for`` if it was firing.
A pending instance that disappears is dropped without firing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from kcops.agent.events import AlertStateName, AlertTransition
from kcops.agent.promql.model import Labels
from kcops.agent.rules.loader import AlertRule


@dataclass(frozen=True)
class Instance:
    """One alert instance: its labels (with ``alertname``), state and times (Unix s)."""

    labels: Labels
    state: AlertStateName
    active_at: float
    value: float
    annotations: Mapping[str, str]
    fired_at: float | None = None
    keep_firing_since: float | None = None


@dataclass(frozen=True)
class Result:
    """One element the rule's expression returned, with its labels and annotations expanded."""

    labels: Labels
    value: float
    annotations: Mapping[str, str]


RuleState = Mapping[Labels, Instance]


def _transition(
    rule: AlertRule, inst: Instance, previous: AlertStateName, state: AlertStateName, now: float
) -> AlertTransition:
    return AlertTransition(
        alertname=rule.name,
        labels=dict(inst.labels),
        previous=previous,
        state=state,
        t=now,
        value=inst.value,
        annotations=dict(inst.annotations),
        remediation=rule.remediation,
    )


def step(
    rule: AlertRule, state: RuleState, results: Sequence[Result], now: float
) -> tuple[dict[Labels, Instance], list[AlertTransition]]:
    """Advance one rule by one evaluation at ``now``; inputs are not modified."""
    out: dict[Labels, Instance] = {}
    transitions: list[AlertTransition] = []
    seen: set[Labels] = set()
    for res in results:
        seen.add(res.labels)
        old = state.get(res.labels)
        if old is None:
            inst = Instance(res.labels, "pending", now, res.value, res.annotations)
            out[res.labels] = inst
            continue
        out[res.labels] = replace(
            old, value=res.value, annotations=res.annotations, keep_firing_since=None
        )
    for labels, old in state.items():
        if labels in seen:
            continue
        if old.state == "firing" and rule.keep_firing_for_s > 0:
            since = old.keep_firing_since if old.keep_firing_since is not None else now
            if now - since < rule.keep_firing_for_s:
                out[labels] = replace(old, keep_firing_since=since)
                continue
        transitions.append(_transition(rule, old, old.state, "inactive", now))
    for labels, inst in list(out.items()):
        old_state: AlertStateName = state[labels].state if labels in state else "inactive"
        if inst.state == "pending" and now - inst.active_at >= rule.for_s:
            inst = replace(inst, state="firing", fired_at=now)
            out[labels] = inst
        if inst.state != old_state:
            transitions.append(_transition(rule, inst, old_state, inst.state, now))
    return out, transitions
