"""Load a Prometheus rule file (plus kcops's extensions) into checked rule objects.

The file's format is :mod:`kcops.agent.rules.rulefile`; this module validates a
document with it, then compiles what the models cannot check alone: the PromQL,
the annotation templates, and names that must be unique. kcops's extensions,
stripped by the export, are a top-level ``params:`` mapping (``${name}``,
overridden by the ``rules.params`` config section) and a per-rule
``remediation:`` ladder. A bad file is refused with one line naming the rule,
the field, a short excerpt of the value and what is allowed (:class:`RuleError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from pydantic import TypeAdapter, ValidationError

from kcops.agent.config.rules import ParamValue
from kcops.agent.duration import parse_duration
from kcops.agent.events import DEFAULT_VERIFY_S, Step
from kcops.agent.outcome import ActionName
from kcops.agent.promql.model import RuleError
from kcops.agent.promql.parse import parse_expr
from kcops.agent.rules.inhibit import InhibitRule, Matcher
from kcops.agent.rules.rulefile import (
    ActionParams,
    Params,
    RuleFile,
    RuleModel,
    StepModel,
    known_names,
)
from kcops.agent.rules.templates import Template, compile_template
from kcops.agent.validation import Loc, one_line
from kcops.agent.yamlload import excerpt, load_yaml_file

if TYPE_CHECKING:
    from kcops.agent.config import Config

__all__ = [
    "AlertRule",
    "GroupSpec",
    "PromRule",
    "RecordingRule",
    "Rule",
    "RuleSet",
    "default_rules_path",
    "load_rules",
    "load_rules_data",
    "parse_duration",
    "ruleset_from_config",
]


# A rule as Prometheus reads it (kcops keys out, params in): what the export writes.
# The functional form, because `for` is a Python keyword.
PromRule = TypedDict(
    "PromRule",
    {
        "alert": str,
        "record": str,
        "expr": str,
        "for": str,
        "keep_firing_for": str,
        "labels": dict[str, str],
        "annotations": dict[str, str],
    },
    total=False,
)


@dataclass(frozen=True)
class AlertRule:
    name: str
    expr: str
    node: Any = field(repr=False, compare=False)
    for_s: float
    keep_firing_for_s: float
    labels: Mapping[str, Template]
    annotations: Mapping[str, Template]
    remediation: tuple[Step, ...]
    group: str
    raw: PromRule = field(repr=False, compare=False)  # Prometheus-only keys

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
    raw: PromRule = field(repr=False, compare=False)

    @property
    def kind(self) -> str:
        return "recording"


Rule = AlertRule | RecordingRule


@dataclass(frozen=True)
class GroupSpec:
    """A group as the file has it; :class:`kcops.agent.rules.group.Group` runs it.

    ``interval`` and ``limit`` are kept as written (None: not given) for the
    export; ``interval_s`` is None when the group takes the default interval
    (no ``interval``, or ``0s`` as Prometheus reads it), ``limit`` 0 or None
    means no limit.
    """

    name: str
    interval: str | None
    rules: tuple[Rule, ...]
    limit: int | None = None

    @property
    def interval_s(self) -> float | None:
        if self.interval is None:
            return None
        seconds = parse_duration(self.interval)
        return seconds if seconds > 0 else None


@dataclass(frozen=True)
class RuleSet:
    source: str
    groups: tuple[GroupSpec, ...]
    params: Mapping[str, int | float | str]
    inhibit_rules: tuple[InhibitRule, ...] = ()

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


_PARAMS = TypeAdapter(Params | None)
_VALUE: TypeAdapter[int | float | str] = TypeAdapter(ParamValue)


def _where(data: Mapping[str, Any]) -> Any:
    """Name an error's rule (``rule 'X': ``) or group from the document being validated."""

    def named(obj: Any, key: str) -> str | None:
        value = obj.get(key) if isinstance(obj, dict) else None
        return value if isinstance(value, str) and value else None

    def where(loc: Loc) -> tuple[str, Loc]:
        groups = data.get("groups")
        if len(loc) < 2 or loc[0] != "groups" or not isinstance(loc[1], int):
            return "", loc
        g = groups[loc[1]] if isinstance(groups, list) and loc[1] < len(groups) else None
        gname = named(g, "name")
        gdesc = f"group {excerpt(gname)}" if gname else f"group {loc[1]}"
        if len(loc) < 4 or loc[2] != "rules" or not isinstance(loc[3], int):
            return f"{gdesc}: ", loc[2:]
        rules = g.get("rules") if isinstance(g, dict) else None
        r = rules[loc[3]] if isinstance(rules, list) and loc[3] < len(rules) else None
        rname = named(r, "alert") or named(r, "record")
        return (f"rule {excerpt(rname)}: " if rname else f"{gdesc}: rule {loc[3]}: "), loc[4:]

    return where


