"""Alert intake: local rule transitions and Alertmanager alerts as one typed :class:`Alert`.

Both sources publish :class:`~kcops.agent.events.AlertTransition` on the bus
(the webhook with ``source="alertmanager"``, its fingerprint and ``startsAt`` in
reserved annotations). :meth:`Alert.of` reads either into the one shape the
ladder driver takes. :class:`AlertState` answers whether an alert is still
active (the local rule engine when there is one, else the transitions seen)
and which ladder steps a name has.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from kcops.agent.actions.alertmanager import FINGERPRINT, STARTS_AT
from kcops.agent.actions.records import Trigger
from kcops.agent.events import AlertSource, AlertTransition, Step

if TYPE_CHECKING:
    from kcops.agent.actions.base import Registry
    from kcops.agent.config import Config
    from kcops.agent.rules.loader import RuleSet

log = logging.getLogger("kcops.agent.actions")


class AlertsView(Protocol):
    """What remediation reads of the local rule engine (:class:`RulesComponent`)."""

    def is_firing(self, alertname: str, labels: Mapping[str, str] | None = None) -> bool: ...

    def active(self) -> Sequence[Mapping[str, object]]: ...

    def rule_names(self) -> list[str]: ...


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
        )


def ruleset_for_ladders(config: Config, registry: Registry) -> RuleSet | None:
    """The rule set the configuration names, its steps checked against ``registry``: for a
    remediation built without the app's (tests, an agent whose rule engine is off). A bad
    file is a log line and no ladders, never a failed start."""
    from kcops.agent.rules.loader import ruleset_from_config
    from kcops.agent.rules.model import RuleError

    try:
        return ruleset_from_config(config, registry.ladder_params())
    except RuleError as exc:
        log.warning("no ladders for cluster alerts: %s", exc)
        return None


def rule_ladders(ruleset: RuleSet | None) -> tuple[set[str], dict[str, tuple[Step, ...]]]:
    """Alert names and ladders of the one loaded rule set (cluster alerts carry no ladder)."""
    if ruleset is None:
        return set(), {}
    alerts = ruleset.alerts()
    return {a.name for a in alerts}, {a.name: a.remediation for a in alerts if a.remediation}


class AlertState:
    """Whether an alert is active, and the ladder steps of each alert name."""

    def __init__(self, alerts: AlertsView | None, ruleset: RuleSet | None) -> None:
        self.alerts = alerts
        self.rule_names_all, self.rule_ladders = rule_ladders(ruleset)
        # Steps that local transitions carried (the rule engine's own rule set).
        self.known_steps: dict[str, tuple[Step, ...]] = {}

    def note(self, ev: AlertTransition) -> None:
        """Keep the ladder a local transition carries (any state, pending too)."""
        if ev.remediation and ev.source == "local":
            self.known_steps[ev.alertname] = ev.remediation

    def local_active(self, name: str) -> bool | None:
        """Whether the local rule engine has ``name`` pending or firing; None without one."""
        alerts = self.alerts
        if alerts is None:
            return None
        try:
            if alerts.is_firing(name):
                return True
            for a in alerts.active():
                labels = a.get("labels")
                of = labels.get("alertname") if isinstance(labels, Mapping) else None
                if (a.get("alertname") or of) == name and a.get("state", "firing") in (
                    "pending",
                    "firing",
                ):
                    return True
            return False
        except Exception:
            log.exception("alerts service failed; using the transitions seen")
            return None

    def active(self, name: str, instances: Mapping[str, AlertSource]) -> bool:
        """Active: an Alertmanager instance fires, else the local rules say so (or, without
        a rule engine, a local instance fired and has not resolved)."""
        if any(src == "alertmanager" for src in instances.values()):
            return True
        local = self.local_active(name)
        if local is not None:
            return local
        return any(src == "local" for src in instances.values())

    def local_rule_names(self) -> set[str]:
        names = self.rule_names_all | set(self.known_steps)
        if self.alerts is not None:
            names |= set(self.alerts.rule_names())
        return names

    def steps_for(self, alert: Alert) -> tuple[Step, ...]:
        if alert.steps:
            return alert.steps
        return self.known_steps.get(alert.name) or self.rule_ladders.get(alert.name, ())
