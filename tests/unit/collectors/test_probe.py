from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from kcops.agent.collectors.probe import ProbeReceiver
from kcops.agent.samples import Sample
from kcops.errors import CollectorUnavailable
from kcops.kernels import wire
from tests.unit.collectors.helpers import collect, latest, names, runner, value
from tests.unit.kernels.test_wire import with_tag

# What the probe of the reference worker sends: its engine, its process name.
PY = {"engine": "kcops", "process": "python"}


def make_frame(
    pid: int = 10,
    process: str = "python",
    seq: int = 0,
    instance: str = "a",
    engine: str = "kcops",
    **kw,
) -> wire.Frame:  # type: ignore[no-untyped-def]
    return wire.Frame(pid=pid, process=process, seq=seq, instance=instance, engine=engine, **kw)


def frame(*args, **kw) -> bytes:  # type: ignore[no-untyped-def]
    return wire.encode(make_frame(*args, **kw))


def hist(name: str, *values: float) -> wire.Histogram:
    h = wire.Histogram.of(name)
    for v in values:
        h.observe(v)
    return h


def test_deltas_become_cumulative_counters_and_histograms() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock")
    r.feed(
        frame(
            seq=0,
            calls_by_layer={"0": 3, "1": 2},
            errors={"nan": 1},
            kc_by_layer={"0": hist(wire.KC_TOKENS, 10, 100), "1": hist(wire.KC_TOKENS)},
            topn_mass={16: hist(wire.TOPN_MASS, 0.8)},
            internal_errors=2,
            dropped=3,
        )
    )
    r.feed(frame(seq=1, calls_by_layer={"0": 4}, kc_by_layer={"0": hist(wire.KC_TOKENS, 100)}))
    out = collect(r)
    p = PY
    assert value(out, "kcops_attention_calls_total", layer="0", **p) == 7
    assert value(out, "kcops_attention_calls_total", layer="1", **p) == 2
    assert value(out, "kcops_attention_errors_total", kind="nan", **p) == 1
    assert (
        value(out, "kcops_attention_errors_total", kind="inf", **p) == 0
    )  # present from the start
    kc = {"layer": "0", **p}  # K(C) by layer
    assert value(out, "kcops_kc_tokens_bucket", le="16.0", **kc) == 1
    assert value(out, "kcops_kc_tokens_bucket", le="128.0", **kc) == 3
    assert value(out, "kcops_kc_tokens_bucket", le="+Inf", **kc) == 3
    assert value(out, "kcops_kc_tokens_count", **kc) == 3
    assert value(out, "kcops_kc_tokens_sum", **kc) == 210
    # a layer with no K(C) observed has no series yet (30 of them per layer)
    assert value(out, "kcops_kc_tokens_count", layer="1", **p) is None
    assert value(out, "kcops_topn_mass_ratio_bucket", n="16", le="0.8", **p) == 1
    assert value(out, "kcops_probe_internal_errors_total", **p) == 2
    assert value(out, "kcops_probe_dropped_total", **p) == 3
    assert value(out, "kcops_probe_frames_total", outcome="ok") == 2


def test_a_quiet_process_gives_the_same_samples_and_a_new_frame_new_ones() -> None:
    """A process's samples are built once per frame, not once per tick: the same list again
    while it is quiet (by the bulk path and the frame-by-frame one alike), its new sums
    after its next frame, and another process's frame leaves them as they were."""
    for bulk in (True, False):
        r = ProbeReceiver("/nonexistent/probe.sock")
        r._bulk = bulk
        k = {"0": hist(wire.KC_TOKENS, 10)}
        r.feed(frame(seq=0, calls_by_layer={"0": 3}, kc_by_layer=k))
        first = collect(r)
        assert collect(r) == first
        r.feed(frame(seq=1, calls_by_layer={"0": 4}, kc_by_layer=k))
        out = collect(r)
        assert value(out, "kcops_attention_calls_total", layer="0", **PY) == 7
        assert value(out, "kcops_kc_tokens_count", layer="0", **PY) == 2
        other = make_frame(seq=0, calls_by_layer={"0": 1})
        other.pid, other.process = 9, "other-one"
        r.feed(wire.encode(other))
        again = collect(r)
        assert value(again, "kcops_attention_calls_total", layer="0", **PY) == 7
        two = {**PY, "process": "other-one"}
        assert value(again, "kcops_attention_calls_total", layer="0", **two) == 1


