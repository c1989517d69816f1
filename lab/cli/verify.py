"""``kcops kc verify``: the top-N paths against dense attention on the same positions."""

from __future__ import annotations

import json
import os
import sys

import click

from kcops.cli.common import handle_errors
from kcops.lab.cli.options import check_model, save


@click.command("verify")
@click.option("--model", "model_name", required=True, help="tiny, smollm2 or a local HF folder.")
@click.option(
    "--corpus", default="pydoc", show_default=True, help="pydoc, stdlib, a file or a folder."
)
@click.option("--context", type=click.IntRange(2, 1 << 16), default=256, show_default=True)
@click.option("--sequences", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option(
    "--variants",
    "var_raw",
    default="full,topn:32,topn:128,window:64:4,performer:64,performer:256",
    show_default=True,
    help="full, topn:N, window:W:G, performer:M.",
)
@click.option("--threads", type=click.IntRange(1, 256), default=None, help="torch CPU threads.")
@click.option("--out", "out_dir", default=None, help="Folder to write verify.json into.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@handle_errors
def verify_cmd(
    model_name: str,
    corpus: str,
    context: int,
    sequences: int,
    var_raw: str,
    threads: int | None,
    out_dir: str | None,
    as_json: bool,
) -> None:
    """Relative error, KL and greedy agreement of approximations vs full attention; pass/fail."""
    from kcops.lab import verify as ver
    from kcops.lab.sweep import SweepError

    try:
        variants = [ver.parse_variant(v) for v in var_raw.split(",") if v.strip()]
    except SweepError as exc:
        raise click.BadParameter(str(exc), param_hint="--variants") from None
    check_model(model_name)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from tqdm import tqdm

    from kcops.lab.sweep import chunks, corpus_text
    from kcops.worker.models import load_model

    if threads is not None:
        torch.set_num_threads(threads)
    model, tok = load_model(model_name, progress=not as_json, attn_implementation=ver.register())
    ids = tok(corpus_text(corpus, 8 * sequences * context), add_special_tokens=False).input_ids
    seqs = chunks(ids, sequences, context - 1)
    with tqdm(total=len(variants), desc="kc verify", unit="variant") as bar:
        results = ver.verify(model, seqs, variants, tick=lambda: bar.update(1))
    save(out_dir, "verify.json", {"thresholds": ver.THRESHOLDS, "results": results})
    if as_json:
        json.dump({"thresholds": ver.THRESHOLDS, "results": results}, sys.stdout)
        sys.stdout.write("\n")
        return
    tasks = list(ver.THRESHOLDS)
    click.echo(
        f"{'variant':16} {'max rel err':>12} {'mean KL':>10} {'agreement':>10} "
        + " ".join(f"{t:>14}" for t in tasks)
    )
    for r in results:
        verdicts = " ".join(f"{'pass' if r['pass'][t] else 'FAIL':>14}" for t in tasks)
        click.echo(
            f"{r['variant']:16} {r['max_rel_error']:>12.2e} {r['mean_kl']:>10.2e} "
            f"{r['agreement']:>10.3f} {verdicts}"
        )
    click.echo(
        "thresholds (max per-layer relative error): "
        + ", ".join(f"{t} {v:g}" for t, v in ver.THRESHOLDS.items())
    )
