"""Sampled K(C) rows of vLLM attributed to vLLM's requests (vllm_requests), against a fake
model runner laid out like vLLM 0.32's V1 runner (``input_batch.req_ids`` in the order of
the attention metadata's sequences, ``requests[id].num_tokens``, finished ids sent with
the next step) and the real probe reading a real paged cache (tests/engines/vllm has the
real vLLM)."""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import kcops.kernels as kernels
from kcops.agent.collectors.probe import ProbeReceiver
from kcops.kernels import attribution, paged_kc, wire
from kcops.kernels.integrations import vllm_plugin, vllm_requests, vllm_tenant
from tests.unit.kernels.test_paged_kc import _case, _reference

RUNNER = "fake_vllm_req.v1.worker.gpu_model_runner"
BACKEND = "fake_vllm_req.v1.attention.backend"


class _Layer:
    layer_name = "model.layers.0.self_attn.attn"


@pytest.fixture
def fake() -> Iterator[SimpleNamespace]:
    """A backend module (one attention class) and a runner module whose step adds the new
    requests, drops the finished ones and reverses the batch (vLLM reorders it inside
    ``execute_model`` too) before running one attention call over ``step``'s paged case."""
    backend = types.ModuleType(BACKEND)

    class AttentionImpl:
        def forward(self, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any,
                    attn_metadata: Any, output: Any = None) -> Any:  # fmt: skip
            return query * 2

    backend.AttentionImpl = AttentionImpl  # type: ignore[attr-defined]
    runner_mod = types.ModuleType(RUNNER)

    class GPUModelRunner:
        def __init__(self) -> None:
            self.input_batch = SimpleNamespace(req_ids=[])
            self.requests: dict[str, SimpleNamespace] = {}

        def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None) -> Any:
            for rid in scheduler_output.finished_req_ids:
                self.requests.pop(rid, None)
                self.input_batch.req_ids.remove(rid)
            for rid, tokens in scheduler_output.new.items():
                self.requests[rid] = SimpleNamespace(num_tokens=tokens)
                self.input_batch.req_ids.append(rid)
            self.input_batch.req_ids.reverse()
            step = scheduler_output.step
            if step is None:
                return None
            impl, query, key, _, paged = step
            return impl.forward(_Layer(), query, key, key, paged.cache, paged.meta)

    class CPUModelRunner(GPUModelRunner):  # inherits execute_model, as vLLM's does
        pass

    runner_mod.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    runner_mod.CPUModelRunner = CPUModelRunner  # type: ignore[attr-defined]
    sys.modules[BACKEND], sys.modules[RUNNER] = backend, runner_mod
    paged_kc._layout_of.clear()
    try:
        yield SimpleNamespace(backend=backend, runner=runner_mod)
    finally:
        vllm_requests.uninstall(RUNNER)
        del sys.modules[BACKEND], sys.modules[RUNNER]


def _out(finished: set[str], new: dict[str, int], step: Any) -> SimpleNamespace:
    return SimpleNamespace(finished_req_ids=finished, new=new, step=step)


def _setup(
    fake: SimpleNamespace, sample_rate: float = 1.0
) -> tuple[Any, vllm_requests.Requests, Any]:
    probe = kernels.install(
        kernels.ProbeConfig(publish=False, integrations=(), sample_rate=sample_rate)
    )
    assert probe.ensure_integration("vllm", lambda p: vllm_plugin.install(p, (BACKEND,)))
    base = fake.backend.AttentionImpl
    impl_cls = type("CPUAttentionBackendImpl", (base,), {"forward": base.forward})
    requests = vllm_requests.Requests()
    assert vllm_requests.install(requests, RUNNER) == [fake.runner.GPUModelRunner]
    return probe, requests, impl_cls


def _impl(impl_cls: type, ns: SimpleNamespace) -> Any:
    impl = impl_cls()
    impl.__dict__.update(vars(ns))
    return impl