def test_kc_without_its_layer_is_layer_unknown_and_sums_stay_whole() -> None:
    """Existing queries (``sum by (engine)``, ``sum by (le)``) see the same sums: the
    layer label splits the series, never doubles them."""
    r = ProbeReceiver("/nonexistent/probe.sock")
    plain = {wire.KC_TOKENS: hist(wire.KC_TOKENS, 10, 100)}  # mask bit 1: no layer said
    r.feed(frame(seq=0, calls_by_layer={"0": 1}, histograms=plain))
    r.feed(frame(seq=1, engine="unknown", histograms=plain))
    r.feed(frame(seq=2, kc_by_layer={"5": hist(wire.KC_TOKENS, 7)}))
    out = collect(r)
    assert value(out, "kcops_kc_tokens_count", layer="unknown", **PY) == 2
    unknown = {"engine": "unknown", "process": "python"}
    assert value(out, "kcops_kc_tokens_count", layer="unknown", **unknown) == 2
    assert value(out, "kcops_kc_tokens_count", layer="5", **PY) == 1
    total = sum(s.value for s in out if s.name == "kcops_kc_tokens_sum")
    assert total == 2 * 110 + 7


def test_kc_layers_are_bounded_per_process() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock", max_kc_layers=3)
    kc = {str(i): hist(wire.KC_TOKENS, 8) for i in range(10)}
    r.feed(frame(calls_by_layer={str(i): 1 for i in range(10)}, kc_by_layer=kc))
    out = collect(r)
    layers = {s.key.label_dict()["layer"] for s in out if s.name == "kcops_kc_tokens_count"}
    assert layers == {"0", "1", "2", "other"}
    assert value(out, "kcops_kc_tokens_count", layer="other", **PY) == 7
    assert len([s for s in out if s.name.startswith("kcops_kc_tokens")]) == 4 * 30


def test_garbage_and_unknown_versions_are_counted_by_type_never_raised() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock")
    good = frame(calls_by_layer={"0": 1})
    r.feed(b"")  # truncated
    r.feed(b"\x00" * 3)  # truncated
    r.feed(b"hello world, not a frame")  # bad_magic
    r.feed(good[:-5])  # truncated
    payload = b'{"pid": 1}'
    r.feed(wire.HEADER.pack(wire.MAGIC, 99, len(payload)) + payload)  # bad_version
    for old in (1, 2, 3):  # versions read before 1.0: now unknown too
        r.feed(wire.HEADER.pack(wire.MAGIC, old, len(payload)) + payload)
    r.feed(wire.HEADER.pack(wire.MAGIC, wire.VERSION, 60_000) + bytes(60_000))  # too_large
    r.feed(good.replace(b"kcops", b"KCOPS"))  # bad_field
    r.feed(good)
    out = collect(r)
    assert value(out, "kcops_probe_frames_total", outcome="malformed") == 6
    assert value(out, "kcops_probe_frames_total", outcome="unknown_version") == 4
    assert value(out, "kcops_probe_frames_total", outcome="ok") == 1
    refused = {"truncated": 3, "bad_magic": 1, "bad_version": 4, "too_large": 1, "bad_field": 1}
    for reason, n in refused.items():
        assert value(out, "kcops_probe_frames_refused_total", reason=reason) == n, reason
    assert value(out, "kcops_attention_calls_total", layer="0", **PY) == 1


def test_cardinality_is_bounded() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock", max_processes=2, max_layers=3)
    for i in range(5):
        r.feed(frame(pid=100 + i, process=f"proc{i}", calls_by_layer={str(j): 1 for j in range(6)}))
    out = collect(r)
    procs = {s.label_dict()["process"] for s in (x.key for x in out) if "process" in s.label_dict()}
    assert procs == {"proc0", "proc1", "other"}
    layers = {
        s.label_dict()["layer"]
        for s in (x.key for x in out)
        if s.name == "kcops_attention_calls_total"
    }
    assert layers == {"0", "1", "2", "other"}
    assert (
        value(out, "kcops_attention_calls_total", layer="other", engine="other", process="other")
        == 9
    )


def test_dropped_frames_are_summed_across_probe_restarts() -> None:
    """A probe sends the frames it dropped since its last frame (deltas): the sum stays
    monotonic when the engine restarts and its probe counts from 0 again."""
    r = ProbeReceiver("/nonexistent/probe.sock")
    r.feed(frame(seq=0, dropped=5))
    r.feed(frame(seq=1, dropped=2))
    assert value(collect(r), "kcops_probe_dropped_total", **PY) == 7
    r.feed(frame(pid=12, seq=0, instance="c", dropped=4))  # restarted: new pid and instance
    r.feed(frame(pid=12, seq=1, instance="c", calls_by_layer={"0": 1}, dropped=1))
    out = collect(r)
    assert value(out, "kcops_probe_dropped_total", **PY) == 7 + 5
    assert value(out, "kcops_attention_calls_total", layer="0", **PY) == 1


