"""``kc sweep``'s decode step: the cut in place (new key into the evicted slot) against
the cut by re-gathering the layer in position order, side by side in one run.

    PYTHONPATH=. .venv/bin/python bench/sweep_cut.py --context 2048 --n 256,1024 --pairs 3

SmolLM2-135M, ``--sequences`` sequences of the pydoc corpus prefilled once; each pair
decodes ``--steps`` teacher-forced steps of all the N rows at once (kc sweep's batched
decode, :func:`kcops.lab.sweep.decode_groups`) both ways, alternating which goes
first; prints the median of the per-pair time ratios gather / in place.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--n", default="256,1024")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from kcops.kernels.topn import register
    from kcops.lab import sweep as sw
    from kcops.worker.models import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model("smollm2", progress=False, attn_implementation=register())
    ids = tok(sw.corpus_text("pydoc", 10**6), add_special_tokens=False).input_ids
    seqs = sw.chunks(ids, args.sequences, args.context)
    pre = sw.prefill(model, seqs, args.steps)
    layers = len(pre.kv)
    plans = [([int(n)] * layers, True) for n in args.n.split(",")]
    real = sw._kept_layer

    def by_gather(pre: Any, i: int, n: int | None, heavy: bool) -> Any:
        layer = real(pre, i, n, heavy)
        if layer.pos is not None:  # slots are in position order right after the first cut
            layer.pos = None
        return layer

    def timed(gather: bool) -> float:
        sw._kept_layer = by_gather if gather else real  # type: ignore[assignment]
        try:
            t0 = time.perf_counter()
            sw.decode_groups(model, pre, plans)
            return time.perf_counter() - t0
        finally:
            sw._kept_layer = real  # type: ignore[assignment]

    ratios = []
    for i in range(args.pairs):
        if i % 2 == 0:
            g, p = timed(True), timed(False)
        else:
            p, g = timed(False), timed(True)
        ratios.append(g / p)
        print(f"pair {i + 1}: gather {g:.2f} s, in place {p:.2f} s, ratio {g / p:.2f}", flush=True)
    print(
        f"context {args.context}, N {args.n}, {args.sequences} sequences x {args.steps} steps: "
        f"gather / in place, median of {args.pairs} pairs = {statistics.median(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
