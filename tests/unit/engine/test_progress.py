"""Progress as a signal: the pure step, as a table; each engine kind's counters."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcops.agent.collectors import promtext
from kcops.agent.engine import progress as pg
from kcops.agent.engine.kinds import builtin_kinds
from kcops.agent.engine.progress import ProgressVerdict as V
from kcops.agent.engine.watch import kind_counters

GEN = "kcops_generation_tokens_total"
BEAT = "kcops_attention_calls_total"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def r(pending: float | None, **counters: float) -> pg.Reading:
    return pg.Reading(
        pending, {k.replace("gen", GEN).replace("beat", BEAT): v for k, v in counters.items()}
    )


# (what, readings at t = 0, 1, 2, ..., the last tick's verdict and stalled_s)
S = [r(2, gen=5)] * 4  # work pending, the counter still
CASES = [
    ("idle engine: absent", [r(0, gen=5)] * 3, V.IDLE, None),
    ("tokens moving: 0", [r(2, gen=5), r(2, gen=6), r(2, gen=9)], V.PROGRESSING, 0.0),
    ("work pending, nothing moves: grows", S, V.STILL, 3.0),
    (
        "long prefill: tokens still, heartbeat moves",
        [r(1, gen=5, beat=10), r(1, gen=5, beat=40), r(1, gen=5, beat=70)],
        V.PROGRESSING,
        0.0,
    ),
    (
        "heartbeat stops too: grows",
        [r(1, gen=5, beat=10), r(1, gen=5, beat=40), r(1, gen=5, beat=40), r(1, gen=5, beat=40)],
        V.STILL,
        2.0,
    ),
    ("work arrives at an idle engine: from the idle tick", [r(0, gen=5), *S[:2]], V.STILL, 2.0),
    ("pending unknown: absent", [r(2, gen=5), r(None, gen=5)], V.UNKNOWN, None),
    ("no progress counter: absent, not healthy", [r(2), r(2)], V.UNKNOWN, None),
    ("a counter reset (restart) is progress", [*S[:2], r(2, gen=0)], V.PROGRESSING, 0.0),
    ("progress ends a stall", [*S[:3], r(2, gen=6)], V.PROGRESSING, 0.0),
    ("unknown then known: not stalled at once", [r(None, gen=5), *S[:2]], V.STILL, 1.0),
]


@pytest.mark.parametrize(
    ("readings", "verdict", "stalled"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_progress_step(readings: list[pg.Reading], verdict: V, stalled: float | None) -> None:
    state = pg.ProgressState()
    j = None
    for t, reading in enumerate(readings):
        state, j = pg.step(state, reading, float(t))
    assert j is not None
    assert j.verdict is verdict
    assert j.stalled_s == stalled


def test_missing_counters_are_named() -> None:
    _, j = pg.step(pg.ProgressState(), r(1, gen=3), 0.0)
    assert GEN not in j.missing
    assert BEAT in j.missing and "kcops_engine_iterations_total" in j.missing


def test_each_kind_says_which_progress_counters_it_maps() -> None:
    kinds = {k.name: kind_counters(k) for k in builtin_kinds()}
    assert kinds["vllm"] == pg.COUNTERS
    assert kinds["sglang"] == ("kcops_generation_tokens_total", "kcops_prompt_tokens_total")
    assert kinds["kcops"] == pg.COUNTERS
    # TGI and Triton count neither tokens nor steps as they happen: nothing, said so.
    assert kinds["tgi"] == () and kinds["triton"] == ()


def test_vllm_page_maps_to_pending_and_progress() -> None:
    a = builtin_kinds().get("vllm").adapter
    got = {
        s.name: s.value
        for s in a.map(promtext.parse((FIXTURES / "vllm_metrics.txt").read_text(), a.wanted()))
    }
    assert got["kcops_requests_running"] == 2.0 and got["kcops_requests_waiting"] == 1.0
    assert got["kcops_generation_tokens_total"] == 2304.0
    assert got["kcops_prompt_tokens_total"] == 614.0
    assert got["kcops_engine_iterations_total"] == 144.0  # vllm:iteration_tokens_total_count
