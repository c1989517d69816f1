"""Inhibition, as Alertmanager's ``inhibit_rules`` define it, applied by the agent itself.

A target alert that fires while a source alert fires (matching the rule's source
matchers, with the same values of its ``equal`` labels) still fires, but its
transition carries ``inhibited_by``, so remediation records it and neither starts a
ladder for it nor pages. When the source stops and the target still fires, the
target is published again, as an incident of its own. The syntax is Alertmanager's,
so the cluster's Alertmanager takes the same rules (deploy/alertmanager/).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from kcops.agent.events import AlertTransition
from kcops.agent.promql.model import RuleError
from kcops.agent.promql.regex import compile_anchored
from kcops.agent.samples import LabelPairs, label_pairs

# Alertmanager's matcher: name, operator, a double-quoted value (escapes \" and \\).
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Matcher:
        """``name="v"``, ``name!="v"``, ``name=~"re"``, ``name!~"re"``; ValueError naming
        what is allowed otherwise (a regex RE2 cannot take included)."""
        m = _MATCHER.fullmatch(text)
        if m is None:
            raise ValueError(f'matcher {text[:80]!r}: expected name="value" (operators = != =~ !~)')
        name, op, raw = m.groups()
        value = raw.replace('\\"', '"').replace("\\\\", "\\")
        if op in ("=~", "!~"):
            try:
                compile_anchored(value)  # refused here, not on the first alert
            except RuleError as exc:
                raise ValueError(f"matcher {text[:80]!r}: {exc}") from None
        return cls(name, op, value)

    def matches(self, labels: Mapping[str, str]) -> bool:
        got = labels.get(self.name, "")
        if self.op == "=":
            return got == self.value
        if self.op == "!=":
            return got != self.value
        hit = compile_anchored(self.value).fullmatch(got) is not None
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True)
class InhibitRule:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()

    def inhibits(self, target: Mapping[str, str], source: Mapping[str, str]) -> bool:
        return (
            all(m.matches(target) for m in self.target)
            and all(m.matches(source) for m in self.source)
            and all(target.get(n, "") == source.get(n, "") for n in self.equal)
        )


Key = tuple[str, LabelPairs]


def _labels(name: str, labels: Mapping[str, str]) -> dict[str, str]:
    return {**labels, "alertname": name}


class Inhibitor:
    """Applies the rules to each tick's transitions; remembers what it holds back."""

    def __init__(self, rules: Sequence[InhibitRule]) -> None:
        self.rules = tuple(rules)
        self.held: dict[Key, tuple[AlertTransition, str]] = {}  # instance -> (it, by whom)

    def source_of(self, name: str, labels: Mapping[str, str], firing: Sequence[Key]) -> str | None:
        """The alert name of a firing source that inhibits this instance, if any (an alert
        never inhibits itself)."""
        target = _labels(name, labels)
        for rule in self.rules:
            for src_name, src_pairs in firing:
                source = _labels(src_name, dict(src_pairs))
                if source == target:
                    continue
                if rule.inhibits(target, source):
                    return src_name
        return None

    def apply(
        self, transitions: Sequence[AlertTransition], firing: Sequence[Key], now: float
    ) -> list[AlertTransition]:
        """The transitions to publish: those into firing that a source inhibits are marked
        ``inhibited_by``; an instance held back whose sources all stopped is published
        firing again, not inhibited (``firing`` -> ``firing``, at ``now``)."""
        if not self.rules:
            return list(transitions)
        out = []
        for tr in transitions:
            key = (tr.alertname, label_pairs(tr.labels))
            if tr.state == "firing":
                by = self.source_of(tr.alertname, tr.labels, firing)
                if by is not None:
                    self.held[key] = (tr, by)
                    tr = replace(tr, inhibited_by=by)
            else:
                self.held.pop(key, None)
            out.append(tr)
        for key, (tr, _) in list(self.held.items()):
            by = self.source_of(tr.alertname, tr.labels, firing)
            if by is None:
                del self.held[key]
                out.append(replace(tr, previous="firing", t=now, inhibited_by=None))
            else:
                self.held[key] = (tr, by)
        return out

    def inhibited_by(self, name: str, labels: Mapping[str, str]) -> str | None:
        held = self.held.get((name, label_pairs(labels)))
        return held[1] if held is not None else None
