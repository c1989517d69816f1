"""The batching loop, stepped by hand on the tiny model: batched rows equal single runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kcops.worker.app import WorkerOptions, build
from kcops.worker.engine import Event, GenRequest
from kcops.worker.server import WorkerState


@pytest.fixture(scope="module")
def state() -> Iterator[WorkerState]:
    torch.set_num_threads(1)
    yield build(WorkerOptions(model="tiny", long_threshold=10_000, progress=False))


def run(state: WorkerState, prompts: list[list[int]], max_tokens: int = 6) -> list[list[Event]]:
    eng = state.engine
    events: list[list[Event]] = [[] for _ in prompts]
    for i, p in enumerate(prompts):
        eng.submit(GenRequest(prompt_ids=p, max_tokens=max_tokens, emit=events[i].append))
    with torch.inference_mode():
        for _ in range(max_tokens + 2):
            eng._iteration()
    return events


def text(evs: list[Event]) -> str:
    assert evs[-1].kind == "done", evs
    return "".join(e.text for e in evs if e.kind == "delta")


@pytest.mark.slow
def test_batched_decode_equals_single_runs(state: WorkerState) -> None:
    tok: Any = state.engine.tok
    prompts = [tok(f"Number {i} is" + " big" * i).input_ids for i in range(4)]
    state.engine.cache.evict("all")
    alone = [text(run(state, [p])[0]) for p in prompts]
    state.engine.cache.evict("all")
    state.engine.max_batch_seen = 0
    together = [text(e) for e in run(state, prompts)]
    assert state.engine.max_batch_seen == 4  # one cohort of four, left-padded
    assert together == alone
    assert state.engine.running == 0 and state.engine.waiting == 0


def test_cached_prefix_gives_the_same_tokens(state: WorkerState) -> None:
    prompt = list(range(100, 150))
    state.engine.cache.evict("all")
    first = text(run(state, [prompt])[0])
    second = text(run(state, [prompt])[0])
    assert first == second and state.engine.cache.blocks == 3


def test_usage_and_finish_reason(state: WorkerState) -> None:
    done = run(state, [list(range(200, 210))], max_tokens=3)[0][-1]
    assert done.finish_reason == "length"
    assert done.usage == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


@pytest.mark.slow
def test_batched_optimized_path_equals_single_runs() -> None:
    opts = WorkerOptions(
        model="tiny", long_threshold=8, top_n=16, dense_layers=frozenset(), progress=False
    )
    st = build(opts)
    prompts = [list(range(500 + i, 540 + 3 * i)) for i in range(3)]  # 40..46 tokens
    alone = [text(run(st, [p])[0]) for p in prompts]
    st.engine.cache.evict("all")
    together = [text(e) for e in run(st, prompts)]
    assert st.engine.max_batch_seen == 3 and together == alone


def test_every_engine_step_is_counted_for_stall_detection(state: WorkerState) -> None:
    """vllm:iteration_tokens_total: one observation per step that did work (the agent
    reads its count as kcops_engine_iterations_total); an idle step counts nothing."""

    def steps() -> float:
        page = state.engine.metrics.exposition()[0].decode()
        line = next(
            x for x in page.splitlines() if x.startswith("vllm:iteration_tokens_total_count")
        )
        return float(line.rsplit(" ", 1)[1])

    before = steps()
    evs = run(state, [list(range(200, 220))], max_tokens=3)[0]
    assert evs[-1].kind == "done"
    after = steps()
    assert after - before >= 2  # prefill + first decode in one step, then the next decode
    with torch.inference_mode():
        state.engine._iteration()  # nothing queued, nothing running
    assert steps() == after
