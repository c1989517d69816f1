"""``kcops kc``: measure K(C) of a model on a text with the attention probe.

torch, transformers and the worker's model loader are imported inside the
command, so ``kcops --help`` works in a slim sidecar image.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kcops.cli.common import FiniteFloat, handle_errors

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MAX_TOKENS = 512
TOPN = (16, 32, 64)


def parse_p(raw: str) -> tuple[float, ...]:
    """``"0.9,0.95"`` -> (0.9, 0.95); each in (0, 1]."""
    try:
        values = tuple(float(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(
            f"{raw!r}: expected numbers in (0, 1], e.g. 0.9,0.95", param_hint="--p"
        ) from None
    if not values or not all(0.0 < p <= 1.0 for p in values):
        raise click.BadParameter(
            f"{raw!r}: every p must be in (0, 1], e.g. 0.9,0.95", param_hint="--p"
        )
    return tuple(dict.fromkeys(values))


def parse_rows(raw: str) -> str | int:
    """``last``, ``all`` or a positive int N."""
    raw = raw.strip()
    if raw in ("last", "all"):
        return raw
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    raise click.BadParameter(
        f"{raw!r}: allowed 'last', 'all' or a positive integer", param_hint="--rows"
    )


def check_model(name: str) -> None:
    if name in ("tiny", "smollm2"):
        return
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise click.BadParameter(
            f"{name!r}: allowed 'tiny', 'smollm2' or a local Hugging Face model folder "
            "(with config.json)",
            param_hint="--model",
        )


def read_text(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise click.BadParameter(f"{path!r}: no such file", param_hint="--text") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path!r}: cannot read as UTF-8 text: {exc}") from None
    if not text.strip():
        raise click.BadParameter(f"{path!r}: the file is empty", param_hint="--text")
    return text


def _load_model(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from kcops.worker.models import load_model

    return load_model(name, progress=True, attn_implementation="sdpa")


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


@click.group("kc", help="K(C): how many context tokens the model's attention really uses.")
def kc_group() -> None:
    pass


@kc_group.command("measure")
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
    model, tok = _load_model(model_name)
    limit = min(max_tokens, int(getattr(model.config, "max_position_embeddings", max_tokens)))
    ids = tok(text, return_tensors="pt", truncation=True, max_length=limit)["input_ids"]
    if ids.shape[-1] < 1:
        raise click.BadParameter(f"{text_file!r}: no tokens", param_hint="--text")
    doc = measure(model, ids, p_values=p_values, rows=rows, model_name=model_name)
    if out_dir is not None:
        from kcops.kernels import maps

        _save(out_dir, "measure.json", doc)
        maps.capture(model, ids, rows=map_rows, p=p_values[0]).save(Path(out_dir))
    if as_json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        click.echo("\n".join(summary_lines(doc)))


def parse_ints(raw: str, hint: str) -> tuple[int, ...]:
    """``"16,32,64"`` -> (16, 32, 64); each a positive integer, duplicates dropped."""
    try:
        values = tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(
            f"{raw!r}: expected positive integers, e.g. 16,32,64", param_hint=hint
        ) from None
    if not values or min(values) < 1:
        raise click.BadParameter(
            f"{raw!r}: expected positive integers, e.g. 16,32,64", param_hint=hint
        )
    return tuple(sorted(dict.fromkeys(values)))


def parse_policies(raw: str) -> tuple[str, ...]:
    from kcops.kernels.sweep import POLICIES

    values = tuple(dict.fromkeys(x.strip() for x in raw.split(",") if x.strip()))
    bad = [v for v in values if v not in POLICIES]
    if not values or bad:
        raise click.BadParameter(f"{raw!r}: allowed {', '.join(POLICIES)}", param_hint="--policies")
    return values


@kc_group.command("sweep")
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

    from kcops.kernels.sweep import SweepError
    from kcops.kernels.sweeprun import run_sweep
    from kcops.kernels.topn import register
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


@kc_group.command("kpred")
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
    from kcops.kernels.kpred import VARIANTS

    variants = tuple(dict.fromkeys(v.strip() for v in var_raw.split(",") if v.strip()))
    if not variants or any(v not in VARIANTS for v in variants):
        raise click.BadParameter(
            f"{var_raw!r}: allowed {', '.join(VARIANTS)}", param_hint="--variants"
        )
    check_model(model_name)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from tqdm import tqdm

    from kcops.kernels import kpred
    from kcops.kernels.sweep import chunks, corpus_text
    from kcops.kernels.topn import register
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
    _save(out_dir, "kpred.json", doc)
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


@kc_group.command("verify")
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
    from kcops.kernels import verify as ver
    from kcops.kernels.sweep import SweepError

    try:
        variants = [ver.parse_variant(v) for v in var_raw.split(",") if v.strip()]
    except SweepError as exc:
        raise click.BadParameter(str(exc), param_hint="--variants") from None
    check_model(model_name)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from tqdm import tqdm

    from kcops.kernels.sweep import chunks, corpus_text
    from kcops.worker.models import load_model

    if threads is not None:
        torch.set_num_threads(threads)
    model, tok = load_model(model_name, progress=not as_json, attn_implementation=ver.register())
    ids = tok(corpus_text(corpus, 8 * sequences * context), add_special_tokens=False).input_ids
    seqs = chunks(ids, sequences, context - 1)
    with tqdm(total=len(variants), desc="kc verify", unit="variant") as bar:
        results = ver.verify(model, seqs, variants, tick=lambda: bar.update(1))
    _save(out_dir, "verify.json", {"thresholds": ver.THRESHOLDS, "results": results})
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


def _save(out_dir: str | None, name: str, doc: object) -> None:
    if out_dir is None:
        return
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(doc), encoding="utf-8")


@kc_group.command("report")
@click.argument("folder")
@click.option("--tolerance", type=FiniteFloat(0.0, 100.0), default=1.0, show_default=True)
@click.option(
    "--tensorboard",
    is_flag=True,
    help="Also write the pictures as TensorBoard event files under FOLDER/tensorboard.",
)
@handle_errors
def report_cmd(folder: str, tolerance: float, tensorboard: bool) -> None:
    """One HTML page (tables + PNGs) from the --out folder of kc sweep / measure / kpred /
    verify."""
    import importlib.util

    try:
        import matplotlib  # noqa: F401  (the viz extra)
    except ImportError as exc:
        msg = f"kc report needs the viz extra (pip install kcops[viz]): {exc}"
        raise click.ClickException(msg) from None
    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        msg = "kc report --tensorboard needs the tensorboard package (pip install kcops[viz])"
        raise click.ClickException(msg)
    from kcops.kernels.report import render

    page = render(Path(folder), tolerance, tensorboard=tensorboard)
    click.echo(str(page))
    if tensorboard:
        click.echo(str(Path(folder) / "tensorboard"))


def _add_recommend() -> None:
    from kcops.cli.kc_recommend import recommend_cmd  # torch-free, reads the agent

    kc_group.add_command(recommend_cmd)
    from kcops.cli.kc_claim import claim_cmd  # reads sweep folders

    kc_group.add_command(claim_cmd)
    from kcops.cli.kc_retrieve import retrieve_cmd  # torch inside the command

    kc_group.add_command(retrieve_cmd)


_add_recommend()