def _params(
    raw: object, overrides: Mapping[str, object] | None, source: str
) -> dict[str, int | float | str]:
    """The file's params with the overrides (config ``rules.params``, ``--param``) applied."""
    try:
        params = dict(_PARAMS.validate_python(raw, strict=True) or {})
    except ValidationError as exc:
        raise RuleError(
            one_line(exc, source, RuleFile, lambda loc: ("", ("params", *loc)))
        ) from None
    for k, v in (overrides or {}).items():
        where = f"{source}: rules.params.{excerpt(str(k)).strip(chr(39))}"
        if k not in params:
            raise RuleError(f"{where}: unknown parameter (known: {known_names(params)})")
        try:
            params[k] = _VALUE.validate_python(v)
        except ValidationError as exc:
            raise RuleError(one_line(exc, where, RuleFile)) from None
    return params


def _short(exc: BaseException, limit: int = 240) -> str:
    """An error from the parser or the template compiler, on one line and short (they may
    quote the whole expression or template)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _step(step: StepModel, default_verify_s: float) -> Step:
    verify_s = parse_duration(step.verify) if step.verify is not None else default_verify_s
    return Step(action=ActionName(step.action), params=dict(step.params or {}), verify_s=verify_s)


def _templates(raw: Mapping[str, str] | None, what: str, where: str) -> dict[str, Template]:
    out = {}
    for k, text in (raw or {}).items():
        try:
            out[k] = compile_template(text)
        except RuleError as exc:
            raise RuleError(f"{where}: {what}.{k}: template error: {_short(exc)}") from None
        except RecursionError:
            raise RuleError(f"{where}: {what}.{k}: template error: nested too deeply") from None
    return out


def _prometheus_keys(raw: Mapping[str, object], rule: RuleModel) -> PromRule:
    """The rule as Prometheus reads it: kcops keys out, params in, an alert's ``for`` and
    ``keep_firing_for`` always given (``0s`` when the file has none). Keys keep the
    file's order."""
    out = PromRule()
    for key in raw:
        if key == "alert" and rule.alert is not None:
            out["alert"] = rule.alert
        elif key == "record" and rule.record is not None:
            out["record"] = rule.record
        elif key == "expr":
            out["expr"] = rule.expr
        elif key == "for" and rule.for_ is not None:
            out["for"] = rule.for_
        elif key == "keep_firing_for" and rule.keep_firing_for is not None:
            out["keep_firing_for"] = rule.keep_firing_for
        elif key == "labels" and rule.labels is not None:
            out["labels"] = dict(rule.labels)
        elif key == "annotations" and rule.annotations is not None:
            out["annotations"] = dict(rule.annotations)
    if rule.alert is not None:
        out["for"] = rule.for_ or "0s"
        out["keep_firing_for"] = rule.keep_firing_for or "0s"
    return out


def _rule(
    rule: RuleModel, raw: Mapping[str, object], group: str, source: str, default_verify_s: float
) -> Rule:
    where = f"{source}: rule {excerpt(rule.name)}"
    try:
        node = parse_expr(rule.expr)
    except RuleError as exc:
        raise RuleError(f"{where}: expr: {_short(exc)}") from None
    except RecursionError:
        raise RuleError(f"{where}: expr: nested too deeply for kcops's evaluator") from None
    except OverflowError as exc:  # a number too large for a duration, from the Rust side
        raise RuleError(f"{where}: expr: cannot parse expression: {_short(exc)}") from None
    except BaseException as exc:
        # promql-parser's Rust code panics on some numbers (`x[1e999]`, `offset 1e300`);
        # pyo3 raises that as PanicException, a BaseException.
        if type(exc).__name__ != "PanicException":
            raise
        raise RuleError(f"{where}: expr: cannot parse expression: {_short(exc)}") from None
    prom = _prometheus_keys(raw, rule)
    if rule.record is not None:
        return RecordingRule(rule.record, rule.expr, node, dict(rule.labels or {}), group, prom)
    return AlertRule(
        name=rule.name,
        expr=rule.expr,
        node=node,
        for_s=parse_duration(rule.for_ or "0s"),
        keep_firing_for_s=parse_duration(rule.keep_firing_for or "0s"),
        labels=_templates(rule.labels, "labels", where),
        annotations=_templates(rule.annotations, "annotations", where),
        remediation=tuple(_step(s, default_verify_s) for s in rule.remediation or ()),
        group=group,
        raw=prom,
    )


