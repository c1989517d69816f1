"""What the rules component shows others: typed records of alerts, rules and groups.

These are what ``GET /api/v1/alerts`` and ``GET /api/v1/rules`` serve (as
JSON objects).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from kcops.agent.events import AlertStateName


class ActiveAlert(TypedDict):
    """One pending or firing alert instance."""

    alertname: str
    labels: dict[str, str]
    state: AlertStateName
    active_since: float
    fired_at: float | None
    # JSON has no NaN/Inf: a number when finite, and the value as Prometheus prints it.
    value: float | None
    value_string: str
    annotations: dict[str, str]
    # The alert that inhibits it (the rule file's inhibit_rules): firing, not acted on.
    inhibited_by: NotRequired[str]


class StepInfo(TypedDict):
    action: str
    params: dict[str, object]
    verify_s: float


class RuleInfo(TypedDict):
    """One rule, its last evaluation and health; the alerting keys only on alerts."""

    name: str
    type: str
    group: str
    expr: str
    last_evaluation: float | None
    evaluation_seconds: float
    health: str
    last_error: str | None
    errors_total: int
    for_s: NotRequired[float]
    keep_firing_for_s: NotRequired[float]
    labels: NotRequired[dict[str, str]]
    annotations: NotRequired[dict[str, str]]
    remediation: NotRequired[list[StepInfo]]
    state: NotRequired[str]
    active: NotRequired[int]


class GroupInfo(TypedDict):
    """One group at runtime: its grid and its evaluations."""

    name: str
    interval_s: float
    on_tick: bool
    offset_s: float
    limit: int
    rules: list[str]
    last_evaluation: float | None
    evaluation_seconds: float
    iterations_total: int
    iterations_missed_total: int
    restored: bool
