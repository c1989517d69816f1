"""The rule file's format as strict pydantic models (Prometheus's rulefmt plus kcops's keys).

:mod:`kcops.agent.rules.loader` validates a loaded YAML document with
:class:`RuleFile` and then compiles it (PromQL, templates). The models refuse
what a rule file may not contain: unknown keys at every level, names that are
not Prometheus names, sizes past the bounds below, durations outside
Prometheus's grammar, and a remediation step whose ``action`` is not one of the
ladder actions handed in (:data:`ActionParams`) or whose ``params`` that
action's own parameter model refuses (strictly: ``"yes"`` is not a boolean).

``${name}`` in ``expr``, ``for``, ``keep_firing_for``, labels and
annotations is replaced by the parameter's value while validating; the
effective parameters come in the validation context (``{"params": ...}``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kcops.agent.config.rules import ParamValue
from kcops.agent.duration import parse_duration
from kcops.agent.outcome import ActionName
from kcops.agent.promql.exprguard import check_expr_text
from kcops.agent.rules.inhibit import Matcher
from kcops.agent.validation import render_path
from kcops.agent.yamlload import excerpt

# What a remediation step's ``action`` may name, and the model its ``params`` must pass:
# the ladder actions, name -> parameter model. The rules know nothing of actions; whoever
# loads a rule file for remediation hands this in (the agent, ``check-config``, ``kcops
# alerts``: the actions registry's ``ladder_params()``) in the validation context, as
# ``{"actions": ...}``. Without it a step is checked for its shape only.
ActionParams = Mapping[str, type[BaseModel]]

MAX_NAME_CHARS = 256  # alert, record, group names
MAX_LABEL_NAME_CHARS = 128
MAX_LABEL_VALUE_CHARS = 2048
MAX_ANNOTATION_CHARS = 16384
MAX_LABELS = 64
MAX_PARAMS = 256
MAX_STEPS = 32
MAX_RULES = 10_000
_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def param_text(v: int | float | str) -> str:
    """A parameter's value as it is written into an expression or label."""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)
    return str(v)


def _identifier(what: str, why: str = "") -> AfterValidator:
    def check(v: str) -> str:
        if not _IDENT.fullmatch(v) or len(v) > MAX_LABEL_NAME_CHARS:
            raise ValueError(
                f"invalid {what} {excerpt(v)}: [a-zA-Z_][a-zA-Z0-9_]*, "
                f"at most {MAX_LABEL_NAME_CHARS} characters{why}"
            )
        return v

    return AfterValidator(check)


ParamName = Annotated[str, _identifier("parameter name", ", so that ${name} can name it")]


def known_names(params: Mapping[str, object]) -> str:
    """The parameter names for an error message: sorted, at most 30, ``none`` if empty."""
    names = sorted(params)
    return (", ".join(names[:30]) + (", ..." if len(names) > 30 else "")) or "none"