def test_each_sampled_row_goes_to_its_request_in_the_reordered_batch(
    fake: SimpleNamespace,
) -> None:
    probe, requests, impl_cls = _setup(fake)
    runner = fake.runner.CPUModelRunner()
    # after the step's reversal the batch is [b, a]: sequence 0 (21 keys) is b's
    ns, query, key, keys, paged = _case([21, 13])
    runner.execute_model(_out(set(), {"a": 13, "b": 21}, (_impl(impl_cls, ns), query, key,
                                                          keys, paged)))  # fmt: skip
    assert runner.input_batch.req_ids == ["b", "a"]
    want = {rid: _reference(query[i], keys[i]).k_union[0.9] for i, rid in enumerate(["b", "a"])}
    got = {rid: (kc.count, kc.total) for rid, kc in requests.open.items()}
    assert got == {"b": (1, want["b"]), "a": (1, want["a"])}, (got, want)
    assert probe.internal_errors == 0
    # the next (empty) step says a finished: its context is read before vLLM drops it
    runner.execute_model(_out({"a"}, {}, None))
    (done,) = requests.finished
    assert done == vllm_requests.Finished("a", 13, 1, float(want["a"]), want["a"])
    assert set(requests.open) == {"b"} and "a" not in runner.requests


def test_a_sequence_the_probe_skips_does_not_shift_the_others(fake: SimpleNamespace) -> None:
    """paged_kc leaves out a sequence it cannot read; the rows after it still go to their
    own requests (KcInputs.entries), not to the request of the skipped one."""
    _probe, requests, impl_cls = _setup(fake)
    runner = fake.runner.GPUModelRunner()
    ns, query, key, keys, paged = _case([9, 17])
    paged.meta.seq_lens[0] = 0  # sequence 0 (request b after the reversal): unreadable
    runner.execute_model(_out(set(), {"a": 17, "b": 9}, (_impl(impl_cls, ns), query, key,
                                                         keys, paged)))  # fmt: skip
    assert runner.input_batch.req_ids == ["b", "a"]
    assert requests.open["b"].count == 0
    assert requests.open["a"].count == 1
    assert requests.open["a"].total == _reference(query[1], keys[1]).k_union[0.9]


def test_unsampled_steps_read_nothing_and_finish_without_samples(fake: SimpleNamespace) -> None:
    _probe, requests, impl_cls = _setup(fake, sample_rate=0.0)
    runner = fake.runner.GPUModelRunner()
    ns, query, key, keys, paged = _case([5])
    runner.execute_model(_out(set(), {"a": 5}, (_impl(impl_cls, ns), query, key, keys, paged)))
    assert requests.open == {}  # the batch's ids were never asked for
    runner.execute_model(_out({"a"}, {}, None))
    assert list(requests.finished) == [vllm_requests.Finished("a", 5, 0, None, 0)]


def test_a_runner_without_a_batch_is_left_unattributed(fake: SimpleNamespace) -> None:
    requests = vllm_requests.Requests()
    vllm_requests.install(requests, RUNNER)
    runner = fake.runner.GPUModelRunner()
    del runner.input_batch
    seen: list[Any] = []
    fn = vllm_requests.wrap_execute_model(requests, lambda self, out: seen.append(
        attribution.current()))  # fmt: skip
    fn(runner, _out(set(), {}, None))
    assert seen == [None] and requests.open == {}


def test_install_is_idempotent_and_undone(fake: SimpleNamespace) -> None:
    cls = fake.runner.GPUModelRunner
    original = cls.__dict__["execute_model"]

    class XPUModelRunner(cls):  # type: ignore[misc,valid-type]
        def execute_model(self, scheduler_output: Any) -> Any:
            return None

    requests = vllm_requests.Requests()
    assert set(vllm_requests.install(requests, RUNNER)) == {cls, XPUModelRunner}
    assert vllm_requests.install(requests, RUNNER) == []
    assert "execute_model" not in fake.runner.CPUModelRunner.__dict__  # inherits the wrap
    vllm_requests.uninstall(RUNNER)
    assert cls.__dict__["execute_model"] is original
    assert vllm_requests.install(requests, "no.such.module") == []