def test_receives_over_a_real_unix_stream_socket(tmp_path: Path) -> None:
    path = tmp_path / "run" / "probe.sock"
    r = ProbeReceiver(path, drain_interval_s=0.001)
    rr, store = runner(r)

    async def main() -> None:
        await rr.start()
        assert path.is_socket()
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.sendall(frame(calls_by_layer={"3": 5}) + frame(seq=1, calls_by_layer={"3": 1}))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.sendall(b"garbage, out of step")
        # The loop's timer drains the connections: wait until it has seen all three.
        deadline = loop.time() + 10
        while r.frames["ok"] < 2 or r.frames["malformed"] < 1:
            assert loop.time() < deadline, f"frames: {dict(r.frames)}"
            await asyncio.sleep(0.01)
        await rr.tick(5.0)
        await rr.stop()

    asyncio.run(main())
    assert latest(store, "kcops_attention_calls_total", layer="3", **PY) == 6
    assert latest(store, "kcops_probe_frames_total", outcome="malformed") == 1
    assert latest(store, "kcops_probe_frames_refused_total", reason="bad_magic") == 1
    assert not path.exists()


def test_stale_socket_is_replaced_and_a_bad_path_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "probe.sock"
    old = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # a stale socket of any kind
    old.bind(str(path))
    old.close()
    r = ProbeReceiver(path)

    async def main() -> None:
        await r.start()
        await r.stop()

    asyncio.run(main())
    assert r._start_error is None

    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = ProbeReceiver(blocker)
    asyncio.run(bad.start())
    try:
        collect(bad)
    except CollectorUnavailable as exc:
        assert exc.reason == "listen"
    else:  # pragma: no cover
        raise AssertionError("expected CollectorUnavailable")


def test_all_probe_families_are_exported() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock")
    r.feed(
        frame(
            calls_by_layer={"0": 1},
            histograms={n: hist(n, 0.5) for n in wire.PLAIN_HISTOGRAMS},
            topn_mass={32: hist(wire.TOPN_MASS, 0.9)},
        )
    )
    got = names(collect(r))
    for fam in (
        "kcops_attention_calls_total",
        "kcops_attention_errors_total",
        "kcops_attention_seconds_bucket",
        "kcops_kc_tokens_bucket",
        "kcops_kc_ratio_bucket",
        "kcops_topn_mass_ratio_bucket",
        "kcops_context_tokens_bucket",
        "kcops_probe_dropped_total",
        "kcops_probe_frames_total",
    ):
        assert fam in got, fam


def test_frames_past_the_rate_limit_are_shed_and_counted() -> None:
    t = {"now": 100.2}
    r = ProbeReceiver("/nonexistent/probe.sock", max_frames_per_s=3, clock=lambda: t["now"])
    for i in range(5):
        r.feed(frame(seq=i, calls_by_layer={"0": 1}))
    t["now"] = 101.0
    r.feed(frame(seq=5, calls_by_layer={"0": 1}))
    out = collect(r)
    assert value(out, "kcops_probe_frames_total", outcome="shed") == 2
    assert value(out, "kcops_attention_calls_total", layer="0", **PY) == 4


def test_idle_processes_are_forgotten_and_state_stays_bounded() -> None:
    now = [100.0]
    r = ProbeReceiver("/nonexistent/probe.sock", max_processes=8, idle_s=60, clock=lambda: now[0])
    for i in range(1000):  # a burst of short-lived processes
        r.feed(frame(pid=i, process=f"p{i}", instance=f"i{i}", calls_by_layer={"0": 1}))
    out = collect(r)
    procs = {dict(s.labels).get("process") for s in out if s.name == "kcops_attention_calls_total"}
    assert len(procs) == 8 + 1 and "other" in procs
    assert len(r._shapes) <= 4 * 8  # the shapes of 1,000 processes: a bounded cache
    assert (
        value(out, "kcops_attention_calls_total", layer="0", engine="other", process="other")
        == 1000 - 8
    )
    now[0] += 61
    r.feed(frame(pid=1, process="alive", calls_by_layer={"0": 1}))
    out = collect(r)
    procs = {dict(s.labels).get("process") for s in out if s.name == "kcops_attention_calls_total"}
    assert procs == {"alive"}


