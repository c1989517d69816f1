"""Events passed between the agent's parts: alert transitions.

The rule engine publishes an :class:`AlertTransition` on every state change;
the remediation runner and the audit log subscribe. The Alertmanager webhook
publishes the same type with ``source="alertmanager"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

AlertStateName = Literal["inactive", "pending", "firing"]
# The verify window of a ladder step that names none (``actions.guards.default_verify_s``).
DEFAULT_VERIFY_S = 60.0


@dataclass(frozen=True)
class RemediationStep:
    """One rung of an alert's escalation ladder (the rule's ``remediation:`` block)."""

    action: str
    params: Mapping[str, Any] = field(default_factory=dict)
    verify_s: float = DEFAULT_VERIFY_S


@dataclass(frozen=True)
class AlertTransition:
    """An alert instance (rule + label set) changed state at time ``t`` (Unix s).

    ``state`` is the new state; "inactive" after "firing" means resolved.
    """

    alertname: str
    labels: Mapping[str, str]
    previous: AlertStateName
    state: AlertStateName
    t: float
    value: float | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    remediation: tuple[RemediationStep, ...] = ()
    source: Literal["local", "alertmanager"] = "local"

    @property
    def resolved(self) -> bool:
        return self.previous == "firing" and self.state == "inactive"

    def to_json(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "alertname": self.alertname,
            "labels": dict(self.labels),
            "previous": self.previous,
            "state": self.state,
            "value": self.value,
            "source": self.source,
        }


Subscriber = Callable[[AlertTransition], None]


class EventBus:
    """Synchronous fan-out of transitions to subscribers, in subscription order.

    A subscriber that raises is logged and does not stop the others.
    """

    def __init__(self) -> None:
        self._subs: list[Subscriber] = []

    def subscribe(self, fn: Subscriber) -> None:
        self._subs.append(fn)

    def publish(self, event: AlertTransition) -> None:
        import logging

        for fn in list(self._subs):
            try:
                fn(event)
            except Exception:
                logging.getLogger("kcops.agent.events").exception(
                    "subscriber %r failed on %s", fn, event.alertname
                )
