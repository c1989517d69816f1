"""The read commands' source (kcops.cli.source): selectors checked, windows told honestly."""

from __future__ import annotations

import pytest

from kcops.cli.source import Source, Window, check_selector
from kcops.errors import ConfigError


@pytest.mark.parametrize(
    "text, want",
    [
        ('namespace="prod"', 'namespace="prod"'),
        ('{namespace="prod", pod=~"vllm-.*"}', 'namespace="prod", pod=~"vllm-.*"'),
        ('tenant!="a,b"', 'tenant!="a,b"'),
        ("", ""),
    ],
)
def test_selectors_are_label_matchers(text: str, want: str) -> None:
    assert check_selector(text) == want


@pytest.mark.parametrize("bad", ["prod", "namespace=prod", 'a="x" b="y"', 'up{a="b"}', '1a="x"'])
def test_a_bad_selector_is_named(bad: str) -> None:
    with pytest.raises(ConfigError, match="is not a label matcher"):
        check_selector(bad)


def test_a_selector_narrows_every_series() -> None:
    src = Source("http://127.0.0.1:1", "prometheus", 'namespace="prod"')
    try:
        assert src.sel("kcops_cost_full_total") == 'kcops_cost_full_total{namespace="prod"}'
        assert src.sel("m", 'le="+Inf"') == 'm{namespace="prod",le="+Inf"}'
        assert 'Prometheus at http://127.0.0.1:1 ({namespace="prod"})' in src.what
    finally:
        src.close()


def test_the_window_line_says_what_is_covered() -> None:
    day = Window(asked_start=0.0, start=86_400 - 3900, end=86_400.0)
    assert day.partial
    assert day.line("the agent at U") == (
        "window: covers 1h05m of the 1d00h asked (the agent at U holds nothing earlier)"
    )
    whole = Window(asked_start=0.0, start=0.0, end=600.0)
    assert not whole.partial and whole.line("X") == "window: the last 10m, all held by X"
    assert day.as_json()["covered_s"] == 3900


class FakeClient:
    def __init__(self, first: float) -> None:
        self.first = first

    def matrix(self, expr: str, start: float, end: float, step: float) -> list[object]:
        assert expr == "count(kcops_agent_build_info)"
        t, pts = start, {}
        while t <= end:
            if t >= self.first:
                pts[t] = 1.0
            t += step
        return [({}, pts)] if pts else []

    def close(self) -> None:
        pass


def test_coverage_starts_where_the_source_starts_holding_data() -> None:
    src = Source("http://127.0.0.1:1", "agent")
    src.client.close()
    src.client = FakeClient(first=80_000.0)  # type: ignore[assignment]
    cov = src.coverage(0.0, 86_400.0)
    step = 86_400.0 / 240
    assert 80_000.0 - 2 * step <= cov.start <= 80_000.0 and cov.partial
    src.client = FakeClient(first=0.0)  # type: ignore[assignment]
    assert src.coverage(0.0, 86_400.0).start == 0.0
    src.client = FakeClient(first=1e9)  # type: ignore[assignment]
    assert src.coverage(0.0, 86_400.0).start == 86_400.0  # holds nothing of the window


def test_narrow_adds_the_selector_to_each_bare_kcops_metric_only() -> None:
    s = Source("http://127.0.0.1:1", "prometheus", 'namespace="prod"')
    try:
        got = s.narrow(
            "histogram_quantile(0.99, sum by (le) (rate(kcops_ttft_seconds_bucket[1m])))"
            ' + max(kcops_a / kcops_b) + kcops_c{x="1"} + rate(other_total[1m])'
        )
    finally:
        s.close()
    assert 'rate(kcops_ttft_seconds_bucket{namespace="prod"}[1m])' in got
    assert 'max(kcops_a{namespace="prod"} / kcops_b{namespace="prod"})' in got
    assert 'kcops_c{x="1"}' in got and "other_total[1m]" in got  # its own braces kept
    plain = Source("http://127.0.0.1:1", "agent")
    assert plain.narrow("max(kcops_a)") == "max(kcops_a)"
    plain.close()
