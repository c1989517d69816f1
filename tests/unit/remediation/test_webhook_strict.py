"""Issue 24, classes 10 and 12: the Alertmanager webhook over its cap, and its fields read
strictly in Alertmanager's own types (template.Data)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kcops.agent.jsonapi import strict_json
from kcops.agent.remediation.alertmanager import MAX_ALERTS, BadPayload, parse_webhook

T0 = "2024-05-01T12:00:00.123456789Z"


def alert(name: object = "A", status: str = "firing", **extra: Any) -> dict[str, Any]:
    labels = extra.pop("labels", {})
    return {"status": status, "labels": {"alertname": name, **labels}, "startsAt": T0, **extra}


def body(*alerts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"version": "4", "alerts": list(alerts), **extra}


def test_over_the_cap_takes_the_most_severe_and_counts_the_rest() -> None:
    alerts = (
        [alert(f"O{i}", labels={"severity": "info"}) for i in range(3000)]
        + [alert(f"TR{i}", "resolved", labels={"severity": "ticket"}) for i in range(300)]
        + [alert(f"TF{i}", labels={"severity": "ticket"}) for i in range(300)]
        + [alert(f"PR{i}", "resolved", labels={"severity": "page"}) for i in range(200)]
        + [alert(f"PF{i}", labels={"severity": "page"}) for i in range(1400)]
    )  # 5,200 as in the issue
    d = parse_webhook(body(*alerts), 0.0)
    names = [e.alertname for e in d.events]
    assert len(names) == MAX_ALERTS == 1000
    # pages that fire first: 1000 of the 1400, in the order Alertmanager sent them
    assert names == [f"PF{i}" for i in range(1000)]
    assert d.dropped == {"page": 600, "ticket": 600, "other": 3000}
    ans = d.answer()
    assert ans["accepted"] == 1000 and ans["dropped"] == 4200
    assert "max_alerts" in str(ans["warning"])


def test_firing_before_resolved_and_page_before_ticket() -> None:
    alerts = [alert(f"T{i}", labels={"severity": "ticket"}) for i in range(600)]
    alerts += [alert(f"PR{i}", "resolved", labels={"severity": "critical"}) for i in range(300)]
    alerts += [alert(f"X{i}") for i in range(300)]  # no severity: last
    alerts += [alert(f"PF{i}", labels={"severity": "page"}) for i in range(200)]
    d = parse_webhook(body(*alerts), 0.0)
    names = {e.alertname for e in d.events}
    assert {f"PF{i}" for i in range(200)} <= names and {f"PR{i}" for i in range(300)} <= names
    assert len({n for n in names if n.startswith("T")}) == 500
    assert d.dropped == {"ticket": 100, "other": 300}


def test_at_the_cap_nothing_is_dropped_and_the_answer_is_as_before() -> None:
    d = parse_webhook(body(*[alert() for _ in range(MAX_ALERTS)]), 0.0)
    assert d.answer() == {"accepted": MAX_ALERTS}


def test_a_bad_alert_that_is_not_taken_fails_nothing() -> None:
    alerts = [alert(labels={"severity": "page"}) for _ in range(MAX_ALERTS)] + [{"bogus": 1}]
    assert parse_webhook(body(*alerts), 0.0).dropped == {"other": 1}


def test_truncated_alerts_from_alertmanager_are_counted() -> None:
    d = parse_webhook(body(alert(), truncatedAlerts=7), 0.0)
    assert d.truncated == 7 and d.answer()["truncated_by_alertmanager"] == 7
    for bad in (-1, "7", 1.5, True):
        with pytest.raises(BadPayload, match="truncatedAlerts"):
            parse_webhook(body(alert(), truncatedAlerts=bad), 0.0)


STRICT_BAD: list[tuple[str, dict[str, Any], str]] = [
    ("alertname a number", body(alert(42)), "alerts[0].labels['alertname']: must be a string"),
    ("alertname null", body(alert(None)), "must be a string"),
    ("a label a bool", body(alert(labels={"x": True})), "must be a string"),
    ("an annotation a number", body(alert(annotations={"s": 1.5})), "must be a string"),
    ("version a number", {"version": 4, "alerts": []}, "unsupported webhook version"),
    ("startsAt impossible", body(alert(startsAt="2024-13-45T00:00:00Z")), "not a real time"),
    ("startsAt 25 o'clock", body(alert(startsAt="2024-01-01T25:00:00Z")), "not a real time"),
    ("startsAt no zone", body(alert(startsAt="2024-01-01T00:00:00")), "not an RFC 3339"),
    ("startsAt a date", body(alert(startsAt="2024-01-01")), "not an RFC 3339"),
    ("startsAt a space", body(alert(startsAt="2024-01-01 00:00:00Z")), "not an RFC 3339"),
    ("startsAt a number", body(alert(startsAt=1714564800)), "not an RFC 3339"),
    ("startsAt the zero time", body(alert(startsAt="0001-01-01T00:00:00Z")), "zero time"),
    ("endsAt garbage", body(alert(endsAt="soon")), "endsAt: 'soon' is not an RFC 3339"),
    ("endsAt before startsAt", body(alert(endsAt="2020-01-01T00:00:00Z")), "before startsAt"),
    ("status other", body(alert(status="pending")), "allowed: firing, resolved"),
    ("fingerprint a number", body(alert(fingerprint=12)), "fingerprint: must be a string"),
    ("generatorURL a list", body(alert(generatorURL=[])), "generatorURL: must be a string"),
]


@pytest.mark.parametrize(("name", "payload", "needle"), STRICT_BAD, ids=[c[0] for c in STRICT_BAD])
def test_fields_in_alertmanagers_types(name: str, payload: dict[str, Any], needle: str) -> None:
    with pytest.raises(BadPayload) as err:
        parse_webhook(payload, 0.0)
    assert needle in str(err.value), str(err.value)
    assert err.value.status == 400


def test_what_alertmanager_sends_passes() -> None:
    ok = alert(
        endsAt="0001-01-01T00:00:00Z",  # Go's zero time: not ended
        generatorURL="http://prometheus/graph",
        fingerprint="c4b2e2f54b5c6d1a",
        annotations={"summary": "s"},
    )
    resolved = alert("B", "resolved", startsAt="2024-05-01T12:00:00+02:00",
                     endsAt="2024-05-01T12:05:00.5+02:00")  # fmt: skip
    d = parse_webhook(body(ok, resolved, groupKey="{}:{}", truncatedAlerts=0), 0.0)
    assert [e.alertname for e in d.events] == ["A", "B"] and d.dropped == {}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"version": "4", "alerts": [{"x": NaN}]}', "bare NaN"),
        ('{"a": Infinity}', "bare Infinity"),
        ('{"a": -Infinity}', "bare -Infinity"),
        ('{"a": 1e999}', "out of range"),
        ('{"a": 1, "a": 2}', "appears twice"),
    ],
)
def test_request_bodies_are_strict_json(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        strict_json(text)
    assert strict_json('{"a": 1.5, "b": [1, null]}') == json.loads('{"a": 1.5, "b": [1, null]}')
