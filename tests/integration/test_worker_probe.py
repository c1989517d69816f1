"""Item 7: the worker's attention (``kcops_topn``) is seen by the kcops.kernels probe,
and the NaN drill shows up as probe ``nan`` errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import kcops.kernels as kernels
from kcops.kernels.config import ProbeConfig
from kcops.worker.app import WorkerOptions, build
from kcops.worker.engine import Event, GenRequest
from kcops.worker.server import WorkerState


@pytest.fixture
def probed() -> Iterator[tuple[WorkerState, kernels.Probe]]:
    torch.set_num_threads(1)
    state = build(WorkerOptions(model="tiny", long_threshold=10_000, progress=False))
    probe = kernels.install(ProbeConfig(publish=False, flush_interval_ms=600_000, nvtx=False))
    try:
        yield state, probe
    finally:
        kernels.uninstall()


def generate(state: WorkerState, n: int = 3) -> list[Event]:
    events: list[Event] = []
    state.engine.submit(
        GenRequest(prompt_ids=list(range(300, 340)), max_tokens=n, emit=events.append)
    )
    with torch.inference_mode():
        for _ in range(n + 1):
            state.engine._iteration()
    return events


def test_probe_counts_worker_attention_and_nan_drill(
    probed: tuple[WorkerState, kernels.Probe],
) -> None:
    state, probe = probed
    assert generate(state)[-1].kind == "done"
    agg = probe.aggregator
    probe.resolve_pending()
    assert set(agg.calls) >= {"0", "1"} and agg.errors["nan"] == 0
    state.faults.apply({"nan": True})
    generate(state)
    probe.resolve_pending()
    assert agg.errors["nan"] > 0
