"""The one duration parser: Prometheus's grammar and range (model.Duration)."""

from __future__ import annotations

import pytest

from kcops.agent.duration import DurationError, format_duration, parse_duration, seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), (0, 0.0), ("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("1w", 604800.0),
     ("1y2w3d4h5m6s7ms", 31536000 + 1209600 + 259200 + 14400 + 300 + 6.007),
     ("292y", 292 * 31536000.0)],
)  # fmt: skip
def test_prometheus_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["1.5m", "", "1m1h", "5", "-1s", "1 m", "abc", 1.5, None, "99999999999999999999y", "5m\n"],
)
def test_what_prometheus_refuses_is_refused(text: object) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("292y", True),
        ("293y", False),  # promtool: "duration out of range"
        ("106751d", True),  # the largest whole number of days in (2**63 - 1) ns
        ("106752d", False),
        ("292y1w", True),
        ("292y40w", False),  # each term fits, the sum does not
        ("9223372036854ms", True),
        ("9223372036855ms", False),
        ("0000000000000000000000001s", True),  # leading zeros are not digits of range
    ],
)
def test_range_is_go_time_duration(text: str, ok: bool) -> None:
    if ok:
        assert parse_duration(text) > 0
    else:
        with pytest.raises(DurationError, match="out of range"):
            parse_duration(text)


def test_an_error_shows_a_short_excerpt() -> None:
    with pytest.raises(DurationError) as exc:
        parse_duration("1" * 100_000 + "x")
    assert len(str(exc.value)) < 200


@pytest.mark.parametrize(
    ("value", "want"),
    [(90, 90.0), (1.5, 1.5), ("1.5", 1.5), ("500ms", 0.5), ("5m", 300.0), (0, 0.0), ("0", 0.0)],
)
def test_config_and_flags_take_seconds_or_a_duration(value: object, want: float) -> None:
    assert seconds(value) == want


@pytest.mark.parametrize(
    "value", [True, -1, float("nan"), float("inf"), "1.5m", "fast", "293y", [1]]
)
def test_config_and_flags_refuse(value: object) -> None:
    with pytest.raises(DurationError):
        seconds(value)


def test_format_duration_is_prometheus_short_form() -> None:
    assert [format_duration(s) for s in (0, 0.5, 90, 3600, 5400, 86400 * 8)] == [
        "0s", "500ms", "1m30s", "1h", "1h30m", "1w1d",
    ]  # fmt: skip
