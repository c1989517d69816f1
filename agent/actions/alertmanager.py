"""Alertmanager's webhook payload (version 4) as alert transitions.

Each alert becomes an :class:`AlertTransition` with ``source="alertmanager"``;
its fingerprint and ``startsAt`` travel in reserved annotations so the
remediation component can deduplicate it against local evaluation.

The body is input from the network: it is bounded before anything is kept —
at most :data:`MAX_ALERTS` alerts per request (413 beyond: set ``max_alerts``
in Alertmanager's webhook_config), :data:`MAX_LABELS` labels or annotations
per alert, names up to :data:`MAX_NAME_CHARS` and values up to
:data:`MAX_VALUE_CHARS` characters (400 beyond, naming the alert).
"""

from __future__ import annotations

from typing import Any

from kcops.agent.events import AlertTransition

FINGERPRINT = "__fingerprint__"
STARTS_AT = "__starts_at__"

MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_NAME_CHARS = 128
MAX_VALUE_CHARS = 2048
# Distinct alert instances (fingerprints) one remediation ladder tracks; the
# remediation component caps its per-ladder map with this.
MAX_LADDER_INSTANCES = 256


class BadPayload(ValueError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:60] + "..."


def _strings(raw: Any, what: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise BadPayload(f"{what} must be an object")
    if len(raw) > MAX_LABELS:
        raise BadPayload(f"{what}: {len(raw)} entries, at most {MAX_LABELS}")
    out = {}
    for k, v in raw.items():
        if isinstance(v, dict | list) or v is None:
            raise BadPayload(f"{what}[{_short(k)}]: values must be strings")
        value = str(v)
        if len(k) > MAX_NAME_CHARS or len(value) > MAX_VALUE_CHARS:
            raise BadPayload(
                f"{what}[{_short(k)}]: names up to {MAX_NAME_CHARS} and values up to "
                f"{MAX_VALUE_CHARS} characters"
            )
        out[str(k)] = value
    return out


def _one(i: int, a: Any, now: float) -> AlertTransition:
    if not isinstance(a, dict) or not isinstance(a.get("labels"), dict):
        raise BadPayload(f"alerts[{i}]: needs a 'labels' object")
    labels = _strings(a["labels"], f"alerts[{i}].labels")
    name = labels.get("alertname")
    if not name:
        raise BadPayload(f"alerts[{i}]: labels have no alertname")
    status = a.get("status")
    if status not in ("firing", "resolved"):
        raise BadPayload(f"alerts[{i}]: status {_short(status)}; allowed: firing, resolved")
    annotations = _strings(a.get("annotations") or {}, f"alerts[{i}].annotations")
    for key, field in ((FINGERPRINT, "fingerprint"), (STARTS_AT, "startsAt")):
        v = a.get(field)
        if v:
            if not isinstance(v, str) or len(v) > MAX_NAME_CHARS:
                raise BadPayload(f"alerts[{i}].{field}: a string up to {MAX_NAME_CHARS} chars")
            annotations[key] = v
    firing = status == "firing"
    return AlertTransition(
        alertname=name,
        labels=labels,
        previous="inactive" if firing else "firing",
        state="firing" if firing else "inactive",
        t=now,
        annotations=annotations,
        source="alertmanager",
    )


def transitions(payload: Any, now: float) -> list[AlertTransition]:
    """Parse a webhook body; raises BadPayload naming what is wrong (and its HTTP status)."""
    if not isinstance(payload, dict):
        raise BadPayload("body must be a JSON object")
    version = payload.get("version", "")
    if not isinstance(version, str | int) or str(version) != "4":
        raise BadPayload(f"unsupported webhook version {_short(version)}; allowed: '4'")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise BadPayload("'alerts' must be a list")
    if len(alerts) > MAX_ALERTS:
        raise BadPayload(
            f"{len(alerts)} alerts in one request, at most {MAX_ALERTS}: set max_alerts in "
            "Alertmanager's webhook_config",
            status=413,
        )
    return [_one(i, a, now) for i, a in enumerate(alerts)]
