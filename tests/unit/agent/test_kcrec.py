"""The live K(C) budget recommendation: its quantile math against raw samples, the
window's reading of the store, too few samples, calibrated and uncalibrated."""

from __future__ import annotations

import asyncio
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from kcops.agent.component import AgentContext
from kcops.agent.config import parse_config
from kcops.agent.events import EventBus
from kcops.agent.kcrec import Recommender
from kcops.agent.kcrec.capacity import kv_share
from kcops.agent.kcrec.window import increase, window_buckets
from kcops.agent.samples import Sample, SeriesKey, histogram_samples
from kcops.agent.store import Store
from kcops.auth import TokenCheck
from kcops.errors import ConfigError
from kcops.kcbudget import bucket_counts, matching_quantile, quantile, uniform, uniform_at
from kcops.kernels import wire
from kcops.kernels.wire import BUCKETS, KC_TOKENS
from kcops.lab.sweepcal import coverage
from tests.clock import ManualClock

B = BUCKETS[KC_TOKENS]  # the probe's K_p buckets
T0 = 1_700_000_000.0


def order_stat(values: list[int], q: float) -> int:
    """The sample q-quantile by rank ceil(q n) (the rank histogram_quantile's bucket holds)."""
    s = sorted(values)
    return s[max(1, math.ceil(q * len(s) - 1e-9 * len(s))) - 1]


