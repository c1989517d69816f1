"""Alert intake: local rule transitions and Alertmanager alerts as one typed :class:`Alert`.

Both sources publish :class:`~kcops.agent.events.AlertTransition` on the bus
(the webhook with ``source="alertmanager"``, its fingerprint and ``startsAt`` in
reserved annotations). :meth:`Alert.of` reads either into the one shape the
ladder driver takes. :class:`AlertState` answers whether an alert is still
active and which ladder steps a name has, from what was pushed to it alone: the
rule engine publishes every change of state (pending included), so the
transitions seen are the engine's state; remediation never asks the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from kcops.agent.events import AlertSource, AlertTransition, Step
from kcops.agent.remediation.alertmanager import FINGERPRINT, STARTS_AT
from kcops.agent.remediation.records import Trigger

if TYPE_CHECKING:
    from kcops.agent.rules.loader import RuleSet


def fingerprint(source: str, labels: Mapping[str, str]) -> str:
    return source + ":" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def parse_time(value: str | None) -> float | None:
    """RFC 3339 (Alertmanager's startsAt, nanoseconds allowed) to Unix seconds."""
    if not value or value.startswith("0001-"):
        return None
    text = value.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Alert:
    """One alert instance that fired or resolved, whichever source told of it."""

    name: str
    fp: str  # the instance: Alertmanager's fingerprint, or source and labels
    source: AlertSource
    firing: bool  # False: resolved (inactive)
    labels: Mapping[str, str]
    trigger: Trigger  # what the audit records and the ladder keep
    steps: tuple[Step, ...] = ()  # the local rule's ladder (Alertmanager's carry none)
    starts_at: float | None = None  # Alertmanager's startsAt (Unix s)
    inhibited_by: str | None = None  # the alert inhibiting it: recorded, not acted on

    @classmethod
    def of(cls, ev: AlertTransition) -> Alert | None:
        """The alert of a transition; None for one that is neither firing nor resolved."""
        if ev.state not in ("firing", "inactive"):
            return None
        fp = ev.annotations.get(FINGERPRINT) if ev.source == "alertmanager" else None
        return cls(
            name=ev.alertname,
            fp=fingerprint(ev.source, ev.labels) if fp is None else f"alertmanager:{fp}",
            source=ev.source,
            firing=ev.state == "firing",
            labels=dict(ev.labels),
            trigger=Trigger.of(ev),
            steps=ev.remediation if ev.source == "local" else (),
            starts_at=parse_time(ev.annotations.get(STARTS_AT)),
            inhibited_by=ev.inhibited_by,
        )


def rule_ladders(ruleset: RuleSet | None) -> tuple[set[str], dict[str, tuple[Step, ...]]]:
    """Alert names and ladders of the one loaded rule set (cluster alerts carry no ladder)."""
    if ruleset is None:
        return set(), {}
    alerts = ruleset.alerts()
    return {a.name for a in alerts}, {a.name: a.remediation for a in alerts if a.remediation}


class AlertState:
    """Whether an alert is active, and the ladder steps of each alert name."""

    def __init__(self, ruleset: RuleSet | None) -> None:
        self.rule_names_all, self.rule_ladders = rule_ladders(ruleset)
        # Steps that local transitions carried (the rule engine's own rule set).
        self.known_steps: dict[str, tuple[Step, ...]] = {}
        # Local instances pending or firing: alertname -> fingerprints.
        self.local: dict[str, set[str]] = {}

    def note(self, ev: AlertTransition) -> None:
        """Keep what a local transition says: its ladder, and whether it is active."""
        if ev.source != "local":
            return
        if ev.remediation:
            self.known_steps[ev.alertname] = ev.remediation
        fp = fingerprint(ev.source, ev.labels)
        if ev.state in ("pending", "firing"):
            self.local.setdefault(ev.alertname, set()).add(fp)
        else:
            instances = self.local.get(ev.alertname)
            if instances is not None:
                instances.discard(fp)
                if not instances:
                    del self.local[ev.alertname]

    def active(self, name: str, instances: Mapping[str, AlertSource]) -> bool:
        """Active: an Alertmanager instance fires, or a local one is pending or firing."""
        if any(src == "alertmanager" for src in instances.values()):
            return True
        return name in self.local

    def local_rule_names(self) -> set[str]:
        return self.rule_names_all | set(self.known_steps)

    def steps_for(self, alert: Alert) -> tuple[Step, ...]:
        if alert.steps:
            return alert.steps
        return self.known_steps.get(alert.name) or self.rule_ladders.get(alert.name, ())