def _unique(groups: list[GroupSpec], source: str) -> None:
    seen_groups: set[str] = set()
    names: set[str] = set()
    for grp in groups:
        if grp.name in seen_groups:
            raise RuleError(f"{source}: group {excerpt(grp.name)}: repeated in the same file")
        seen_groups.add(grp.name)
        # Alert state and remediation ladders are kept per rule name, so a name
        # may appear once (Prometheus allows repeats; tell severities apart by labels).
        for rule in grp.rules:
            if rule.name in names:
                raise RuleError(
                    f"{source}: group {excerpt(grp.name)}: rule {excerpt(rule.name)}: the name "
                    "is used by another rule; kcops keeps alert state and ladders per name, so "
                    "each name must be unique (tell severities apart with labels)"
                )
            names.add(rule.name)


def load_rules_data(
    data: Any,
    source: str = "<rules>",
    overrides: Mapping[str, object] | None = None,
    default_verify_s: float = DEFAULT_VERIFY_S,
    actions: ActionParams | None = None,
) -> RuleSet:
    """Validate and compile a rule document (as loaded from YAML); RuleError if it is bad.

    ``overrides`` replace the file's params (an unknown name is refused);
    ``default_verify_s`` is the verify window of a step that gives none; ``actions``: the
    ladder actions a step may name, with their parameter models (None: shape only).
    """
    if not isinstance(data, dict):
        raise RuleError(f"{source}: the top level must be a mapping with 'groups'")
    params = _params(data.get("params"), overrides, source)
    try:
        doc = RuleFile.model_validate(data, context={"params": params, "actions": actions})
    except ValidationError as exc:
        raise RuleError(one_line(exc, source, RuleFile, _where(data))) from None
    groups = []
    for g, raw_g in zip(doc.groups or (), data.get("groups") or (), strict=True):
        raw_rules = raw_g.get("rules") or ()
        rules = tuple(
            _rule(r, raw_r, g.name, source, default_verify_s)
            for r, raw_r in zip(g.rules or (), raw_rules, strict=True)
        )
        groups.append(GroupSpec(g.name, g.interval, rules, g.limit))
    _unique(groups, source)
    inhibit = tuple(
        InhibitRule(
            tuple(Matcher.parse(m) for m in r.source_matchers),
            tuple(Matcher.parse(m) for m in r.target_matchers),
            tuple(r.equal or ()),
        )
        for r in doc.inhibit_rules or ()
    )
    return RuleSet(source, tuple(groups), params, inhibit)


def load_rules(
    path: str | Path,
    overrides: Mapping[str, object] | None = None,
    default_verify_s: float = DEFAULT_VERIFY_S,
    actions: ActionParams | None = None,
) -> RuleSet:
    """Read (through the bounded YAML loader) and load one rule file."""
    p = Path(path)
    data = load_yaml_file(p, RuleError)
    return load_rules_data(data, str(p), overrides, default_verify_s, actions)


def default_rules_path() -> Path:
    from kcops.alerts import packaged_file

    return packaged_file("rules.yaml")


def ruleset_from_config(config: Config, actions: ActionParams | None = None) -> RuleSet:
    """The rule set the configuration names: its file (default: the packaged table), its
    ``rules.params`` overrides, and ``actions.guards.default_verify_s``."""
    section = config.rules
    path = section.file if section.file is not None else default_rules_path()
    verify_s = config.actions.guards.default_verify_s
    return load_rules(path, dict(section.params), verify_s, actions)
