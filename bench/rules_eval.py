"""Time to evaluate the full alert table once, as a share of the agent's 1 s tick.

The store holds 1 h of 1 s samples: 8 GPUs (memory used/total, utilization,
temperature, power) and the engine's series (latency, TTFT, segment transfer
and K(C) histograms, prefix cache, KV usage, shadow agreement, attention
errors, OOM, health). Run: ``.venv/bin/python bench/rules_eval.py``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from kcops.agent.promql.model import EvalError
from kcops.agent.promql.parse import parse_expr
from kcops.agent.rules.engine import RuleEngine
from kcops.agent.rules.loader import default_rules_path, load_rules
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store

T0 = 1_700_000_000.0
LAT_LE = ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf")
SEG_LE = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "+Inf")
KC_LE = ("16", "32", "64", "128", "256", "512", "1024", "2048", "+Inf")


def fill(store: Store, seconds: int, gpus: int) -> None:
    rng = random.Random(0)
    eng = {"engine": "e1"}

    def put(name: str, labels: dict[str, str], values: list[float]) -> None:
        key = SeriesKey.of(name, labels)
        for i, v in enumerate(values):
            store.append(key, T0 + i, v)

    def counter(rate: float) -> list[float]:
        out, v = [], 0.0
        for _ in range(seconds):
            v += rng.random() * 2 * rate
            out.append(v)
        return out

    def gauge(lo: float, hi: float) -> list[float]:
        return [rng.uniform(lo, hi) for _ in range(seconds)]

    for d in range(gpus):
        dev = {"device": str(d)}
        put("kcops_device_memory_used_bytes", dev, gauge(60e9, 70e9))
        put("kcops_device_memory_total_bytes", dev, [80e9] * seconds)
        put("kcops_gpu_utilization_ratio", dev, gauge(0.5, 1.0))
        put("kcops_gpu_temperature_celsius", dev, gauge(50, 80))
        put("kcops_gpu_power_watts", dev, gauge(200, 700))
    for hist, les in (
        ("kcops_request_latency_seconds", LAT_LE),
        ("kcops_ttft_seconds", LAT_LE),
        ("kcops_segment_transfer_seconds", SEG_LE),
        ("kcops_kc_tokens", KC_LE),
    ):
        base = counter(10.0)
        for i, le in enumerate(les):
            frac = (i + 1) / len(les)
            put(f"{hist}_bucket", {**eng, "le": le}, [v * frac for v in base])
        put(f"{hist}_count", eng, base)
        put(f"{hist}_sum", eng, [v * 0.2 for v in base])
    q = counter(100.0)
    put("kcops_prefix_cache_queries_total", eng, q)
    put("kcops_prefix_cache_hits_total", eng, [v * 0.96 for v in q])
    put("kcops_kv_cache_usage_ratio", eng, gauge(0.3, 0.8))
    put("kcops_shadow_agreement_ratio", eng, gauge(0.95, 0.99))
    for kind in ("nan", "inf", "exception"):
        put("kcops_attention_errors_total", {"kind": kind}, [0.0] * seconds)
    put("kcops_engine_oom_total", eng, [0.0] * seconds)
    put("kcops_engine_up", eng, [1.0] * seconds)
    put("kcops_engine_last_healthy_age_seconds", eng, [0.0] * seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--tick-s", type=float, default=1.0)
    args = ap.parse_args()
    store = Store(retention_s=args.seconds + 60)
    fill(store, args.seconds, args.gpus)
    samples = sum(len(store.range(k, T0, T0 + args.seconds)) for k in store.keys(None))
    engine = RuleEngine(load_rules(default_rules_path()), store)
    now = T0 + args.seconds - 1
    engine.evaluate(now)  # warm: compile selectors
    times = []
    for i in range(args.runs):
        t0 = time.perf_counter()
        engine.evaluate(now + i * 1e-3)
        times.append(time.perf_counter() - t0)
    errors = {n: h.error for n, h in engine.health.items() if h.error}
    med = statistics.median(times)
    per_rule = sorted(((h.duration_s, n) for n, h in engine.health.items()), reverse=True)[:3]
    print(
        f"store: {len(store)} series, {samples} samples ({args.seconds} s x 1 s, {args.gpus} GPUs)"
    )
    print(f"rules: {len(engine.ruleset.rules)}; evaluation errors: {errors or 'none'}")
    print(
        f"full table, {args.runs} runs: median {med * 1e3:.2f} ms, min {min(times) * 1e3:.2f} ms, "
        f"max {max(times) * 1e3:.2f} ms"
    )
    print(f"share of the {args.tick_s:g} s tick: {med / args.tick_s:.2%} (goal <= 2%)")
    print("slowest rules (last run): " + ", ".join(f"{n} {d * 1e3:.2f} ms" for d, n in per_rule))
    budget_report(engine, now)


# Expressions whose cost only the evaluation budget bounds (budget.py).
COSTLY = (
    "max_over_time(max_over_time(vector(1)[1h:1s])[1h:1s])",
    "max_over_time(max_over_time(vector(1)[30m:1s])[30m:1s])",
    "count_over_time(kcops_gpu_power_watts[1h:1s])",
    'count_over_time(count({__name__=~"kcops_.+"})[1h:1s])',
    'count_over_time(label_replace(kcops_gpu_power_watts, "x", "$1", "device", "(.*)")[1h:1s])',
)


def budget_report(engine: RuleEngine, now: float) -> None:
    """Units the table's rules use, and how long the budget lets costly expressions run."""
    ev = engine.evaluator
    units = []
    for rule in engine.ruleset.rules:
        ev.run(rule.node, now)
        units.append((ev.budget.used, rule.name))
    used, name = max(units)
    limit = ev.limits.max_work
    print(f"budget: {limit} units, {ev.limits.timeout_s:g} s; costliest rule {name} {used} units")
    for text in COSTLY:
        node = parse_expr(text)
        t0 = time.perf_counter()
        try:
            ev.run(node, now)
            outcome = "ok"
        except EvalError as exc:
            outcome = type(exc).__name__
        dt = time.perf_counter() - t0
        print(f"  {outcome:18s} {ev.budget.used:9d} units {dt * 1e3:8.1f} ms  {text}")


if __name__ == "__main__":
    main()