def test_histogram_series_share_one_le_format() -> None:
    from kcops.agent.collectors.selfmetrics import SelfCollector, tick_histogram

    ticks = tick_histogram()
    ticks.observe(0.003)
    out = list(SelfCollector(ticks).collect(0.0))
    les = [dict(s.labels)["le"] for s in out if s.name == "kcops_agent_tick_seconds_bucket"]
    assert les == ticks.les() and les[-1] == "+Inf" and "0.0025" in les
    assert value(out, "kcops_agent_tick_seconds_count") == 1
    assert value(out, "kcops_agent_tick_seconds_bucket", le="0.005") == 1


def _engines(out: list[Sample]) -> set[tuple[str, str]]:
    return {
        (s.label_dict()["engine"], s.label_dict()["process"])
        for s in (x.key for x in out)
        if s.name == "kcops_kc_tokens_count"
    }


def test_every_probe_series_says_which_engine_sent_it() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock")
    kc = {wire.KC_TOKENS: hist(wire.KC_TOKENS, 40)}
    by_layer = {"0": hist(wire.KC_TOKENS, 40)}
    r.feed(
        frame(engine="vllm", process="VLLM::Worker", calls_by_layer={"0": 1}, kc_by_layer=by_layer)
    )
    # the same process name from another engine is another series, never summed into it
    r.feed(frame(pid=11, engine="kcops", process="VLLM::Worker", calls_by_layer={"0": 2}))
    r.feed(frame(pid=12, engine="unknown", process="old", calls_by_layer={"0": 4}, histograms=kc))
    out = collect(r)
    for s in out:
        if s.name.startswith(("kcops_attention", "kcops_kc", "kcops_probe_dropped")):
            assert {"engine", "process"} <= set(s.key.label_dict()), s
    assert _engines(out) == {
        ("vllm", "VLLM::Worker"),
        ("unknown", "old"),
    }
    calls = "kcops_attention_calls_total"
    assert value(out, calls, engine="vllm", layer="0", process="VLLM::Worker") == 1
    assert value(out, calls, engine="kcops", layer="0", process="VLLM::Worker") == 2
    kc_count = "kcops_kc_tokens_count"
    assert value(out, kc_count, engine="vllm", layer="0", process="VLLM::Worker") == 1
    assert value(out, "kcops_probe_dropped_total", engine="unknown", process="old") == 0


def test_a_hostile_engine_tag_is_refused_whole() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock")
    good = frame(calls_by_layer={"0": 1})
    for tag in (b'vllm",x="y', b"V" * 4, b"e" * 17, b"\xff\xfe"):
        r.feed(with_tag(good, tag))
    out = collect(r)
    assert value(out, "kcops_probe_frames_total", outcome="malformed") == 4
    assert value(out, "kcops_probe_frames_refused_total", reason="bad_field") == 4
    assert not [s for s in out if s.name == "kcops_attention_calls_total"]
    assert r.last_error is not None and r.last_error.startswith("engine")


def test_engines_count_toward_the_cardinality_bound() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock", max_processes=2)
    for i in range(6):  # one process name, six engines: six (engine, process) pairs
        r.feed(frame(pid=100 + i, engine=f"e{i}", calls_by_layer={"0": 1}))
    out = collect(r)
    pairs = {
        (s.label_dict()["engine"], s.label_dict()["process"])
        for s in (x.key for x in out)
        if s.name == "kcops_attention_calls_total"
    }
    assert pairs == {("e0", "python"), ("e1", "python"), ("other", "other")}
    assert (
        value(out, "kcops_attention_calls_total", layer="0", engine="other", process="other") == 4
    )


def _procs(out: list[Sample]) -> set[str]:
    return {dict(s.labels)["process"] for s in out if s.name == "kcops_attention_calls_total"}


def test_a_new_process_takes_the_slot_of_one_gone_quiet() -> None:
    now = [100.0]
    r = ProbeReceiver("/nonexistent/probe.sock", max_processes=2, clock=lambda: now[0])
    r.feed(frame(pid=1, process="a", calls_by_layer={"0": 1}))
    r.feed(frame(pid=2, process="b", calls_by_layer={"0": 1}))
    now[0] += 1
    r.feed(frame(pid=3, process="c", calls_by_layer={"0": 1}))  # all active: folded
    assert _procs(collect(r)) == {"a", "b", "other"}
    now[0] += 3
    r.feed(frame(pid=2, process="b", calls_by_layer={"0": 1}))
    now[0] += 1  # "a" has sent nothing for 5 s, past QUIET_S
    r.feed(frame(pid=3, process="c", calls_by_layer={"0": 1}))
    out = collect(r)
    assert _procs(out) == {"b", "c", "other"}
    assert value(out, "kcops_probe_slots_replaced_total") == 1
    assert value(out, "kcops_probe_folded_frames_total", source="probe:kcops/c") == 1


