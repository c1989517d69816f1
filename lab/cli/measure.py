"""``kcops kc measure``: K(C) of a model on a text, every chosen row, with the probe."""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kcops.cli.common import handle_errors
from kcops.lab.cli.options import check_model, load_model, parse_p, parse_rows, read_text, save

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

DEFAULT_MAX_TOKENS = 512
TOPN = (16, 32, 64)


def measure(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    p_values: tuple[float, ...],
    rows: str | int,
    model_name: str,
) -> dict[str, Any]:
    """One forward pass with the probe recording every chosen row; returns the ``--json``
    document (see docs/probe.md)."""
    import torch

    import kcops.kernels as kernels

    kernels.uninstall()
    probe = kernels.install(
        kernels.ProbeConfig(
            sample_rate=1.0,
            rows=rows,
            p_values=p_values,
            topn=TOPN,
            record=True,
            publish=False,
            nvtx=False,
            integrations=("transformers",),
            max_batch_rows=1,
        )
    )
    try:
        with torch.no_grad():
            model(input_ids)
        records = list(probe.records)
    finally:
        kernels.uninstall()
    layers: dict[int, list[dict[str, Any]]] = {}
    for layer, row in records:
        layers.setdefault(int(layer) if layer.isdigit() else -1, []).append(
            {
                "position": row.position,
                "k_union": {str(p): row.k_union[p] for p in p_values},
                "k_heads": {str(p): row.k_heads[p] for p in p_values},
                "topn_mass": {str(n): row.topn_mass[n] for n in TOPN},
            }
        )
    return {
        "model": model_name,
        "tokens": int(input_ids.shape[-1]),
        "p": list(p_values),
        "layers": [{"layer": k, "rows": v} for k, v in sorted(layers.items())],
    }


def _q(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (0 < q <= 1) of a non-empty sequence."""
    ordered = sorted(values)
    idx = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return float(ordered[idx])


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """The human-readable table: per layer and p, median/p90 over rows."""
    lines = [
        f"model {doc['model']}, {doc['tokens']} tokens, "
        f"rows per layer: {len(doc['layers'][0]['rows']) if doc['layers'] else 0}",
        "K_union = union of the top-K_p keys over the query heads of a KV group (largest group);",
        "K_head = per-head K_p (median over heads); kappa = K_union / visible tokens.",
        "",
    ]
    head = f"{'layer':>5} {'p':>5} {'K_union med':>11} {'p90':>6} {'K_head med':>10} {'p90':>6}"
    head += f" {'kappa med':>9} {'p90':>6}" + "".join(f" {'top' + str(n):>6}" for n in TOPN)
    lines.append(head)
    for layer in doc["layers"]:
        rows = layer["rows"]
        if not rows:
            continue
        for p in doc["p"]:
            key = str(p)
            ku = [r["k_union"][key] for r in rows]
            kh = [statistics.median(r["k_heads"][key]) for r in rows]
            kappa = [r["k_union"][key] / (r["position"] + 1) for r in rows]
            mass = [statistics.median(r["topn_mass"][str(n)] for r in rows) for n in TOPN]
            lines.append(
                f"{layer['layer']:>5} {p:>5} {statistics.median(ku):>11.1f} {_q(ku, 0.9):>6.0f}"
                f" {statistics.median(kh):>10.1f} {_q(kh, 0.9):>6.0f}"
                f" {statistics.median(kappa):>9.3f} {_q(kappa, 0.9):>6.3f}"
                + "".join(f" {m:>6.3f}" for m in mass)
            )
    return lines


@click.command("measure")
@click.option("--model", "model_name", required=True, help="tiny, smollm2 or a local HF folder.")
@click.option("--text", "text_file", required=True, help="UTF-8 text file to measure on.")
@click.option("--p", "p_raw", default="0.9", show_default=True, help="Mass levels, e.g. 0.9,0.95.")
@click.option("--rows", "rows_raw", default="all", show_default=True, help="last, all or N.")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_TOKENS,
    show_default=True,
    help="Truncate the text to this many tokens (and to the model's context).",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    help="Folder for measure.json and attention.npz (heatmaps and K_p per layer for kc report).",
)
@click.option(
    "--map-rows",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Sampled queries whose attention maps --out keeps.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document (docs/probe.md).")
@handle_errors
def measure_cmd(
    model_name: str,
    text_file: str,
    p_raw: str,
    rows_raw: str,
    max_tokens: int,
    out_dir: str | None,
    map_rows: int,
    as_json: bool,
) -> None:
    """Per layer K_p (median/p90 over query rows, union and per head), kappa and top-N mass."""
    p_values = parse_p(p_raw)
    rows = parse_rows(rows_raw)
    check_model(model_name)
    text = read_text(text_file)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model, tok = load_model(model_name)
    limit = min(max_tokens, int(getattr(model.config, "max_position_embeddings", max_tokens)))
    ids = tok(text, return_tensors="pt", truncation=True, max_length=limit)["input_ids"]
    if ids.shape[-1] < 1:
        raise click.BadParameter(f"{text_file!r}: no tokens", param_hint="--text")
    doc = measure(model, ids, p_values=p_values, rows=rows, model_name=model_name)
    if out_dir is not None:
        from kcops.lab import maps

        save(out_dir, "measure.json", doc)
        maps.capture(model, ids, rows=map_rows, p=p_values[0]).save(Path(out_dir))
    if as_json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        click.echo("\n".join(summary_lines(doc)))
