"""Where ``kc_live`` moves the keys on SmolLM2: per layer, its split at the cut and after
decoding, against ``per_layer``'s, with the edge mass and kept K_0.9 it measured.

One sequence of the ``pydoc`` corpus, teacher-forced; no accuracy (that is ``kc sweep``).

    PYTHONPATH=$PWD .venv/bin/python bench/kc_live_trace.py --context 512 --eval 32 --n 32
"""

from __future__ import annotations

import argparse

import torch

from kcops.kernels.topn import register
from kcops.lab.kclive import LiveBudget
from kcops.lab.sweep import budgets, chunks, corpus_text, decode_groups, prefill
from kcops.worker.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--eval", type=int, default=32)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, progress=False, attn_implementation=register())
    ids = tok(corpus_text("pydoc", 16 * args.context), add_special_tokens=False).input_ids
    pre = prefill(model, chunks(ids, 1, args.context), args.eval)
    layers = len(pre.kv)
    per = budgets("kc_live", args.n, layers, args.context, pre.kp)
    live = LiveBudget(list(per), args.context)
    ev = decode_groups(model, pre, [(per, True)], [live])[0]["live"]
    if ev is None:
        raise SystemExit(f"N={args.n} covers the context {args.context}: nothing to split")
    pl = budgets("per_layer", args.n, layers, args.context, pre.kp)
    print(
        "| layer | kc_live start | kc_live end | per_layer | prefill K_0.9 | edge mass ×1e3 "
        "| kept K_0.9 |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for i in range(layers):
        print(
            f"| {i} | {ev['budgets'][0][i]} | {ev['budgets'][-1][i]} | {pl[i]} | "
            f"{pre.kp[i]:.0f} | {ev['edge_mass'][i] * 1e3:.2f} | {ev['kept_k0.9'][i]:.1f} |"
        )


if __name__ == "__main__":
    main()
