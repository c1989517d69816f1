"""``promtool test rules`` files: load their series, replay the rules, check expectations.

The semantics follow promtool 2.42 (rules/unittest in cmd/promtool): series
values in expanding notation at ``i * interval`` from t = 0, rules evaluated
at every ``evaluation_interval`` from 0 to the largest ``eval_time``, and an
``alert_rule_test`` at ``eval_time`` compared, as sorted (labels,
annotations) lists of *firing* alerts, with the evaluation at the largest
step <= eval_time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import promql_parser as pp

from kcops.agent.events import AlertTransition
from kcops.agent.promql.literals import requote_raw, string_literals
from kcops.agent.promql.model import NAME, RuleError
from kcops.agent.rules.engine import RuleEngine
from kcops.agent.rules.loader import RuleSet, load_rules, parse_duration
from kcops.agent.samples import STALE_NAN, SeriesKey
from kcops.agent.store import Store
from kcops.agent.yamlload import excerpt, load_yaml_file

_UNUM = r"(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[Ii]nf|NaN|nan)"
_NUM = rf"[-+]?{_UNUM}"
_ITEM = re.compile(rf"^(?P<a>{_NUM})(?:(?P<sign>[-+])(?P<b>{_UNUM}))?x(?P<n>\d+)$")
_BLANKS = re.compile(r"^_x(?P<n>\d+)$")
Omitted = None


def _num(text: str) -> float:
    low = text.lower().lstrip("+")
    if low in ("inf",):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(text)


def expand_values(text: str) -> list[float | None]:
    """``1+2x3 _ stale 4x2`` -> values (None = omitted, STALE_NAN = stale marker)."""
    out: list[float | None] = []
    for tok in str(text).split():
        if tok == "_":
            out.append(Omitted)
            continue
        if tok == "stale":
            out.append(STALE_NAN)
            continue
        m = _BLANKS.match(tok)
        if m:
            out += [Omitted] * int(m.group("n"))
            continue
        m = _ITEM.match(tok)
        if m:
            a = _num(m.group("a"))
            b = _num(m.group("b")) if m.group("b") else 0.0
            if m.group("sign") == "-":
                b = -b
            for _ in range(int(m.group("n")) + 1):
                out.append(a)
                a += b
            continue
        try:
            out.append(_num(tok))
        except ValueError:
            raise RuleError(f"bad series value {tok!r} in {text!r}") from None
    return out


def series_key(text: str) -> SeriesKey:
    literals = string_literals(text)
    if literals is not None:
        text = requote_raw(text, literals)  # raw strings keep their backslashes
    try:
        node = pp.parse(text)
    except ValueError as exc:
        raise RuleError(f"bad input series {text!r}: {exc}") from None
    if not isinstance(node, pp.VectorSelector):
        raise RuleError(f"bad input series {text!r}: not a series")
    labels = {m.name: m.value for m in node.matchers.matchers}
    name = node.name or labels.pop(NAME, "")
    labels.pop(NAME, None)
    return SeriesKey.of(name, labels)


@dataclass
class AlertExpectation:
    eval_time_s: float
    alertname: str
    exp_alerts: list[tuple[dict[str, str], dict[str, str]]]


@dataclass
class PromtoolGroup:
    name: str
    interval_s: float
    series: list[tuple[SeriesKey, list[float | None]]]
    alert_tests: list[AlertExpectation]
    external_labels: dict[str, str] = field(default_factory=dict)
    external_url: str = ""


@dataclass
class PromtoolFile:
    path: Path
    rule_files: list[Path]
    evaluation_interval_s: float
    groups: list[PromtoolGroup]


def load_test_file(path: str | Path) -> PromtoolFile:
    p = Path(path)
    data = load_yaml_file(p, RuleError)  # the bounded loader: size, depth, no aliases
    if not isinstance(data, dict):
        raise RuleError(f"{p}: not a promtool test file")
    try:
        ev = parse_duration(data.get("evaluation_interval", "1m"))
        groups = []
        for i, g in enumerate(data.get("tests") or []):
            alerts = [
                AlertExpectation(
                    parse_duration(a["eval_time"]),
                    str(a["alertname"]),
                    [
                        (
                            {str(k): str(v) for k, v in (e.get("exp_labels") or {}).items()},
                            {str(k): str(v) for k, v in (e.get("exp_annotations") or {}).items()},
                        )
                        for e in (a.get("exp_alerts") or [])
                    ],
                )
                for a in (g.get("alert_rule_test") or [])
            ]
            series = [
                (series_key(s["series"]), expand_values(s.get("values", "")))
                for s in (g.get("input_series") or [])
            ]
            groups.append(
                PromtoolGroup(
                    str(g.get("name", f"test {i}")),
                    parse_duration(g.get("interval", "1m")),
                    series,
                    alerts,
                    {str(k): str(v) for k, v in (g.get("external_labels") or {}).items()},
                    str(g.get("external_url", "")),
                )
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise RuleError(f"{p}: malformed test file: {excerpt(str(exc), 200)}") from None
    rule_files = [p.parent / f for f in (data.get("rule_files") or [])]
    return PromtoolFile(p, rule_files, ev, groups)


def build_store(group: PromtoolGroup) -> Store:
    store = Store(retention_s=10 * 365 * 86400.0, max_series=1_000_000)
    for key, values in group.series:
        for i, v in enumerate(values):
            if v is not None:
                store.append(key, i * group.interval_s, v)
    return store


def _firing(engine: RuleEngine, alertname: str) -> list[tuple[dict[str, str], dict[str, str]]]:
    got = []
    for inst in engine.states.get(alertname, {}).values():
        if inst.state == "firing":
            got.append((dict(inst.labels), dict(inst.annotations)))
    return got


def _norm(
    alerts: list[tuple[dict[str, str], dict[str, str]]],
) -> list[tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]]:
    return sorted((tuple(sorted(lab.items())), tuple(sorted(ann.items()))) for lab, ann in alerts)


def replay_group(
    ruleset: RuleSet,
    group: PromtoolGroup,
    evaluation_interval_s: float,
    until_s: float | None = None,
    check: bool = True,
) -> Iterator[tuple[AlertTransition | None, str | None]]:
    """Yield (transition, None) per state change and (None, failure) per failed expectation."""
    store = build_store(group)
    engine = RuleEngine(
        ruleset,
        store,
        external_labels=group.external_labels,
        external_url=group.external_url,
        default_step_s=evaluation_interval_s,  # promtool steps x[5m:] at it too
    )
    times = sorted({a.eval_time_s for a in group.alert_tests})
    if until_s is None:
        last_sample = max(
            ((len(v) - 1) * group.interval_s for _, v in group.series if v), default=0.0
        )
        until_s = max(times) if times and check else max([last_sample, *times])
    n_steps = math.floor(until_s / evaluation_interval_s + 1e-9)
    curr = 0
    for i in range(n_steps + 1):
        ts = i * evaluation_interval_s
        for tr in engine.evaluate(ts):
            yield tr, None
        for rname, h in engine.health.items():
            if h.error:
                yield None, f"    rule: {rname}, time: {ts:g}s, err: {h.error}"
        while curr < len(times) and ts <= times[curr] < ts + evaluation_interval_s:
            if check:
                for exp in group.alert_tests:
                    if exp.eval_time_s != times[curr]:
                        continue
                    want = [
                        ({**lab, "alertname": exp.alertname}, ann) for lab, ann in exp.exp_alerts
                    ]
                    got = _firing(engine, exp.alertname)
                    if _norm(want) != _norm(got):
                        yield (
                            None,
                            (
                                f"    alertname: {exp.alertname}, time: {exp.eval_time_s:g}s,\n"
                                f"        exp:{_fmt(want)},\n        got:{_fmt(got)}"
                            ),
                        )
            curr += 1


def _fmt(alerts: list[tuple[dict[str, str], dict[str, str]]]) -> str:
    return (
        "["
        + ", ".join(f"{{labels: {lab}, annotations: {ann}}}" for lab, ann in _norm_dicts(alerts))
        + "]"
    )


def _norm_dicts(
    alerts: list[tuple[dict[str, str], dict[str, str]]],
) -> list[tuple[dict[str, str], dict[str, str]]]:
    return [(dict(lab), dict(ann)) for lab, ann in _norm(alerts)]


def resolve_rules(
    test: PromtoolFile, rules_path: str | Path | None, overrides: Mapping[str, object] | None = None
) -> RuleSet:
    if rules_path is not None:
        return load_rules(rules_path, overrides)
    if len(test.rule_files) != 1:
        raise RuleError(
            f"{test.path}: replay needs exactly one rule file (got {len(test.rule_files)}); "
            "pass --rules"
        )
    return load_rules(test.rule_files[0], overrides)
