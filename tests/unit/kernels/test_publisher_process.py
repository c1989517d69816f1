"""The publisher as vLLM needs it: the process name read at each flush (vLLM renames its
worker after start), and silence in processes that never ran attention."""

from __future__ import annotations

import ctypes

from kcops.kernels import wire
from kcops.kernels.aggregate import Aggregator
from kcops.kernels.publisher import Publisher
from tests.unit.kernels.conftest import Listener, drain

PR_SET_NAME = 15


def _set_comm(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_NAME, name.encode(), 0, 0, 0) == 0


def _comm() -> str:
    with open("/proc/self/comm") as fh:
        return fh.read().strip()


def test_process_name_is_read_when_the_frame_is_sent(listener: tuple[str, Listener]) -> None:
    path, sock = listener
    agg = Aggregator((16,))
    pub = Publisher(agg, path, 60.0)
    before = _comm()
    try:
        agg.call("0", 8)
        pub.flush()
        _set_comm("VLLM::Worker")  # what setproctitle does in vLLM's worker
        agg.call("0", 8)
        pub.flush()
    finally:
        _set_comm(before)
    first, second = drain(sock)
    assert first.process == before and second.process == "VLLM::Worker"


def test_wait_for_attention_sends_nothing_until_a_call(listener: tuple[str, Listener]) -> None:
    path, sock = listener
    agg = Aggregator((16,))
    pub = Publisher(agg, path, 60.0)
    pub.wait_for_attention = True
    assert pub.flush() == 0 and pub.flush() == 0
    assert drain(sock) == [] and pub.dropped_total == 0  # silence is not a drop
    agg.call("3", 12)
    assert pub.flush() == 1
    assert pub.flush() == 1  # from then on, heartbeats as usual
    frames = drain(sock)
    assert [f.seq for f in frames] == [0, 1]
    assert frames[0].calls_by_layer == {"3": 1} and frames[1].calls_by_layer == {}
    assert frames[0].histograms[wire.CONTEXT_TOKENS].count == 1


def test_each_tenant_with_finished_requests_gets_a_frame(listener: tuple[str, Listener]) -> None:
    """The first tenant's request histograms go with the flush's frame, each other's in a
    frame of its own (the tenant is in a frame's key), all with the probe's p."""
    path, sock = listener
    agg = Aggregator((16,))
    pub = Publisher(agg, path, 60.0, p=0.8)
    agg.call("0", 8)
    agg.observe_request(100, 40.0, "acme")
    agg.observe_request(50, None, "beta")
    agg.observe_request(70, None, "acme")
    assert pub.flush() == 2
    frames = drain(sock)
    assert [(f.seq, f.tenant, f.p) for f in frames] == [(0, "acme", 0.8), (1, "beta", 0.8)]
    assert frames[0].calls_by_layer == {"0": 1} and frames[1].calls_by_layer == {}
    assert frames[0].histograms[wire.REQUEST_CONTEXT].sum == 170
    assert frames[1].histograms[wire.REQUEST_PRICED].sum == 50
    assert wire.CONTEXT_TOKENS not in frames[1].histograms
    assert pub.flush() == 1  # nothing finished: one frame, no tenant
    assert drain(sock)[0].tenant == ""
