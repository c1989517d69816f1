"""Issue 25 part 2: the probe's K(C) attributed to the worker's requests.

A cohort decodes several requests in one batch; with every call sampled, each
request gets K(C) samples of its own rows, and its effective context (the mean
K_p) is exported beside its full context, by model and tenant."""

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
    probe = kernels.install(
        ProbeConfig(
            publish=False,
            flush_interval_ms=600_000,
            nvtx=False,
            sample_rate=1.0,
            record=True,
            max_batch_rows=8,
        )
    )
    try:
        yield state, probe
    finally:
        kernels.uninstall()


def _page(state: WorkerState) -> str:
    return state.metrics.exposition()[0].decode()


def _value(page: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in page.splitlines():
        if line.startswith(name + "{"):
            head, _, value = line.rpartition(" ")
            got = ",".join(sorted(head[len(name) + 1 : -1].split(",")))
            if got == want:
                return float(value)
    return None


def test_each_batched_request_gets_its_own_kc(probed: tuple[WorkerState, kernels.Probe]) -> None:
    state, probe = probed
    events: list[Event] = []
    reqs = [
        GenRequest(prompt_ids=list(range(300, 300 + n)), max_tokens=4, emit=events.append, tenant=t)
        for n, t in ((40, "acme"), (50, "acme"), (60, "globex"))
    ]
    for r in reqs:
        state.engine.submit(r)
    with torch.inference_mode():
        for _ in range(6):
            state.engine._iteration()
    assert state.engine.max_batch_seen == 3  # one cohort: rows 0..2 of one batch
    probe.resolve_pending()
    layers = len(state.engine.model.model.layers)
    for r in reqs:
        # a prefill sample and one per decode step (3 steps after the first token), per layer
        assert r.kc.count == layers * 4, (r.kc.count, layers)
        assert r.kc.mean is not None and 1 <= r.kc.mean <= len(r.prompt_ids) + 4
    # the probe's rows and the requests' samples are the same figures
    total = sum(row.k_union[0.9] for _, row in probe.records)
    assert total == sum(r.kc.total for r in reqs)
    page = _page(state)
    name = "kcops_worker_request_context_tokens_count"
    assert _value(page, name, model=state.model_name, tenant="acme") == 2.0
    assert _value(page, name, model=state.model_name, tenant="globex") == 1.0
    full = _value(page, "kcops_worker_request_context_tokens_sum", model="tiny", tenant="globex")
    assert full == 64.0  # 60 prompt + 4 generated
    eff = _value(
        page, "kcops_worker_request_effective_context_tokens_sum", model="tiny", tenant="globex"
    )
    assert eff == pytest.approx(reqs[2].kc.mean)
    priced = _value(
        page, "kcops_worker_request_priced_effective_tokens_total", model="tiny", tenant="globex"
    )
    assert priced == pytest.approx(reqs[2].kc.mean)


def test_unsampled_request_is_priced_at_full_context(
    probed: tuple[WorkerState, kernels.Probe],
) -> None:
    state, probe = probed
    probe.set_sample_rate(0.0)  # no sample: no effective context, and no saving claimed
    events: list[Event] = []
    state.engine.submit(GenRequest(list(range(300, 340)), 2, events.append, tenant="initech"))
    with torch.inference_mode():
        for _ in range(3):
            state.engine._iteration()
    assert events[-1].kind == "done"
    page = _page(state)
    labels = {"model": "tiny", "tenant": "initech"}
    assert _value(page, "kcops_worker_request_context_tokens_sum", **labels) == 42.0
    assert _value(page, "kcops_worker_request_effective_context_tokens_count", **labels) is None
    assert _value(page, "kcops_worker_request_priced_effective_tokens_total", **labels) == 42.0
