from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


SERIES = [
    'vllm:num_requests_running{engine="0",model_name="m"}',
    'odd{path="/a b}c",q="x\\"}"}',  # a label value holding a brace, a space, a quote
    "bare_gauge",
    'hist_bucket{le="+Inf"}',
    'hist_bucket{le="0.5"}',
]
VALUES = ["1", "2.0", "NaN", "+Inf", "-Inf", "1e3", "0", "-0.5", "5"]


@settings(max_examples=150, deadline=None)
@given(
    pages=st.lists(
        st.lists(
            st.tuples(st.sampled_from(VALUES), st.none() | st.sampled_from(["1700000000000", "5"])),
            min_size=len(SERIES),
            max_size=len(SERIES),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_the_series_memo_parses_every_page_as_a_fresh_parser_does(
    pages: list[list[tuple[str, str | None]]],
) -> None:
    p = promtext.Parser()
    for page in pages:
        text = "".join(
            f"{s} {v}{'' if ts is None else ' ' + ts}\n"
            for s, (v, ts) in zip(SERIES, page, strict=True)
        )
        got, want = p.parse(text), promtext.parse(text)
        assert [(s.name, s.labels) for s in got] == [(s.name, s.labels) for s in want]
        for a, b in zip(got, want, strict=True):
            assert a.value == b.value or (math.isnan(a.value) and math.isnan(b.value)), text


def test_one_parser_selects_as_a_fresh_one_whatever_the_pages_and_wanted() -> None:
    """The name -> wanted? memo of a Parser: pages whose names change, a frozenset of
    families swapped for another, and a mutable set changed in place between calls."""
    text = FIXTURE.read_text()
    renamed = text.replace("vllm:num_requests_running", "vllm:num_requests_waiting_x")
    a = frozenset({"vllm:e2e_request_latency_seconds", "vllm:num_requests_running"})
    b = frozenset({"vllm:prefix_cache_hits", "vllm:num_requests_waiting_x"})
    mutable = set(a)
    p = promtext.Parser()
    for page, wanted in [(text, a), (renamed, a), (renamed, b), (text, b), (text, a)]:
        assert p.parse(page, wanted) == promtext.parse(page, wanted)
    assert p.parse(text, mutable) == promtext.parse(text, a)
    mutable.discard("vllm:num_requests_running")
    mutable.add("vllm:prefix_cache_hits")
    assert p.parse(text, mutable) == promtext.parse(text, frozenset(mutable))
    assert [s.name for s in p.parse(renamed, b)].count("vllm:num_requests_waiting_x") == 1
    sample_names = {n for n, line in promtext._iter_lines(renamed) if line[0] != "#"}
    assert set(p._picked) == sample_names  # the memo holds one page of names
