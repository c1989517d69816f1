"""Template expansion is bounded in output and in work, whatever the template.

Issue 24: one ``printf`` width took the agent to 2.4 GB. The answers Go gives
were read from promtool 2.42 (``promtool test rules`` shows the annotations it
got): ``printf "%999999999d" 1`` is ``%!(NOVERB)%!(EXTRA int=1)``, and
``printf "%10000000d" 1 | printf "%.3s"`` is three spaces.
"""

from __future__ import annotations

import pytest

from kcops.agent.promql.model import RuleError
from kcops.agent.rules.templatebound import (
    MAX_OUTPUT_BYTES,
    TRUNCATED,
    TemplateStats,
)
from kcops.agent.rules.templates import compile_template


def render(src: str, stats: TemplateStats | None = None) -> str:
    return compile_template(src).render({"job": "j"}, 3.0, stats=stats)


def test_a_width_go_gives_up_on_formats_as_go_does() -> None:
    assert render('{{ printf "%999999999d" 1 }}') == "%!(NOVERB)%!(EXTRA int=1)"
    assert render('{{ printf "x%.99999999fy" 1.5 }}') == "x%!(NOVERB)%!(EXTRA float64=1.5)"


@pytest.mark.parametrize(
    "src",
    [
        '{{ printf "%9999999d" 1 }}',  # Go pads to ten million characters
        '{{ printf "%.9999999f" 1.5 }}',
        '{{ printf "%-9999999s|" "x" }}',
        '{{ printf "%065536d" 1 }}' * 50,  # many parts, each within the bound
        "é" * 70_000,  # the bound is in UTF-8 bytes, cut on a character
    ],
)
def test_a_large_expansion_is_cut_at_the_bound_with_a_marker(src: str) -> None:
    stats = TemplateStats()
    out = render(src, stats)
    assert len(out.encode()) <= MAX_OUTPUT_BYTES
    assert out.endswith(TRUNCATED) or len(out) == MAX_OUTPUT_BYTES
    assert stats.truncated <= 1


def test_the_cut_keeps_whole_characters_and_the_start() -> None:
    stats = TemplateStats()
    out = render("é" * 70_000, stats)
    assert out.startswith("éé") and out.endswith(TRUNCATED)
    assert MAX_OUTPUT_BYTES - 4 < len(out.encode()) <= MAX_OUTPUT_BYTES
    assert stats.truncated == 1


def test_nested_functions_past_the_work_bound_fail_as_a_failed_expansion() -> None:
    # Twenty 64 KiB arguments to one printf, each its own printf: 1.3 MB of text.
    args = " ".join(['(printf "%65536d" 1)'] * 20)
    stats = TemplateStats()
    out = render(f'{{{{ printf "{"%s" * 20}" {args} }}}}', stats)
    assert out.startswith("<error expanding template: its functions produced more than")
    assert stats.over_work == 1


def test_a_width_within_the_bound_still_gives_go_s_answer_through_a_pipeline() -> None:
    assert render('{{ printf "%10000000d" 1 | printf "%.3s" }}|') == "   |"
    assert render('{{ printf "%0100000d" 7 | humanize }}') == "7"


def test_ordinary_templates_are_untouched() -> None:
    stats = TemplateStats()
    assert render("{{ $labels.job }} at {{ $value | humanize }}", stats) == "j at 3"
    assert render('{{ printf "%8.2f|%-4s|" 3.14159 "ab" }}') == "    3.14|ab  |"
    assert stats == TemplateStats()


def test_an_integer_literal_past_int64_is_refused_at_load_in_one_line() -> None:
    with pytest.raises(RuleError, match="overflows int64"):
        compile_template('{{ printf "%d" ' + "1" * 5000 + " }}")
