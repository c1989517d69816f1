"""Worker throughput: base (full attention) vs optimized (top-N) path, side by side.

Steps the worker's batching loop in-process (no HTTP) on prompts of ``--context``
tokens (one or more lengths, comma-separated) cut from CPython's reference
documentation (``pydoc_data.topics``); both paths get the same prompts and the
prefix cache is emptied before each path, so it never hits. With ``--repeats R``
each context is measured R times, the order of the two paths alternating
(base first, then optimized first, …) so a burst of other work on a shared
machine falls on both; the table shows medians over the repeats.

Per path: prefill tokens/s (prompt tokens / time to the last first token),
decode tokens/s (requests / the median decode step: one loop iteration after
the prefill; a burst moves one step, not the median), the mean over all decode
steps beside it, the peak KV bytes held by decoding requests, and the greedy
agreement of the optimized path's tokens with full attention's (position by
position, free-running: after the first differing token the texts diverge).
``KV bound`` is what the budget allows: compressed layers hold N keys, dense
layers all of theirs, (D·T + (L − D)·N) / (L·T) of full attention's.

    .venv/bin/python bench/worker_throughput.py --model smollm2 --context 2048,4096,8160 \\
        --requests 1 --max-tokens 32 --threads 2 --repeats 3 [--dense-layers ""]

(8160 + 32 generated tokens stay inside SmolLM2's 8,192 positions.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass
class Result:
    path: str
    requests: int
    prompt_tokens: int
    generated_tokens: int
    ttft_s_mean: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float  # requests / median decode step
    decode_tokens_per_s_mean: float  # decoded tokens / all decode time
    total_s: float
    peak_kv_bytes: int
    context: int = 0
    agreement: float = 1.0


def prompts(tok: Any, n: int, context: int, offset: int) -> list[list[int]]:
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    ids = tok(text, add_special_tokens=False).input_ids
    out = []
    for i in range(n):
        start = (offset + i) * context
        chunk = ids[start : start + context]
        if len(chunk) < context:
            raise SystemExit(f"not enough text for {n} prompts of {context} tokens")
        out.append(chunk)
    return out


def run_path(
    state: Any, path: str, batch: list[list[int]], max_tokens: int
) -> tuple[Result, list[list[int]]]:
    from kcops.worker.engine import Event, GenRequest

    eng = state.engine
    eng.cache.evict("all")
    eng.kv_bytes_peak = 0
    state.control.set_mode("fallback" if path == "base" else "normal")
    done: list[Event] = []
    first: dict[int, float] = {}
    start = time.perf_counter()

    def emitter(i: int) -> Any:
        def emit(ev: Event) -> None:
            if ev.kind == "delta" and i not in first:
                first[i] = time.perf_counter()
            if ev.kind in ("done", "error"):
                done.append(ev)

        return emit

    # The loop is stepped here, not in its thread: all requests are admitted in the
    # same iteration, so they decode as one batch and the numbers do not depend on
    # thread timing.
    reqs = [
        GenRequest(prompt_ids=ids, max_tokens=max_tokens, emit=emitter(i))
        for i, ids in enumerate(batch)
    ]
    ends: list[float] = []
    with torch.inference_mode():
        for req in reqs:
            eng.submit(req)
        while len(done) < len(batch):
            eng._iteration()
            ends.append(time.perf_counter())
    end = ends[-1]
    errors = [e.text for e in done if e.kind == "error"]
    if errors:
        raise SystemExit(f"{path}: {errors[0]}")
    gen = sum((e.usage or {}).get("completion_tokens", 0) for e in done)
    prompt = sum(len(b) for b in batch)
    last_first = max(first.values())
    steps = [b - a for a, b in itertools.pairwise(ends) if a >= last_first]
    step = statistics.median(steps) if steps else float("inf")
    result = Result(
        path=path,
        requests=len(batch),
        prompt_tokens=prompt,
        generated_tokens=gen,
        ttft_s_mean=sum(t - start for t in first.values()) / len(first),
        prefill_tokens_per_s=prompt / (last_first - start),
        decode_tokens_per_s=len(batch) / step,
        decode_tokens_per_s_mean=(gen - len(batch)) / max(1e-9, end - last_first),
        total_s=end - start,
        peak_kv_bytes=eng.kv_bytes_peak,
        context=len(batch[0]),
    )
    return result, [r.generated for r in reqs]


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of generated positions where both paths chose the same token."""
    same = total = 0
    for x, y in zip(a, b, strict=True):
        total += max(len(x), len(y))
        same += sum(int(p == q) for p, q in zip(x, y, strict=False))
    return same / total if total else 1.0


