"""``kcops kc retrieve``: a retrieval task for K(C) budgets (docs/kc.md, "kc retrieve").

torch and the model loader are imported inside the command (``kcops --help`` stays slim)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from kcops.cli.common import FiniteFloat, handle_errors
from kcops.lab.cli.options import check_model, parse_ints, parse_policies


def parse_depths(raw: str) -> tuple[float, ...]:
    """``"0.1,0.5,0.9"`` -> (0.1, 0.5, 0.9); each in [0, 1]."""
    try:
        values = tuple(float(x) for x in raw.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or not all(0.0 <= d <= 1.0 for d in values):
        raise click.BadParameter(
            f"{raw!r}: expected fractions in [0, 1], e.g. 0.1,0.5,0.9", param_hint="--depths"
        )
    return tuple(dict.fromkeys(values))


@click.command("retrieve")
@click.option("--model", "model_name", required=True, help="tiny, smollm2 or a local HF folder.")
@click.option(
    "--task", type=click.Choice(["passkey", "code"]), default="passkey", show_default=True
)
@click.option("--lengths", "len_raw", default="512,1024,2048", show_default=True, help="Tokens.")
@click.option("--depths", "depth_raw", default="0.1,0.5,0.9", show_default=True)
@click.option("--items", type=click.IntRange(1, 100_000), default=8, show_default=True)
@click.option("--n", "n_raw", default="32,64,128,256", show_default=True, help="Budgets N.")
@click.option(
    "--policies",
    "pol_raw",
    default="uniform,dense_first,window",
    show_default=True,
    help="Budget policies (those of kc sweep).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--min-full",
    type=FiniteFloat(0.0, 1.0),
    default=0.5,
    show_default=True,
    help="Full attention's accuracy for a cell to count as one it succeeds in.",
)
@click.option(
    "--tolerance",
    type=FiniteFloat(0.0, 100.0),
    default=1.0,
    show_default=True,
    help="Points of loss allowed: a budget holds when Δ − 2 SE ≥ −tolerance.",
)
@click.option("--out", "out_dir", default=None, help="Folder for rows (resumable) and tables.")
@click.option("--threads", type=click.IntRange(1, 256), default=None, help="torch CPU threads.")
@click.option("--json", "as_json", is_flag=True, help="Print cells and comparison as JSON.")
@handle_errors
def retrieve_cmd(
    model_name: str,
    task: str,
    len_raw: str,
    depth_raw: str,
    items: int,
    n_raw: str,
    pol_raw: str,
    seed: int,
    min_full: float,
    tolerance: float,
    out_dir: str | None,
    threads: int | None,
    as_json: bool,
) -> None:
    """Accuracy of retrieving a key hidden deep in the context, full attention against budgets."""
    lengths = parse_ints(len_raw, "--lengths")
    depths = parse_depths(depth_raw)
    ns = parse_ints(n_raw, "--n")
    policies = parse_policies(pol_raw)
    check_model(model_name)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from kcops.kernels.topn import register
    from kcops.lab.retrieverun import run_retrieve
    from kcops.lab.sweep import SweepError
    from kcops.worker.models import context_tokens, load_model

    if threads is not None:
        torch.set_num_threads(threads)
    model, tok = load_model(model_name, progress=True, attn_implementation=register())
    limit = context_tokens(model)
    if max(lengths) + 8 > limit:
        raise SweepError(f"--lengths {max(lengths)}: {model_name} allows at most {limit - 8}")
    doc = run_retrieve(
        model_name=model_name,
        task=task,
        lengths=lengths,
        depths=depths,
        items=items,
        ns=ns,
        policies=policies,
        seed=seed,
        min_full=min_full,
        tolerance=tolerance,
        out=Path(out_dir) if out_dir else None,
        model=model,
        tok=tok,
    )
    if as_json:
        json.dump({k: v for k, v in doc.items() if k != "markdown"}, sys.stdout)
        sys.stdout.write("\n")
    else:
        click.echo(doc["markdown"])
