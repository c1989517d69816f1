"""Worker throughput: base (full attention) vs optimized (top-N) path, side by side.

Steps the worker's batching loop in-process (no HTTP) on prompts of ``--context``
tokens cut from CPython's reference documentation (``pydoc_data.topics``),
each prompt distinct so that the prefix cache never hits. Reports prefill and
decode tokens/s, end-to-end tokens/s, and the peak resident memory above the
loaded model (sampled every 10 ms) for each path.

    .venv/bin/python bench/worker_throughput.py --model smollm2 --context 2048
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


def run_path(state: Any, path: str, batch: list[list[int]], max_tokens: int) -> Result:
    from kcops.worker.engine import Event, GenRequest

    eng = state.engine
    eng.cache.evict("all")
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
    with RssPeak() as peak, torch.inference_mode():
        base_rss = peak.peak
        for i, ids in enumerate(batch):
            eng.submit(GenRequest(prompt_ids=ids, max_tokens=max_tokens, emit=emitter(i)))
        while len(done) < len(batch):
            eng._iteration()
    end = time.perf_counter()
    errors = [e.text for e in done if e.kind == "error"]
    if errors:
        raise SystemExit(f"{path}: {errors[0]}")
    gen = sum((e.usage or {}).get("completion_tokens", 0) for e in done)
    prompt = sum(len(b) for b in batch)
    last_first = max(first.values())
    return Result(
        path=path,
        requests=len(batch),
        prompt_tokens=prompt,
        generated_tokens=gen,
        ttft_s_mean=sum(t - start for t in first.values()) / len(first),
        prefill_tokens_per_s=prompt / (last_first - start),
        decode_tokens_per_s=(gen - len(batch)) / max(1e-9, end - last_first),
        total_s=end - start,
        peak_rss_over_model_bytes=peak.peak - base_rss,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--top-n", type=int, default=64)
    ap.add_argument("--dense-layers", default="0,1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from kcops.worker.app import WorkerOptions, build
    from kcops.worker.control import parse_layers

    torch.set_num_threads(args.threads)
    opts = WorkerOptions(
        model=args.model,
        long_threshold=args.context // 2,
        top_n=args.top_n,
        dense_layers=parse_layers(args.dense_layers),
        progress=False,
    )
    state = build(opts)
    warm = prompts(state.engine.tok, 1, 256, offset=0)
    for path in ("base", "optimized"):  # warm-up: first-call costs out of the numbers
        run_path(state, path, warm, 2)
    results = []
    for k, path in enumerate(("base", "optimized")):
        batch = prompts(state.engine.tok, args.requests, args.context, offset=1 + k * args.requests)
        results.append(run_path(state, path, batch, args.max_tokens))
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return
    b, o = results
    print(
        f"model={args.model} context={args.context} requests={args.requests} "
        f"max_tokens={args.max_tokens} top_n={args.top_n} dense_layers={args.dense_layers} "
        f"threads={args.threads} torch={torch.__version__}"
    )
    rows = [
        ("prefill tokens/s", "prefill_tokens_per_s", "{:.0f}"),
        ("decode tokens/s", "decode_tokens_per_s", "{:.1f}"),
        ("mean TTFT s", "ttft_s_mean", "{:.2f}"),
        ("total s", "total_s", "{:.1f}"),
        ("peak RSS over model MiB", "peak_rss_over_model_bytes", "{:.0f}"),
    ]
    print(f"{'':28}{'base':>12}{'optimized':>12}{'opt/base':>10}")
    for label, key, fmt in rows:
        bv, ov = getattr(b, key), getattr(o, key)
        if key.endswith("_bytes"):
            bv, ov = bv / 2**20, ov / 2**20
        ratio = f"{ov / bv:.2f}" if bv else "-"
        print(f"{label:28}{fmt.format(bv):>12}{fmt.format(ov):>12}{ratio:>10}")


if __name__ == "__main__":
    main()