def test_a_flood_of_large_processes_cannot_keep_a_new_engine_out() -> None:
    """1,000 processes of 300 layers each, all active: a small new process takes the slot
    of the largest over its share, and keeps it while the flood goes on."""
    now = [100.0]
    r = ProbeReceiver(
        "/nonexistent/probe.sock", max_processes=32, series_share=1000, clock=lambda: now[0]
    )
    big = {f"L{j}": 1 for j in range(300)}
    kc = {f"L{j}": hist(wire.KC_TOKENS, 100) for j in range(40)}
    for i in range(1000):
        r.feed(frame(pid=i, process=f"flood{i}", calls_by_layer=big, kc_by_layer=kc))
    now[0] += 5
    for tick in range(10):  # the flood goes on; the engine sends each second
        for i in range(tick * 100, tick * 100 + 100):
            r.feed(frame(pid=i, process=f"flood{i}", calls_by_layer=big, kc_by_layer=kc))
        r.feed(frame(pid=5000, process="engine", calls_by_layer={"0": 1}))
        now[0] += 1
    out = collect(r)
    assert "engine" in _procs(out)
    assert (
        value(out, "kcops_attention_calls_total", layer="0", engine="kcops", process="engine") == 10
    )
    assert len(_procs(out)) <= 32 + 1
    # The flood's processes push out each other (the store counts their series by source).
    assert value(out, "kcops_probe_slots_replaced_total") > 900


def test_small_active_processes_keep_their_slots() -> None:
    """Within their share, processes that keep sending are never pushed out by newcomers:
    the newcomers fold into "other" (counted), so no counter restarts from 0."""
    now = [100.0]
    r = ProbeReceiver(
        "/nonexistent/probe.sock", max_processes=4, series_share=1000, clock=lambda: now[0]
    )
    for _tick in range(6):
        for i in range(8):
            r.feed(frame(pid=i, process=f"p{i}", calls_by_layer={"0": 1}))
        now[0] += 1
    out = collect(r)
    assert _procs(out) == {"p0", "p1", "p2", "p3", "other"}
    assert value(out, "kcops_attention_calls_total", layer="0", engine="kcops", process="p0") == 6
    assert value(out, "kcops_probe_slots_replaced_total") == 0


def test_request_series_by_tenant_with_the_mass_p_and_a_price() -> None:
    """vLLM's requests by tenant (frames of one tenant each), the process's K(C) mass p,
    and the cost counters from a configured price, as the engine scrape has them."""
    r = ProbeReceiver("/nonexistent/probe.sock", prices={"*": 2.0})
    for seq, tenant in enumerate(["acme", "beta", ""]):
        h = wire.Histogram.of(wire.REQUEST_CONTEXT)
        h.observe(1000)
        priced = wire.Histogram.of(wire.REQUEST_PRICED)
        priced.observe(250)
        hists = {wire.REQUEST_CONTEXT: h, wire.REQUEST_PRICED: priced}
        r.feed(frame(seq=seq, engine="vllm", model="m", tenant=tenant, p=0.8, histograms=hists))
    out = collect(r)
    lab = {"engine": "vllm", "model": "m", "process": "python"}
    for tenant in ("acme", "beta", "unknown"):
        assert value(out, "kcops_request_context_tokens_sum", tenant=tenant, **lab) == 1000
        assert value(out, "kcops_cost_full_total", tenant=tenant, **lab) == 2.0
        assert value(out, "kcops_cost_effective_total", tenant=tenant, **lab) == 0.5
    assert value(out, "kcops_probe_kc_mass", engine="vllm", process="python") == 0.8


def test_forged_frames_cannot_spend_the_tenant_label_set() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock")
    h = wire.Histogram.of(wire.REQUEST_CONTEXT)
    h.observe(10)
    for i in range(10_000):
        r.feed(frame(seq=i, tenant=f"t{i}", histograms={wire.REQUEST_CONTEXT: h}))
    r.feed(
        frame(
            seq=10_001, tenant="sk-abcdefabcdefabcdefabcdef", histograms={wire.REQUEST_CONTEXT: h}
        )
    )
    tenants = {
        dict(s.labels)["tenant"] for s in collect(r) if s.name == "kcops_request_context_tokens_sum"
    }
    assert len(tenants) == 51 and "other" in tenants
    assert not any(t.startswith("sk-") for t in tenants)
