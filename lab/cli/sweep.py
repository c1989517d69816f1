"""``kcops kc sweep``: accuracy against the KV budget N, per policy, on a corpus."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from kcops.cli.common import FiniteFloat, handle_errors
from kcops.lab.cli.options import check_model, parse_ints, parse_policies


@click.command("sweep")
@click.option("--model", "model_name", required=True, help="tiny, smollm2 or a local HF folder.")
@click.option(
    "--corpus", default="pydoc", show_default=True, help="pydoc, stdlib, a file or a folder."
)
@click.option("--n", "n_raw", default="16,32,64,128,256,512", show_default=True, help="Budgets N.")
@click.option("--context", "ctx_raw", default="1024", show_default=True, help="Context lengths.")
@click.option(
    "--policies",
    "pol_raw",
    default="uniform,per_layer,dense_first,window",
    show_default=True,
    help="Budget policies to compare.",
)
@click.option("--sequences", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option("--eval-tokens", type=click.IntRange(1, 4096), default=32, show_default=True)
@click.option(
    "--tolerance",
    type=FiniteFloat(0.0, 100.0),
    default=1.0,
    show_default=True,
    help="Accuracy points below full attention still acceptable.",
)
@click.option("--out", "out_dir", default=None, help="Folder for rows (resumable) and tables.")
@click.option("--threads", type=click.IntRange(1, 256), default=None, help="torch CPU threads.")
@click.option("--json", "as_json", is_flag=True, help="Print rows and recommendation as JSON.")
@handle_errors
def sweep_cmd(
    model_name: str,
    corpus: str,
    n_raw: str,
    ctx_raw: str,
    pol_raw: str,
    sequences: int,
    eval_tokens: int,
    tolerance: float,
    out_dir: str | None,
    threads: int | None,
    as_json: bool,
) -> None:
    """Accuracy, agreement, perplexity, speed and KV bytes per budget N, against full attention."""
    ns = parse_ints(n_raw, "--n")
    contexts = parse_ints(ctx_raw, "--context")
    policies = parse_policies(pol_raw)
    check_model(model_name)
    if eval_tokens >= min(contexts):
        raise click.BadParameter(
            f"{eval_tokens} must be below the smallest context {min(contexts)}",
            param_hint="--eval-tokens",
        )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from kcops.kernels.topn import register
    from kcops.lab.sweep import SweepError
    from kcops.lab.sweeprun import run_sweep
    from kcops.worker.models import context_tokens, load_model

    if threads is not None:
        torch.set_num_threads(threads)
    model, tok = load_model(model_name, progress=True, attn_implementation=register())
    limit = context_tokens(model)
    if max(contexts) > limit:
        raise SweepError(f"--context {max(contexts)}: {model_name} allows at most {limit}")
    doc = run_sweep(
        model_name=model_name,
        corpus=corpus,
        ns=ns,
        contexts=contexts,
        policies=policies,
        sequences=sequences,
        eval_tokens=eval_tokens,
        tolerance=tolerance,
        out=Path(out_dir) if out_dir else None,
        model=model,
        tok=tok,
    )
    if as_json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        click.echo(doc["markdown"])
