"""The ``rules:`` section: the alert table and its parameters."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictBool

from kcops.agent.config.base import Section
from kcops.agent.duration import Duration
from kcops.agent.yamlload import excerpt

MAX_PARAM_CHARS = 1024


def _param_value(v: Any) -> int | float | str:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"a parameter must be a number or a string, got {excerpt(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"a parameter must be a finite number, got {v!r}")
    if isinstance(v, str) and len(v) > MAX_PARAM_CHARS:
        raise ValueError(f"a parameter string has at most {MAX_PARAM_CHARS} characters")
    return v


# A rule parameter's value (the rule file's ``params`` and ``rules.params`` overrides alike).
ParamValue = Annotated[int | float | str, BeforeValidator(_param_value)]


class RulesSection(Section):
    file: Path | None = Field(None, description="rule file; none = the packaged alerts/rules.yaml")
    enabled: StrictBool = Field(True, description="evaluate the alert table")
    params: dict[str, ParamValue] = Field(
        default_factory=dict,
        description=(
            "overrides of the rule file's params (thresholds, windows), e.g. "
            "{p99_ttft_seconds: 0.3}; a finite number or a string; an unknown name is "
            "refused at load"
        ),
    )
    for_grace_period_s: Duration = Field(
        10.0,
        ge=0,
        description=(
            "after a restart, an alert whose `for` is restored has at least this much of it "
            "left (Prometheus's --rules.alert.for-grace-period); rules with a shorter `for` "
            "are not restored"
        ),
    )
    for_outage_tolerance_s: Duration = Field(
        3600.0,
        ge=0,
        description=(
            "the `for` state of an alert last seen longer ago than this is not restored "
            "(Prometheus's --rules.alert.for-outage-tolerance)"
        ),
    )
    tick_budget_s: Duration = Field(
        0.5,
        gt=0,
        description=(
            "event-loop time all rule evaluations of one agent tick may use together; a rule "
            "still running at the bound fails with a timeout, the rules after it in its group "
            "fail as not evaluated, and the groups not reached run on the next tick (which "
            "starts with them), so costly rules cannot stall the agent's loop"
        ),
    )