def median_result(runs: list[Result]) -> Result:
    """Medians over repeats of the timed fields; the rest from the first run."""
    out = Result(**asdict(runs[0]))
    for key in (
        "ttft_s_mean",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "decode_tokens_per_s_mean",
        "total_s",
    ):
        setattr(out, key, statistics.median(getattr(r, key) for r in runs))
    return out


def measure(state: Any, context: int, requests: int, max_tokens: int, repeats: int) -> list[Result]:
    batch = prompts(state.engine.tok, requests, context, offset=1)
    runs: dict[str, list[Result]] = {"base": [], "optimized": []}
    tokens: dict[str, list[list[int]]] = {}
    for i in range(repeats):
        for path in ("base", "optimized") if i % 2 == 0 else ("optimized", "base"):
            res, tokens[path] = run_path(state, path, batch, max_tokens)
            runs[path].append(res)
    base, opt = median_result(runs["base"]), median_result(runs["optimized"])
    opt.agreement = agreement(tokens["base"], tokens["optimized"])
    return [base, opt]


def kv_bound(state: Any, base: Result, dense: frozenset[int], top_n: int) -> float:
    """(D·T + (L − D)·min(N, T)) / (L·T): the KV share the budget allows, T = the keys
    per layer full attention held at its peak."""
    cfg = state.engine.model.config
    layers = int(cfg.num_hidden_layers)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    itemsize = next(state.engine.model.parameters()).element_size()
    per_key = layers * 2 * cfg.num_key_value_heads * head_dim * itemsize * base.requests
    t = base.peak_kv_bytes / per_key
    d = len(dense)
    return (d * t + (layers - d) * min(top_n, t)) / (layers * t)


def report(args: argparse.Namespace, b: Result, o: Result, bound: float) -> None:
    print(
        f"model={args.model} context={b.context} requests={args.requests} "
        f"max_tokens={args.max_tokens} top_n={args.top_n} dense_layers={args.dense_layers} "
        f"threads={args.threads} repeats={args.repeats} torch={torch.__version__}"
    )
    rows = [
        ("prefill tokens/s", "prefill_tokens_per_s", "{:.0f}"),
        ("decode tokens/s (median)", "decode_tokens_per_s", "{:.1f}"),
        ("decode tokens/s (mean)", "decode_tokens_per_s_mean", "{:.1f}"),
        ("mean TTFT s", "ttft_s_mean", "{:.2f}"),
        ("total s", "total_s", "{:.1f}"),
        ("peak KV MiB (decoding)", "peak_kv_bytes", "{:.2f}"),
    ]
    print(f"{'':28}{'base':>12}{'optimized':>12}{'opt/base':>10}")
    for label, key, fmt in rows:
        bv, ov = getattr(b, key), getattr(o, key)
        if key.endswith("_bytes"):
            bv, ov = bv / 2**20, ov / 2**20
        ratio = f"{ov / bv:.4f}" if bv else "-"
        print(f"{label:28}{fmt.format(bv):>12}{fmt.format(ov):>12}{ratio:>10}")
    print(f"{'KV bound (budget/context)':28}{'':>12}{'':>12}{bound:>10.4f}")
    print(f"{'greedy agreement':28}{'':>12}{o.agreement:>12.3f}\n", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--context", default="2048", help="prompt length(s), comma-separated")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--top-n", type=int, default=64)
    ap.add_argument("--dense-layers", default="0,1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1, help="measurements per context (medians)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: allowed >= 1")

    from kcops.worker.app import WorkerOptions, build
    from kcops.worker.control import parse_layers

    contexts = [int(c) for c in args.context.split(",")]
    torch.set_num_threads(args.threads)
    opts = WorkerOptions(
        model=args.model,
        long_threshold=min(64, min(contexts) // 2),  # every measured prompt is "long"
        top_n=args.top_n,
        dense_layers=parse_layers(args.dense_layers),
        progress=False,
    )
    state = build(opts)
    # Warm-up above the routing threshold (both paths), short: first-call costs only.
    warm = prompts(state.engine.tok, 1, opts.long_threshold + 16, offset=0)
    for path in ("base", "optimized"):  # warm-up: first-call costs out of the numbers
        run_path(state, path, warm, 2)
    results = []
    for context in contexts:
        b, o = measure(state, context, args.requests, args.max_tokens, args.repeats)
        results += [b, o]
        if not args.json:
            report(args, b, o, kv_bound(state, b, opts.dense_layers, args.top_n))
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
