"""Annotation templating: the Go text/template subset, printing numbers as Go does."""

from __future__ import annotations

import math

import pytest

from kcops.agent.promql.gofmt import go_float
from kcops.agent.rules.templates import compile_template


@pytest.mark.parametrize(
    ("v", "text"),
    [
        (0.0, "0"),
        (1.5, "1.5"),
        (100.0, "100"),
        (123456.0, "123456"),
        (1e6, "1e+06"),
        (1234567.0, "1.234567e+06"),
        (0.0001, "0.0001"),
        (1e-05, "1e-05"),
        (1 / 3, "0.3333333333333333"),
        (math.nan, "NaN"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
    ],
)
def test_go_float(v: float, text: str) -> None:
    assert go_float(v) == text


@pytest.mark.parametrize(
    ("tmpl", "value", "want"),
    [
        ("{{ $value }}", 0.25, "0.25"),
        ("{{ $labels.engine }}/{{ .Labels.engine }}", 1.0, "e1/e1"),
        ("{{ $labels.missing }}", 1.0, ""),
        ("{{ $value | humanize }}", 1234567.0, "1.235M"),
        ("{{ humanize $value }}", 0.00123, "1.23m"),
        ("{{ $value | humanizePercentage }}", 0.9512, "95.12%"),
        ("{{ $value | humanizeDuration }}", 0.25, "250ms"),
        ("{{ $value | humanizeDuration }}", 3725.0, "1h 2m 5s"),
        ("{{ $value | humanizeDuration }}", 45.5, "45.5s"),
        ("{{ $value | humanize1024 }}", 2048.0, "2ki"),
        ('{{ printf "%.2f" $value }}', 3.14159, "3.14"),
        ('{{ printf "%s=%v" $labels.engine $value }}', 2.0, "e1=2"),
        ("{{- $value -}} s", 1.0, "1s"),
        ("{{ $value | humanize | toUpper }}", 1500.0, "1.5K"),
    ],
)
def test_render(tmpl: str, value: float, want: str) -> None:
    assert compile_template(tmpl).render({"engine": "e1"}, value) == want
