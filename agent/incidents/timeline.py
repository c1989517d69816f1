"""The actions and pages of an incident's window, from the audit log (read off the loop)."""

from __future__ import annotations

from pathlib import Path

from pydantic import JsonValue

from kcops.agent.remediation.auditread import read_audit

MAX_EVENTS = 500


def actions_of(path: Path, start: float, end: float, alerts: set[str]) -> list[JsonValue]:
    """Each run for one of ``alerts`` (or asked over the API) and each page, in the window."""
    out: list[JsonValue] = []
    for rec in read_audit(path, start):
        ts = rec.get("ts")
        if not isinstance(ts, float | int) or ts > end or len(out) >= MAX_EVENTS:
            continue
        trig = rec.get("trigger") if isinstance(rec.get("trigger"), dict) else {}
        assert isinstance(trig, dict)
        if rec.get("kind") == "action" and (
            trig.get("alertname") in alerts or trig.get("source") == "api"
        ):
            detail = str(rec.get("detail") or rec.get("error") or "")[:300]
            out.append(
                {
                    "t": ts,
                    "kind": "action",
                    "action": rec.get("action"),
                    "outcome": rec.get("outcome"),
                    "alertname": trig.get("alertname"),
                    "what": f"{rec.get('action')} {rec.get('outcome')} (ended): {detail}",
                }
            )
        elif rec.get("kind") == "page":
            out.append(
                {
                    "t": ts,
                    "kind": "page",
                    "what": str(rec.get("message"))[:300],
                    "alertname": rec.get("alertname"),
                }
            )
    return out