def test_open_requests_are_bounded() -> None:
    requests = vllm_requests.Requests(max_open=3)
    requests.owners(["r1", "r2", "r3"])
    requests.owners(["r4", None])
    assert list(requests.open) == ["r2", "r3", "r4"] and requests.dropped == 1


def test_finished_requests_reach_the_agent_with_model_and_tenant(fake: SimpleNamespace) -> None:
    """A finished request goes into the probe's request histograms of its tenant (read
    from the request id kcops' middleware marked), which frames carry, one tenant each,
    with the served model to the agent, which exports them under the names the reference
    worker's map to: model from the frame, tenant from the id, ``unknown`` without one."""
    probe, requests, impl_cls = _setup(fake)
    requests.on_finish = functools.partial(vllm_plugin.observe_finished, probe)
    requests.on_model = probe.set_model
    runner = fake.runner.GPUModelRunner()
    runner.model_config = SimpleNamespace(served_model_name=["smollm2", "alias"])
    a = "cmpl-" + vllm_tenant.mark(requests.key, "acme", "a") + "-1f2e3d4c"
    b = "chatcmpl-" + vllm_tenant.mark(requests.key, "beta", "b") + "-0a1b2c3d"
    ns, query, key, keys, paged = _case([30, 12])
    step = (_impl(impl_cls, ns), query, key, keys, paged)
    runner.execute_model(_out(set(), {a: 12, b: 30}, step))
    runner.execute_model(_out({a, b}, {"c": 7}, None))  # c: never sampled, no tenant
    runner.execute_model(_out({"c"}, {}, None))
    k = {rid: _reference(query[i], keys[i]).k_union[0.9] for i, rid in enumerate([b, a])}
    d = probe.aggregator.take()
    assert set(d.requests) == {"acme", "beta", ""}
    r = ProbeReceiver("/nonexistent/probe.sock")
    for seq, (tenant, hists) in enumerate(d.requests.items()):
        frame = wire.Frame(
            1, "VLLM::Worker", seq, "i", 1.0, engine="vllm", histograms=hists,
            model=probe.publisher.model, tenant=tenant,
        )  # fmt: skip
        r.feed(wire.encode(frame))
    out = r.collect(0.0)
    got = {(s.name, dict(s.labels)["tenant"]): s.value for s in out
           if dict(s.labels).get("model") == "smollm2" and "le" not in dict(s.labels)}  # fmt: skip
    labels = {
        tuple(x for x in s.labels if x[0] != "le")
        for s in out
        if s.name.startswith("kcops_request_")
    }
    base = (("engine", "vllm"), ("model", "smollm2"), ("process", "VLLM::Worker"))
    assert labels == {(*base, ("tenant", t)) for t in ("acme", "beta", "unknown")}
    assert got[("kcops_request_context_tokens_sum", "acme")] == 12
    assert got[("kcops_request_context_tokens_sum", "beta")] == 30
    assert got[("kcops_request_context_tokens_sum", "unknown")] == 7
    assert got[("kcops_request_effective_context_tokens_sum", "acme")] == k[a]
    assert got[("kcops_request_effective_context_tokens_count", "beta")] == 1
    assert ("kcops_request_effective_context_tokens_count", "unknown") in got  # 0: unsampled
    assert got[("kcops_request_effective_context_tokens_count", "unknown")] == 0
    # priced: the effective context of the sampled ones, the full one of c
    assert got[("kcops_request_priced_effective_tokens_total", "acme")] == k[a]
    assert got[("kcops_request_priced_effective_tokens_total", "unknown")] == 7
