"""The one duration parser: Prometheus's grammar and range (model.Duration)."""

from __future__ import annotations

import pytest

from kcops.agent.duration import DurationError, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), (0, 0.0), ("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("1w", 604800.0),
     ("1y2w3d4h5m6s7ms", 31536000 + 1209600 + 259200 + 14400 + 300 + 6.007),
     ("292y", 292 * 31536000.0)],
)  # fmt: skip
def test_prometheus_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["1.5m", "", "1m1h", "5", "-1s", "1 m", "abc", 1.5, None, "99999999999999999999y"]
)
def test_what_prometheus_refuses_is_refused(text: object) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)
