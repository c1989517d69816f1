"""``kcops kc kpred``: the prediction-preserving K (DESIGN §4) of a model on a corpus."""

from __future__ import annotations

import json
import os
import sys

import click

from kcops.cli.common import handle_errors
from kcops.lab.cli.options import check_model, save


@click.command("kpred")
@click.option("--model", "model_name", required=True, help="tiny, smollm2 or a local HF folder.")
@click.option(
    "--corpus", default="pydoc", show_default=True, help="pydoc, stdlib, a file or a folder."
)
@click.option("--context", type=click.IntRange(2, 1 << 20), default=1024, show_default=True)
@click.option(
    "--positions",
    type=click.IntRange(1, 4096),
    default=16,
    show_default=True,
    help="Query positions per sequence (second half, evenly spaced).",
)
@click.option("--sequences", type=click.IntRange(1, 256), default=2, show_default=True)
@click.option("--variants", "var_raw", default="recency,top", show_default=True)
@click.option("--threads", type=click.IntRange(1, 256), default=None, help="torch CPU threads.")
@click.option("--out", "out_dir", default=None, help="Folder to write kpred.json into.")
@click.option("--json", "as_json", is_flag=True, help="Print summary and rows as JSON.")
@handle_errors
def kpred_cmd(
    model_name: str,
    corpus: str,
    context: int,
    positions: int,
    sequences: int,
    var_raw: str,
    threads: int | None,
    out_dir: str | None,
    as_json: bool,
) -> None:
    """K_pred: the least recent / top-attended context that keeps the greedy token."""
    from kcops.lab.kpred import VARIANTS

    variants = tuple(dict.fromkeys(v.strip() for v in var_raw.split(",") if v.strip()))
    if not variants or any(v not in VARIANTS for v in variants):
        raise click.BadParameter(
            f"{var_raw!r}: allowed {', '.join(VARIANTS)}", param_hint="--variants"
        )
    check_model(model_name)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from tqdm import tqdm

    from kcops.kernels.topn import register
    from kcops.lab import kpred
    from kcops.lab.sweep import chunks, corpus_text
    from kcops.worker.models import load_model

    if threads is not None:
        torch.set_num_threads(threads)
    model, tok = load_model(model_name, progress=not as_json, attn_implementation=register())
    ids = tok(corpus_text(corpus, 8 * sequences * context), add_special_tokens=False).input_ids
    seqs = chunks(ids, sequences, context - 1)
    total = sequences * len(kpred.positions(context, positions)) * len(variants)
    with tqdm(total=total, desc="kc kpred", unit="token") as bar:
        rows = kpred.measure(
            model, seqs, count=positions, variants=variants, tick=lambda: bar.update(1)
        )
    doc = kpred.summary(rows)
    save(out_dir, "kpred.json", doc)
    if as_json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return
    click.echo(f"K_pred on {model_name}, {corpus}, context {context}, {len(rows)} rows")
    for v, s in doc["summary"].items():
        click.echo(
            f"  {v:8} median {s['k_pred_median']:>6} p90 {s['k_pred_p90']:>6} "
            f"median ratio {s['ratio_median']:.3f}  share needing < 10% of context "
            f"{s['share_below_10pct']:.2f}"
        )
