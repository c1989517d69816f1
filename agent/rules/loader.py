"""Load a Prometheus rule file (plus kcops's extensions) into checked rule objects.

kcops extensions, stripped by the export: a top-level ``params:`` mapping
(default thresholds, referenced as ``${name}`` in ``expr``, ``for``,
``keep_firing_for``, labels and annotations; overridden by the ``rules.params``
config section) and a per-rule ``remediation:`` ladder. Everything is checked
at load: a bad file is refused with the rule's name and the reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcops.agent.duration import parse_duration
from kcops.agent.events import RemediationStep
from kcops.agent.rules.model import RuleError
from kcops.agent.rules.parse import parse_expr
from kcops.agent.rules.templates import Template, compile_template
from kcops.agent.yamlload import load_yaml_file

ACTIONS = frozenset(
    {
        "evict_cache",
        "fallback_to_base",
        "lower_topn",
        "raise_topn",
        "restart_worker",
        "scale_out",
        "notify",
    }
)
KCOPS_RULE_KEYS = frozenset({"remediation"})
RULE_KEYS = frozenset(
    {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
)
GROUP_KEYS = frozenset({"name", "interval", "rules", "limit"})
_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class AlertRule:
    name: str
    expr: str
    node: Any = field(repr=False, compare=False)
    for_s: float
    keep_firing_for_s: float
    labels: Mapping[str, Template]
    annotations: Mapping[str, Template]
    remediation: tuple[RemediationStep, ...]
    group: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)  # Prometheus-only keys

    @property
    def kind(self) -> str:
        return "alerting"


@dataclass(frozen=True)
class RecordingRule:
    name: str
    expr: str
    node: Any = field(repr=False, compare=False)
    labels: Mapping[str, str]
    group: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def kind(self) -> str:
        return "recording"


Rule = AlertRule | RecordingRule


@dataclass(frozen=True)
class Group:
    name: str
    interval: str | None
    rules: tuple[Rule, ...]


@dataclass(frozen=True)
class RuleSet:
    source: str
    groups: tuple[Group, ...]
    params: Mapping[str, Any]

    @property
    def rules(self) -> list[Rule]:
        return [r for g in self.groups for r in g.rules]

    def alerts(self) -> list[AlertRule]:
        return [r for r in self.rules if isinstance(r, AlertRule)]

    def get(self, name: str) -> Rule | None:
        for r in self.rules:
            if r.name == name:
                return r
        return None


def _param_text(v: Any) -> str:
    if isinstance(v, bool):
        raise ValueError("a boolean is not a valid parameter")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)
    if isinstance(v, str):
        return v
    raise ValueError(f"parameter must be a number or a string, got {type(v).__name__}")


def substitute(text: str, params: Mapping[str, Any], where: str) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in params:
            known = ", ".join(sorted(params)) or "none"
            raise RuleError(f"{where}: unknown parameter ${{{name}}} (known: {known})")
        return _param_text(params[name])

    return _PARAM.sub(repl, text)


def _remediation(raw: Any, where: str) -> tuple[RemediationStep, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RuleError(f"{where}: remediation must be a list of steps")
    steps = []
    for i, step in enumerate(raw):
        w = f"{where}: remediation[{i}]"
        if not isinstance(step, dict):
            raise RuleError(f"{w}: a step must be a mapping with 'action'")
        unknown = set(step) - {"action", "params", "verify"}
        if unknown:
            raise RuleError(f"{w}: unknown keys {sorted(unknown)}; allowed: action, params, verify")
        action = step.get("action")
        if action not in ACTIONS:
            raise RuleError(
                f"{w}: unknown action {action!r}; allowed: {', '.join(sorted(ACTIONS))}"
            )
        params = step.get("params") or {}
        if not isinstance(params, dict):
            raise RuleError(f"{w}: params must be a mapping")
        try:
            verify_s = parse_duration(step.get("verify", "1m"))
        except ValueError as exc:
            raise RuleError(f"{w}: verify: {exc}") from None
        steps.append(RemediationStep(action=action, params=dict(params), verify_s=verify_s))
    return tuple(steps)


def _templates(raw: Any, what: str, where: str, params: Mapping[str, Any]) -> dict[str, Template]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RuleError(f"{where}: {what} must be a mapping")
    out = {}
    for k, v in raw.items():
        text = substitute(str(v), params, f"{where}: {what}.{k}")
        try:
            out[str(k)] = compile_template(text)
        except RuleError as exc:
            raise RuleError(f"{where}: {what}.{k}: template error: {exc}") from None
    return out


def _rule(raw: Any, group: str, idx: int, params: Mapping[str, Any], source: str) -> Rule:
    if not isinstance(raw, dict):
        raise RuleError(f"{source}: group {group!r}: rule {idx}: must be a mapping")
    name = raw.get("alert") or raw.get("record")
    where = f"{source}: rule {name!r}" if name else f"{source}: group {group!r}: rule {idx}"
    if not name or ("alert" in raw and "record" in raw):
        raise RuleError(f"{where}: exactly one of 'alert' or 'record' must be set")
    unknown = set(raw) - RULE_KEYS - KCOPS_RULE_KEYS
    if unknown:
        allowed = ", ".join(sorted(RULE_KEYS | KCOPS_RULE_KEYS))
        raise RuleError(f"{where}: unknown keys {sorted(unknown)}; allowed: {allowed}")
    expr_raw = raw.get("expr")
    if not isinstance(expr_raw, str | int | float) or isinstance(expr_raw, bool):
        raise RuleError(f"{where}: 'expr' is required")
    expr = substitute(str(expr_raw), params, where)
    try:
        node = parse_expr(expr)
    except RuleError as exc:
        raise RuleError(f"{where}: expr: {exc}") from None
    prom = {k: v for k, v in raw.items() if k not in KCOPS_RULE_KEYS}
    prom["expr"] = expr
    if "record" in raw:
        for key in ("for", "keep_firing_for", "annotations", "remediation"):
            if key in raw:
                raise RuleError(f"{where}: '{key}' is only valid on alerting rules")
        rec_labels = {str(k): str(v) for k, v in (raw.get("labels") or {}).items()}
        return RecordingRule(str(name), expr, node, rec_labels, group, prom)
    durations = {}
    for key in ("for", "keep_firing_for"):
        text = raw.get(key, "0s")
        if isinstance(text, str):
            text = substitute(text, params, where)
            prom[key] = text
        try:
            durations[key] = parse_duration(text)
        except ValueError as exc:
            raise RuleError(f"{where}: {key}: {exc}") from None
    labels = _templates(raw.get("labels"), "labels", where, params)
    annotations = _templates(raw.get("annotations"), "annotations", where, params)
    for k in ("labels", "annotations"):
        if k in raw and raw[k] is not None:
            prom[k] = {kk: substitute(str(vv), params, where) for kk, vv in raw[k].items()}
    return AlertRule(
        name=str(name),
        expr=expr,
        node=node,
        for_s=durations["for"],
        keep_firing_for_s=durations["keep_firing_for"],
        labels=labels,
        annotations=annotations,
        remediation=_remediation(raw.get("remediation"), where),
        group=group,
        raw=prom,
    )


def load_rules_data(
    data: Any, source: str = "<rules>", overrides: Mapping[str, Any] | None = None
) -> RuleSet:
    if not isinstance(data, dict):
        raise RuleError(f"{source}: the top level must be a mapping with 'groups'")
    unknown = set(data) - {"groups", "params"}
    if unknown:
        raise RuleError(
            f"{source}: unknown top-level keys {sorted(unknown)}; allowed: groups, params"
        )
    params = dict(data.get("params") or {})
    for k, v in (overrides or {}).items():
        if k not in params:
            known = ", ".join(sorted(params)) or "none"
            raise RuleError(f"{source}: rules.params.{k}: unknown parameter (known: {known})")
        params[k] = v
    groups = []
    seen_groups: set[str] = set()
    for gi, g in enumerate(data.get("groups") or []):
        if not isinstance(g, dict) or not g.get("name"):
            raise RuleError(f"{source}: group {gi}: a group needs a 'name'")
        gname = str(g["name"])
        if gname in seen_groups:
            raise RuleError(f"{source}: group {gname!r}: repeated in the same file")
        seen_groups.add(gname)
        unknown = set(g) - GROUP_KEYS
        if unknown:
            raise RuleError(f"{source}: group {gname!r}: unknown keys {sorted(unknown)}")
        interval = g.get("interval")
        if interval is not None:
            try:
                parse_duration(interval)
            except ValueError as exc:
                raise RuleError(f"{source}: group {gname!r}: interval: {exc}") from None
        rules = tuple(
            _rule(r, gname, i, params, source) for i, r in enumerate(g.get("rules") or [])
        )
        groups.append(Group(gname, interval, rules))
    # Alert state and remediation ladders are kept per rule name, so a name
    # may appear once (Prometheus allows repeats; tell severities apart by labels).
    names: set[str] = set()
    for grp in groups:
        for rule in grp.rules:
            if rule.name in names:
                raise RuleError(
                    f"{source}: group {grp.name!r}: rule {rule.name!r}: the name is used by "
                    "another rule; kcops keeps alert state and ladders per name, so each name "
                    "must be unique (tell severities apart with labels)"
                )
            names.add(rule.name)
    return RuleSet(source, tuple(groups), params)


def load_rules(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RuleSet:
    p = Path(path)
    return load_rules_data(load_yaml_file(p, RuleError), str(p), overrides)


def default_rules_path() -> Path:
    from kcops.alerts import packaged_file

    return packaged_file("rules.yaml")
