"""Events passed between the agent's parts: alert transitions.

The rule engine publishes an :class:`AlertTransition` on every state change
(pending included); remediation subscribes, and takes alerts from nowhere else.
Its Alertmanager webhook publishes the same type with ``source="alertmanager"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import JsonValue

from kcops.agent.outcome import ActionName

AlertStateName = Literal["inactive", "pending", "firing"]
# The verify window of a ladder step that names none (``actions.guards.default_verify_s``).
DEFAULT_VERIFY_S = 60.0


AlertSource = Literal["local", "alertmanager"]


@dataclass(frozen=True)
class Step:
    """One rung of an alert's escalation ladder (the rule's ``remediation:`` block), the one
    form of a step from the rule loader through the ladder and state file to the runner."""

    action: ActionName
    params: Mapping[str, JsonValue] = field(default_factory=dict)
    verify_s: float = DEFAULT_VERIFY_S

    def __post_init__(self) -> None:
        if not self.verify_s >= 0:
            raise ValueError(f"verify_s must be >= 0, got {self.verify_s}")


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
    remediation: tuple[Step, ...] = ()
    source: AlertSource = "local"
    # The alert that inhibits this one while it fires (the rule file's inhibit_rules):
    # recorded, never a ladder nor a page.
    inhibited_by: str | None = None


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
