"""Alertmanager's webhook payload (version 4) as alert transitions.

Each alert becomes an :class:`AlertTransition` with ``source="alertmanager"``;
its fingerprint and ``startsAt`` travel in reserved annotations so the
remediation component can deduplicate it against local evaluation.
"""

from __future__ import annotations

from typing import Any

from kcops.agent.events import AlertTransition

FINGERPRINT = "__fingerprint__"
STARTS_AT = "__starts_at__"


class BadPayload(ValueError):
    pass


def transitions(payload: Any, now: float) -> list[AlertTransition]:
    """Parse a webhook body; raises BadPayload naming what is wrong."""
    if not isinstance(payload, dict):
        raise BadPayload("body must be a JSON object")
    version = str(payload.get("version", ""))
    if version != "4":
        raise BadPayload(f"unsupported webhook version {version!r}; allowed: '4'")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise BadPayload("'alerts' must be a list")
    out = []
    for i, a in enumerate(alerts):
        if not isinstance(a, dict) or not isinstance(a.get("labels"), dict):
            raise BadPayload(f"alerts[{i}]: needs a 'labels' object")
        labels = {str(k): str(v) for k, v in a["labels"].items()}
        name = labels.get("alertname")
        if not name:
            raise BadPayload(f"alerts[{i}]: labels have no alertname")
        status = a.get("status")
        if status not in ("firing", "resolved"):
            raise BadPayload(f"alerts[{i}]: status {status!r}; allowed: firing, resolved")
        raw_ann = a.get("annotations") or {}
        if not isinstance(raw_ann, dict):
            raise BadPayload(f"alerts[{i}]: 'annotations' must be an object")
        annotations = {str(k): str(v) for k, v in raw_ann.items()}
        if a.get("fingerprint"):
            annotations[FINGERPRINT] = str(a["fingerprint"])
        if a.get("startsAt"):
            annotations[STARTS_AT] = str(a["startsAt"])
        firing = status == "firing"
        out.append(
            AlertTransition(
                alertname=name,
                labels=labels,
                previous="inactive" if firing else "firing",
                state="firing" if firing else "inactive",
                t=now,
                annotations=annotations,
                source="alertmanager",
            )
        )
    return out