def draws(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    kind = seed % 3
    if kind == 0:
        return [max(1, int(rng.lognormvariate(4, 1.2))) for _ in range(n)]
    if kind == 1:
        return [rng.randint(1, 300) for _ in range(n)]
    return [rng.choice([3, 17, 64, 64, 65, 900, 5000]) for _ in range(n)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("q", [0.05, 0.5, 0.9, 0.95, 0.99, 1.0])
def test_quantile_interval_holds_the_raw_samples_quantile(seed: int, q: float) -> None:
    values = draws(seed, 50 + 97 * seed)
    got = quantile(q, bucket_counts(values, B), B)
    assert got is not None and got.samples == len(values)
    truth = order_stat(values, q)
    assert got.low < truth <= got.high, (got, truth)
    assert got.low <= got.tokens <= got.high
    # the interval is one bucket: nothing narrower is known
    assert got.high == math.inf or got.high in wire.BUCKETS[wire.KC_TOKENS]


@pytest.mark.parametrize("seed", range(6))
def test_uniform_interval_holds_the_max_of_the_layers_quantiles(seed: int) -> None:
    layers = {str(i): draws(seed * 10 + i, 400) for i in range(4)}
    per = {k: quantile(0.95, bucket_counts(v, B), B) for k, v in layers.items()}
    uni = uniform({k: v for k, v in per.items() if v is not None})
    assert uni is not None
    truth = max(order_stat(v, 0.95) for v in layers.values())
    assert uni.low < truth <= uni.high


def test_matching_quantile_inverts_the_uniform_estimate() -> None:
    hists = {str(i): bucket_counts(draws(i, 500), B) for i in range(3)}
    target = uniform_at(0.8, hists, B)
    q, how = matching_quantile(target, hists, B)
    assert how == "exact" and abs(q - 0.8) < 1e-3
    assert matching_quantile(1e9, hists, B) == (1.0, "above_all")
    assert matching_quantile(0.0, hists, B)[1] == "below_all"


def test_sweep_coverage_matches_its_n_over_the_layers_the_policy_budgets() -> None:
    rng = random.Random(1)
    rows = {i: {0.9: [rng.randint(1, 40 * (i + 1)) for _ in range(256)]} for i in range(4)}
    cov = coverage(rows, 60, "uniform")
    assert cov["layers"] == "all" and cov["samples_per_layer"] == 256
    hists = {str(i): bucket_counts(rows[i][0.9], B) for i in rows}
    assert abs(uniform_at(cov["quantile"], hists, B) - 60) < 0.5
    dense = coverage(rows, 60, "dense_first")
    assert dense["layers"] == "non_dense" and dense["dense_layers"] == [0, 1]


def test_sweep_coverage_is_matched_over_both_layer_sets() -> None:
    # layer 0 spreads its mass over every key (K_p near the context), as SmolLM2's does:
    # over all layers any smaller N is below_all; over the non-dense ones it matches
    rng = random.Random(2)
    rows = {0: {0.9: [rng.randint(700, 950) for _ in range(256)]}}
    rows |= {i: {0.9: [rng.randint(10, 300 + 40 * i) for _ in range(256)]} for i in (1, 2, 3)}
    cov = coverage(rows, 256, "uniform")
    assert cov["layers"] == "all" and cov["match"] == "below_all"
    assert cov["by_layers"]["all"]["by_p"] == cov["by_p"]
    nd = cov["by_layers"]["non_dense"]
    assert nd["dense_layers"] == [0, 1] and nd["by_p"]["0.9"]["match"] == "exact"
    hists = {str(i): bucket_counts(rows[i][0.9], B) for i in (2, 3)}
    assert abs(uniform_at(nd["by_p"]["0.9"]["quantile"], hists, B) - 256) < 0.5


# -- the store's window --------------------------------------------------------------


def test_increase_counts_resets_and_series_born_in_the_window() -> None:
    store = Store()
    k = SeriesKey.of("c_total")
    for i, v in enumerate([5, 7, 9, 2, 4]):  # reset after 9: +2 +2 (from 5) + 2 + 2
        store.append(k, T0 + i, v)
    assert increase(store, k, T0, T0 + 10) == 2 + 2 + 2 + 2
    born = SeriesKey.of("b_total")
    store.append(born, T0 + 3, 6)
    store.append(born, T0 + 4, 8)
    assert increase(store, born, T0, T0 + 10) == 8  # counted from zero


def feed(store: Store, by_layer: dict[str, list[int]], t: float, **labels: str) -> None:
    out: list[Sample] = []
    lp_base = {"engine": "kcops", "process": "w", **labels}
    for layer, values in by_layer.items():
        h = wire.Histogram.of(wire.KC_TOKENS)
        for v in values:
            h.observe(v)
        lp = tuple(sorted({**lp_base, "layer": layer}.items()))
        histogram_samples(wire.KC_TOKENS, h, lp, out)
    store.add(out, t)


def test_window_buckets_sum_processes_and_subtract_the_window_start() -> None:
    store = Store()
    feed(store, {"0": [5, 5]}, T0)  # before the window: not counted
    feed(store, {"0": [5, 5, 100, 100, 100]}, T0 + 100)
    feed(store, {"0": [3]}, T0 + 100, process="w2")
    got = window_buckets(store, "kcops_kc_tokens", "layer", T0 + 50, T0 + 200)
    bounds, counts = got["0"]
    assert sum(counts) == 3 + 1
    assert counts[bounds.index(128)] == 3


# -- the component ---------------------------------------------------------------------


def make(tmp_path: Path, rec: dict[str, Any] | None = None) -> Recommender:
    ctx = AgentContext(
        config=parse_config({"recommendation": rec or {}}),
        store=Store(),
        clock=ManualClock(T0 + 1000),
        bus=EventBus(),
        tracer=trace.get_tracer("test"),
        auth=TokenCheck(None),
        state_dir=tmp_path,
    )
    return Recommender(ctx, None)


def layer_values(seed: int, n: int) -> dict[str, list[int]]:
    return {str(i): draws(seed + i, n) for i in range(3)}


STATE = {"model": "tiny", "top_n": 64, "dense_layers": [0], "route_mode": "normal"}


def test_too_few_samples_recommends_nothing(tmp_path: Path) -> None:
    r = make(tmp_path, {"min_samples": 200})
    feed(r.ctx.store, layer_values(0, 150), T0 + 900)
    doc = r.compute(T0 + 1000, dict(STATE))
    assert doc["status"] == "insufficient_samples"
    assert "200" in doc["reason"] and doc["uniform"] is None
    assert all("tokens" not in row for row in doc["layers"])
    assert [row["samples"] for row in doc["layers"]] == [150, 150, 150]
    r.doc = doc
    r.write(T0 + 1000)
    assert not list(r.ctx.store.keys("kcops_kc_recommended_n"))
    assert not list(r.ctx.store.keys("kcops_kc_recommended_tokens"))


def test_too_few_samples_says_how_many_are_missing_and_when_the_first_figure_comes(
    tmp_path: Path,
) -> None:
    r = make(tmp_path, {"min_samples": 200})
    feed(r.ctx.store, layer_values(0, 150), T0 + 900)  # 150 a layer, in the last 100 s
    calls = [Sample.of("kcops_attention_calls_total", 1500, {"layer": str(i), "process": "w"})
             for i in range(3)]  # fmt: skip
    r.ctx.store.add(calls, T0 + 900)
    doc = r.compute(T0 + 1000, dict(STATE))
    assert doc["status"] == "insufficient_samples"
    prog = doc["progress"]
    assert [(row["samples"], row["needed"]) for row in prog["layers"]] == [(150, 200)] * 2
    assert {row["layer"] for row in prog["layers"]} == {"1", "2"}  # layer 0 is dense
    assert all(row["per_s"] == 1.5 and row["eta_s"] == 33 for row in prog["layers"])
    assert prog["eta_s"] == 33
    assert prog["sampled_share"] == 0.1  # 450 K(C) samples over 4,500 calls
    # a first figure within the hour needs 200 samples a layer in min(window, 1h)
    need_per_s = 200 / min(r.window_s(), 3600.0)
    assert prog["share_for_first_within_1h"] == pytest.approx(0.1 * need_per_s / 1.5, abs=1e-6)
    # at a rate the window never holds 200 of, no time is promised
    slow = make(tmp_path, {"min_samples": 200, "window_s": "60s"})
    feed(slow.ctx.store, layer_values(0, 15), T0 + 900)
    assert slow.compute(T0 + 1000, dict(STATE))["progress"]["eta_s"] is None


def test_recommendation_per_layer_and_uniform_over_the_non_dense_layers(tmp_path: Path) -> None:
    r = make(tmp_path, {"min_samples": 200})
    values = layer_values(3, 400)
    feed(r.ctx.store, values, T0 + 900)
    doc = r.compute(T0 + 1000, dict(STATE))
    assert doc["status"] == "ok", doc
    assert doc["calibration"]["status"] == "uncalibrated" and doc["quantile"] == 0.95
    for row in doc["layers"]:
        low, high = row["interval"]
        truth = order_stat(values[row["layer"]], 0.95)
        assert low < truth <= (high or math.inf)
        assert row["samples"] == 400
    assert doc["uniform_over"] == "non_dense" and doc["uniform"]["layers"] == ["1", "2"]
    n = doc["uniform"]["tokens"]
    assert n == max(row["tokens"] for row in doc["layers"] if row["layer"] != "0")
    assert doc["configured"]["top_n"] == 64
    assert doc["comparison"]["ratio"] == round(64 / n, 3)
    r.doc = doc
    r.write(T0 + 1000)
    got = r.ctx.store.latest(SeriesKey.of("kcops_kc_recommended_n"))
    assert got is not None and got[1] == n
    assert len(list(r.ctx.store.keys("kcops_kc_recommended_tokens"))) == 3
    # the next document recommends nothing: the gauges go stale, not 0
    r.doc = {**doc, "status": "insufficient_samples"}
    r.write(T0 + 1001)
    assert r.ctx.store.latest(SeriesKey.of("kcops_kc_recommended_n")) is None


def test_calibration_from_config_is_used_for_its_model_only(tmp_path: Path) -> None:
    cal = {"calibration": {"tiny": {"p": 0.9, "quantile": 0.5}}, "min_samples": 10}
    r = make(tmp_path, cal)
    values = layer_values(5, 300)
    feed(r.ctx.store, values, T0 + 900)
    doc = r.compute(T0 + 1000, dict(STATE))
    assert doc["calibration"]["status"] == "calibrated" and doc["quantile"] == 0.5
    expected = quantile(0.5, bucket_counts(values["2"], B), B)
    assert expected is not None
    assert next(x for x in doc["layers"] if x["layer"] == "2")["tokens"] == expected.budget
    other = r.compute(T0 + 1000, {**STATE, "model": "smollm2"})
    assert other["calibration"]["status"] == "uncalibrated" and other["quantile"] == 0.95
    assert "no calibration for model 'smollm2'" in other["calibration"]["notes"][0]


def test_calibration_from_a_sweep_folder(tmp_path: Path) -> None:
    sweep = tmp_path / "kc-run"
    sweep.mkdir()
    cov = {
        "p": 0.9,
        "quantile": 0.8,
        "match": "exact",
        "by_p": {"0.9": {"quantile": 0.8, "match": "exact"}},
    }
    rec = [{"context": 256, "policy": "uniform", "n": 64, "kc_coverage": cov}]
    (sweep / "recommendation.json").write_text(json.dumps(rec))
    r = make(tmp_path, {"calibration": {"tiny": {"file": str(sweep)}}})
    asyncio.run(r.start())
    doc = r.compute(T0 + 1000, dict(STATE))
    assert doc["calibration"]["status"] == "calibrated" and doc["quantile"] == 0.8
    assert "N=64" in doc["calibration"]["source"]


def test_calibration_is_matched_over_the_layers_the_live_n_covers(tmp_path: Path) -> None:
    sweep = tmp_path / "kc-run"
    sweep.mkdir()
    by = {
        "all": {"dense_layers": [], "by_p": {"0.9": {"quantile": 0.001, "match": "below_all"}}},
        "non_dense": {"dense_layers": [0, 1], "by_p": {"0.9": {"quantile": 0.3, "match": "exact"}}},
    }
    cov = {"p": 0.9, "quantile": 0.001, "match": "below_all", "layers": "all",
           "by_p": by["all"]["by_p"], "by_layers": by}  # fmt: skip
    rec = [{"context": 256, "policy": "uniform", "n": 64, "kc_coverage": cov}]
    (sweep / "recommendation.json").write_text(json.dumps(rec))
    r = make(tmp_path, {"calibration": {"tiny": {"file": str(sweep)}}, "min_samples": 10})
    feed(r.ctx.store, layer_values(5, 300), T0 + 900)
    # the engine keeps layers 0 and 1 dense: the live N covers layer 2, matched over non-dense
    doc = r.compute(T0 + 1000, {**STATE, "dense_layers": [0, 1]})
    assert doc["uniform_over"] == "non_dense" and doc["quantile"] == 0.3
    assert "matched over non_dense layers" in doc["calibration"]["source"]
    assert doc["calibration"]["notes"] == []
    # the engine keeps only layer 0 dense: still non-dense, and the mismatch is noted
    doc = r.compute(T0 + 1000, dict(STATE))
    assert doc["quantile"] == 0.3 and "engine keeps [0] dense" in doc["calibration"]["notes"][0]
    # every layer budgeted: matched over all (a bound here, and noted as one)
    doc = r.compute(T0 + 1000, {**STATE, "dense_layers": []})
    assert doc["uniform_over"] == "all" and doc["quantile"] == 0.001
    assert "below_all" in doc["calibration"]["notes"][0]
    # a file from before by_layers: its own set, and the mismatch noted
    del cov["by_layers"]
    (sweep / "recommendation.json").write_text(json.dumps(rec))
    doc = r.compute(T0 + 1000, {**STATE, "dense_layers": [0, 1]})
    assert doc["quantile"] == 0.001
    assert any("over all layers, the live uniform N covers non_dense" in x
               for x in doc["calibration"]["notes"])  # fmt: skip


def test_a_calibration_file_that_cannot_be_read_refuses_the_start(tmp_path: Path) -> None:
    r = make(tmp_path, {"calibration": {"tiny": {"file": str(tmp_path / "missing")}}})
    with pytest.raises(ConfigError, match="cannot read the sweep's recommendation"):
        asyncio.run(r.start())
    with pytest.raises(ConfigError, match="either `file` or both"):
        parse_config({"recommendation": {"calibration": {"tiny": {"p": 0.9}}}})


def test_kv_share_follows_the_budget_and_the_dense_layers() -> None:
    ctx = [(1000.0, 1.0), (100.0, 1.0)]
    assert kv_share(ctx, None, 4, 0) == 1.0
    # N = 50 on 4 layers: (50 + 50) / 1100 of the keys
    assert kv_share(ctx, 50, 4, 0) == pytest.approx(100 / 1100)
    # layer 0 dense: (1 + 3 * 100/1100) / 4
    assert kv_share(ctx, 50, 4, 1) == pytest.approx((1 + 3 * 100 / 1100) / 4)
    # contexts below the worker's long_threshold run dense
    assert kv_share(ctx, 50, 4, 0, long_threshold=500) == pytest.approx(150 / 1100)


def test_cli_errors_are_one_line() -> None:
    from click.testing import CliRunner

    from kcops.cli.kc import kc_group

    res = CliRunner().invoke(kc_group, ["recommend", "--agent", "http://127.0.0.1:1"])
    assert res.exit_code == 3 and "cannot reach the agent" in res.output
    res = CliRunner().invoke(kc_group, ["recommend", "--sweep", "/nonexistent/kc-run"])
    assert res.exit_code == 2 and "--sweep /nonexistent/kc-run: no such folder" in res.output


def test_the_first_figure_comes_once_every_layer_has_its_samples_not_an_interval_later(
    tmp_path: Path,
) -> None:
    """The shipped interval is 10 minutes: while nothing is recommended the samples are
    counted every READY_CHECK_S, and the first recommendation is computed as soon as every
    layer has min_samples; after it, the schedule again."""
    import asyncio

    from kcops.agent.kcrec.component import READY_CHECK_S

    r = make(tmp_path, {"min_samples": 200})
    assert r.cfg.interval_s == 600.0  # the shipped one
    store = r.ctx.store

    async def run(now: float) -> None:
        await r.tick(now)
        if r.task is not None:
            await r.task

    async def body() -> None:
        t = T0 + 1000
        await run(t)  # at start: computed once, nothing to recommend
        assert r.doc is not None and r.doc["status"] == "no_data" and r.runs == 1
        feed(store, layer_values(5, 150), t + 10)  # too few
        await run(t + 10)
        assert r.runs == 1
        feed(store, layer_values(6, 100), t + 20)  # 250 each now (a reset: 150 + 100)
        await run(t + 20)
        assert r.runs == 2 and r.doc["status"] == "ok", r.doc  # not 600 s after the first
        assert store.latest(SeriesKey.of("kcops_kc_recommended_n")) is not None
        for k in range(1, 20):  # then the schedule: nothing recomputed inside the interval
            await run(t + 20 + k * READY_CHECK_S)
        assert r.runs == 2
        await run(t + 20 + 600)
        assert r.runs == 3

    asyncio.run(body())


def mass(store: Store, p: float, t: float, process: str = "w") -> None:
    store.add([Sample.of("kcops_probe_kc_mass", p, {"engine": "vllm", "process": process})], t)


def test_the_recommendation_takes_the_probes_p(tmp_path: Path) -> None:
    r = make(tmp_path, {"min_samples": 100})
    feed(r.ctx.store, layer_values(3, 400), T0 + 900)
    doc = r.compute(T0 + 1000, None)
    assert (doc["p"], doc["status"]) == (0.9, "ok") and doc["p_source"].startswith("default")
    mass(r.ctx.store, 0.8, T0 + 950)
    doc = r.compute(T0 + 1000, None)
    assert (doc["p"], doc["p_source"], doc["status"]) == (0.8, "probe", "ok")
    assert doc["calibration"]["p"] == 0.8


def test_a_configured_p_the_probe_does_not_measure_is_refused_in_one_line(tmp_path: Path) -> None:
    r = make(tmp_path, {"min_samples": 100, "p": 0.9})
    feed(r.ctx.store, layer_values(3, 400), T0 + 900)
    assert r.compute(T0 + 1000, None)["status"] == "ok"  # no probe has said: the config's
    mass(r.ctx.store, 0.8, T0 + 950)
    doc = r.compute(T0 + 1000, None)
    assert doc["status"] == "p_mismatch" and doc["uniform"] is None
    assert doc["reason"] == (
        "recommendation.p=0.9 is not what the probe measures (p=0.8, its KCOPS_PROBE_P): "
        "remove recommendation.p, or set it to 0.8"
    )
    assert all("tokens" not in row for row in doc["layers"])
    r.doc = doc
    r.write(T0 + 1000)
    assert not list(r.ctx.store.keys("kcops_kc_recommended_n"))
    # and two probes at different p cannot be summed
    r2 = make(tmp_path)
    mass(r2.ctx.store, 0.8, T0 + 950, "a")
    mass(r2.ctx.store, 0.9, T0 + 950, "b")
    feed(r2.ctx.store, layer_values(3, 400), T0 + 900)
    doc = r2.compute(T0 + 1000, None)
    assert doc["status"] == "p_mismatch" and "0.8 (vllm/a), 0.9 (vllm/b)" in doc["reason"]


def test_capacity_on_an_engine_without_a_budget_is_a_what_if_in_tokens(tmp_path: Path) -> None:
    """vLLM: no configured N, its cache size from cache_config_info (blocks x block size)."""
    r = make(tmp_path, {"min_samples": 100})
    store = r.ctx.store
    feed(store, {str(i): [40 + i] * 400 for i in range(3)}, T0 + 900)
    ctx = wire.Histogram.of(wire.CONTEXT_TOKENS)
    for c in [1000] * 30 + [200] * 10:
        ctx.observe(c)
    out: list[Sample] = []
    histogram_samples(wire.CONTEXT_TOKENS, ctx, (("engine", "vllm"),), out)
    store.add(out, T0 + 950)
    gauges = {"kcops_kv_cache_blocks": 7281, "kcops_kv_cache_block_tokens": 16,
              "kcops_kv_cache_usage_ratio": 0.25, "kcops_requests_running": 8}  # fmt: skip
    store.add([Sample.of(k, v, {"engine": "vllm"}) for k, v in gauges.items()], T0 + 995)
    doc = r.compute(T0 + 1000, None)
    cap, n = doc["capacity"], doc["uniform"]["tokens"]
    assert cap["what_if"] is True and cap["kv_share_now"] == 1.0
    assert cap["kv_cache_tokens"] == 7281 * 16
    assert cap["kv_tokens_now"] == round(0.25 * 7281 * 16)
    assert cap["kv_tokens_at_recommended"] == round(
        cap["kv_tokens_now"] * cap["kv_ratio_at_recommended"]
    )
    assert cap["kv_ratio_at_recommended"] < 1 and n < 1000
    assert cap["sequences_at_same_memory"] == math.floor(8 / cap["kv_ratio_at_recommended"] + 1e-9)
    from kcops.cli.kc_recommend import capacity_lines

    text = "\n".join(capacity_lines(cap, n))
    assert "WHAT-IF" in text and f"of the cache's {7281 * 16} tokens" in text
    mean_c = cap["mean_context_tokens"]
    assert cap["cache_sequences_now"] == math.floor(7281 * 16 / mean_c)
    assert cap["cache_sequences_at_recommended"] == math.floor(
        7281 * 16 / (mean_c * cap["kv_share_at_recommended"])
    )
    assert f"the cache holds {cap['cache_sequences_now']} sequences" in text
