"""Worker throughput: base (full attention) vs optimized (top-N) path, side by side.

Steps the worker's batching loop in-process (no HTTP) on prompts of ``--context``
tokens (one or more lengths, comma-separated) cut from CPython's reference
documentation (``pydoc_data.topics``); both paths get the same prompts and the
prefix cache is emptied before each path, so it never hits. Reports prefill and
decode tokens/s, the peak KV bytes held by decoding requests, the peak resident
memory above the loaded model (sampled every 10 ms), and the greedy agreement of
the optimized path's tokens with full attention's (position by position).

    .venv/bin/python bench/worker_throughput.py --model smollm2 --context 2048,4096,8160 \
        --requests 1 --max-tokens 32 --threads 2 [--dense-layers ""]

(8160 + 32 generated tokens stay inside SmolLM2's 8,192 positions.)
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil
import torch


@dataclass
class Result:
    path: str
    requests: int
    prompt_tokens: int
    generated_tokens: int
    ttft_s_mean: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    total_s: float
    peak_rss_over_model_bytes: int
    peak_kv_bytes: int
    context: int = 0
    agreement: float = 1.0


class RssPeak:
    def __init__(self, interval_s: float = 0.01) -> None:
        self.proc = psutil.Process(os.getpid())
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval_s)

    def __enter__(self) -> RssPeak:
        self.peak = self.proc.memory_info().rss
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


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
    with RssPeak() as peak, torch.inference_mode():
        base_rss = peak.peak
        for req in reqs:
            eng.submit(req)
        while len(done) < len(batch):
            eng._iteration()
    end = time.perf_counter()
    errors = [e.text for e in done if e.kind == "error"]
    if errors:
        raise SystemExit(f"{path}: {errors[0]}")
    gen = sum((e.usage or {}).get("completion_tokens", 0) for e in done)
    prompt = sum(len(b) for b in batch)
    last_first = max(first.values())
    result = Result(
        path=path,
        requests=len(batch),
        prompt_tokens=prompt,
        generated_tokens=gen,
        ttft_s_mean=sum(t - start for t in first.values()) / len(first),
        prefill_tokens_per_s=prompt / (last_first - start),
        decode_tokens_per_s=(gen - len(batch)) / max(1e-9, end - last_first),
        total_s=end - start,
        peak_rss_over_model_bytes=peak.peak - base_rss,
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


def measure(state: Any, context: int, requests: int, max_tokens: int) -> list[Result]:
    batch = prompts(state.engine.tok, requests, context, offset=1)
    base, base_tokens = run_path(state, "base", batch, max_tokens)
    opt, opt_tokens = run_path(state, "optimized", batch, max_tokens)
    opt.agreement = agreement(base_tokens, opt_tokens)
    return [base, opt]


def report(args: argparse.Namespace, b: Result, o: Result) -> None:
    print(
        f"model={args.model} context={b.context} requests={args.requests} "
        f"max_tokens={args.max_tokens} top_n={args.top_n} dense_layers={args.dense_layers} "
        f"threads={args.threads} torch={torch.__version__}"
    )
    rows = [
        ("prefill tokens/s", "prefill_tokens_per_s", "{:.0f}"),
        ("decode tokens/s", "decode_tokens_per_s", "{:.1f}"),
        ("mean TTFT s", "ttft_s_mean", "{:.2f}"),
        ("total s", "total_s", "{:.1f}"),
        ("peak KV MiB (decoding)", "peak_kv_bytes", "{:.1f}"),
        ("peak RSS over model MiB", "peak_rss_over_model_bytes", "{:.0f}"),
    ]
    print(f"{'':28}{'base':>12}{'optimized':>12}{'opt/base':>10}")
    for label, key, fmt in rows:
        bv, ov = getattr(b, key), getattr(o, key)
        if key.endswith("_bytes"):
            bv, ov = bv / 2**20, ov / 2**20
        ratio = f"{ov / bv:.3f}" if bv else "-"
        print(f"{label:28}{fmt.format(bv):>12}{fmt.format(ov):>12}{ratio:>10}")
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

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
        b, o = measure(state, context, args.requests, args.max_tokens)
        results += [b, o]
        if not args.json:
            report(args, b, o)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
