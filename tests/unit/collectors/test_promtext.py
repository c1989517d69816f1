from __future__ import annotations

from pathlib import Path

import pytest

from kcops.agent.collectors import promtext
from kcops.agent.collectors.promtext import ExpositionError

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_metrics.txt"


def test_prefilter_keeps_exactly_the_wanted_families() -> None:
    text = FIXTURE.read_text()
    full = promtext.parse(text)
    wanted = {"vllm:e2e_request_latency_seconds", "vllm:prefix_cache_hits"}
    part = promtext.parse(text, wanted)
    assert part == [s for s in full if promtext.family_base(s.name) in wanted]
    assert part


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("<html><body>502 Bad Gateway</body></html>\n", "parse"),
        ('vllm:num_requests_running{model_name="m"} 1\nvllm:num_requ', "truncated"),
        ('vllm:x{a="b" 1\n', "parse"),
        ('# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n', "truncated"),
        ("{}\n", "parse"),
    ],
)
def test_bad_pages_are_refused_with_a_reason(body: str, reason: str) -> None:
    with pytest.raises(ExpositionError) as info:
        promtext.parse(body, None)
    assert info.value.reason == reason


def test_garbage_is_refused_even_when_filtered_out() -> None:
    with pytest.raises(ExpositionError):
        promtext.parse("hello world\x00\n<p>\n", {"vllm:x"})


def test_empty_page_is_empty() -> None:
    assert promtext.parse("", {"x"}) == []


def test_html_without_final_newline_is_garbage_not_truncation() -> None:
    with pytest.raises(ExpositionError) as info:
        promtext.parse("<html><h1>502</h1></html>", None)
    assert info.value.reason == "parse"


def test_parser_memo_gives_the_same_answer_and_holds_one_page() -> None:
    text = FIXTURE.read_text()
    wanted = {"vllm:e2e_request_latency_seconds", "vllm:num_requests_running"}
    p = promtext.Parser()
    first = p.parse(text, wanted)
    changed = text.replace(
        'vllm:num_requests_running{engine="0",model_name="SmolLM2-135M-Instruct"} 2.0',
        'vllm:num_requests_running{engine="0",model_name="SmolLM2-135M-Instruct"} 5.0',
    )
    second = p.parse(changed, wanted)
    assert second == promtext.parse(changed, wanted)
    assert [s.value for s in second if s.name == "vllm:num_requests_running"] == [5.0]
    assert len(p._memo) == len(first)
    with pytest.raises(ExpositionError):
        p.parse('vllm:num_requests_running{engine="0" 1\n', wanted)