def substitute(text: str, params: Mapping[str, int | float | str]) -> str:
    """Replace every ``${name}``; an unknown name is a ValueError listing the known ones."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in params:
            shown = excerpt(name).strip("'")
            raise ValueError(f"unknown parameter ${{{shown}}} (known: {known_names(params)})")
        return param_text(params[name])

    return _PARAM.sub(repl, text)


def _expr_text(v: Any) -> str:
    # Prometheus reads `expr: 5` as the expression "5".
    if isinstance(v, int | float) and not isinstance(v, bool):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"'expr' must be a string, got {v!r}")
        return param_text(v)
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"'expr' is required: a PromQL expression string, got {excerpt(v)}")
    return v


def _duration_text(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and v == 0:
        return "0"
    if not isinstance(v, str):
        raise ValueError(f"must be a duration string (e.g. 30s, 5m), got {excerpt(v)}")
    parse_duration(v)  # DurationError is a ValueError: pydantic reports it at the field
    return v


def _text(limit: int) -> Any:
    def check(v: Any) -> str:
        # YAML turns `severity: 1` into an int; Prometheus reads it as the text "1".
        if v is None:
            return ""
        if isinstance(v, int | float) and not isinstance(v, bool):
            return param_text(v)
        if not isinstance(v, str):
            raise ValueError(f"must be a string, got {excerpt(v)}")
        if len(v) > limit:
            raise ValueError(f"at most {limit} characters, got {len(v)}")
        return v

    return BeforeValidator(check)


def _check_name(v: str) -> str:
    if not v:
        raise ValueError("must not be empty")
    if len(v) > MAX_NAME_CHARS:
        raise ValueError(f"at most {MAX_NAME_CHARS} characters, got {len(v)}")
    return v


def _metric_name(v: str) -> str:
    _check_name(v)
    if not _METRIC.fullmatch(v):
        raise ValueError(f"invalid recording rule name {excerpt(v)}: [a-zA-Z_:][a-zA-Z0-9_:]*")
    return v


Name = Annotated[str, AfterValidator(_check_name)]
MetricName = Annotated[str, AfterValidator(_metric_name)]
LabelName = Annotated[str, _identifier("label name")]
DurationText = Annotated[str, BeforeValidator(_duration_text)]
Expr = Annotated[str, BeforeValidator(_expr_text), AfterValidator(check_expr_text)]
Labels = Annotated[
    dict[LabelName, Annotated[str, _text(MAX_LABEL_VALUE_CHARS)]], Field(max_length=MAX_LABELS)
]
Annotations = Annotated[
    dict[LabelName, Annotated[str, _text(MAX_ANNOTATION_CHARS)]], Field(max_length=MAX_LABELS)
]


def _non_finite(value: Any, loc: tuple[int | str, ...] = ()) -> tuple[int | str, ...] | None:
    """Where in ``value`` a NaN or infinity is, if anywhere."""
    if isinstance(value, float) and not math.isfinite(value):
        return loc
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for k, v in items:
        if (found := _non_finite(v, (*loc, k))) is not None:
            return found
    return None


def _actions(info: ValidationInfo) -> ActionParams | None:
    actions = (info.context or {}).get("actions")
    return actions if isinstance(actions, Mapping) else None


def _check_action(v: str, info: ValidationInfo) -> ActionName:
    """An action kcops runs; where the caller hands the actions in (the agent), one of those."""
    actions = _actions(info)
    allowed = sorted(actions) if actions is not None else sorted(ActionName)
    if v not in allowed:
        raise ValueError(f"unknown action {excerpt(v)}; allowed: {', '.join(allowed)}")
    return ActionName(v)


_ALERTING_ONLY = (
    ("for", "for_"),
    ("keep_firing_for", "keep_firing_for"),
    ("annotations", "annotations"),
    ("remediation", "remediation"),
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class StepModel(_Strict):
    """One rung of a remediation ladder: ``{action, params, verify}``."""

    action: Annotated[str, AfterValidator(_check_action)]
    params: dict[str, Any] | None = None
    verify: DurationText | None = None

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        action = info.data.get("action")
        if v is None or action is None:
            return v
        bad = _non_finite(v)
        if bad is not None:
            raise ValueError(f"{action}: {render_path(bad)}: must be a finite number")
        actions = _actions(info)
        if actions is None:
            return v
        try:
            actions[action].model_validate(v, strict=True)
        except ValidationError as exc:
            e = exc.errors(include_url=False)[0]
            more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            got = (
                ""
                if e["type"] in ("missing", "extra_forbidden")
                else f"; got {excerpt(e['input'])}"
            )
            raise ValueError(
                f"{action}: {render_path(e['loc']) or 'params'}: {e['msg'][:200]}{got}{more}"
            ) from None
        return v


class RuleModel(_Strict):
    """An alerting (``alert``) or recording (``record``) rule, plus kcops's ``remediation``."""

    alert: Name | None = None
    record: MetricName | None = None
    expr: Expr
    for_: DurationText | None = Field(None, alias="for")
    keep_firing_for: DurationText | None = None
    labels: Labels | None = None
    annotations: Annotations | None = None
    remediation: Annotated[list[StepModel], Field(max_length=MAX_STEPS)] | None = None

    @field_validator("expr", "for_", "keep_firing_for", "labels", "annotations", mode="before")
    @classmethod
    def _substitute(cls, v: Any, info: ValidationInfo) -> Any:
        params = (info.context or {}).get("params", {})
        if isinstance(v, str):
            return substitute(v, params)
        if isinstance(v, dict):
            return {k: substitute(x, params) if isinstance(x, str) else x for k, x in v.items()}
        return v

    @model_validator(mode="after")
    def _kind(self) -> RuleModel:
        if (self.alert is None) == (self.record is None):
            raise ValueError("exactly one of 'alert' or 'record' must be set")
        if self.record is not None:
            for key, fname in _ALERTING_ONLY:
                if fname in self.model_fields_set:
                    raise ValueError(f"'{key}' is only valid on alerting rules")
        return self

    @property
    def name(self) -> str:
        return self.alert if self.alert is not None else str(self.record)


class GroupModel(_Strict):
    name: Name
    interval: DurationText | None = None
    limit: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    rules: Annotated[list[RuleModel], Field(max_length=MAX_RULES)] | None = None


def _matcher(v: str) -> str:
    Matcher.parse(v)  # ValueError: pydantic names the field
    return v


MatcherText = Annotated[str, Field(max_length=1024), AfterValidator(_matcher)]


class InhibitRuleModel(_Strict):
    """One of Alertmanager's ``inhibit_rules``, in its own syntax (matchers as text)."""

    source_matchers: Annotated[list[MatcherText], Field(min_length=1, max_length=MAX_LABELS)]
    target_matchers: Annotated[list[MatcherText], Field(min_length=1, max_length=MAX_LABELS)]
    equal: Annotated[list[LabelName], Field(max_length=MAX_LABELS)] | None = None


class RuleFile(_Strict):
    """A whole rule file: Prometheus's ``groups``, kcops's ``params``, and Alertmanager's
    ``inhibit_rules`` (the agent applies them; ``kcops alerts export`` leaves them out)."""

    groups: list[GroupModel] | None = None
    params: Annotated[dict[ParamName, ParamValue], Field(max_length=MAX_PARAMS)] | None = None
    inhibit_rules: Annotated[list[InhibitRuleModel], Field(max_length=MAX_RULES)] | None = None


Params = dict[ParamName, ParamValue]
