"""The lab's ``kcops kc`` subcommands (listed in :mod:`kcops.cli.kc`): measure, sweep, kpred,
verify, retrieve, claim and report.

torch, transformers and the model loader are imported inside the commands (``kcops --help``
stays slim); the options every command shares are declared once here."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kcops.cli.common import FiniteFloat, echo_json, handle_errors

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

F = TypeVar("F", bound=Callable[..., object])
TOPN = (16, 32, 64)


# -- option values ---------------------------------------------------------------------
def _items(raw: str) -> list[str]:
    return [x.strip() for x in raw.split(",") if x.strip()]


def _model(_ctx: click.Context, _param: click.Parameter, name: str) -> str:
    if name not in ("tiny", "smollm2") and not (Path(name).expanduser() / "config.json").is_file():
        raise click.BadParameter(
            f"{name!r}: allowed 'tiny', 'smollm2' or a local Hugging Face model folder "
            "(with config.json)",
            param_hint="--model",
        )
    return name


def _ints(_ctx: click.Context, param: click.Parameter, raw: str) -> tuple[int, ...]:
    """``"16,32,64"`` -> (16, 32, 64); each a positive integer, duplicates dropped."""
    try:
        values = tuple(int(x) for x in _items(raw))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise click.BadParameter(
            f"{raw!r}: expected positive integers, e.g. 16,32,64", param_hint=param.opts[0]
        )
    return tuple(sorted(dict.fromkeys(values)))


def _fractions(lo_open: bool, example: str) -> Callable[..., tuple[float, ...]]:
    """``"0.9,0.95"`` -> (0.9, 0.95), each in (0, 1] (``lo_open``) or [0, 1]."""

    def parse(_ctx: click.Context, param: click.Parameter, raw: str) -> tuple[float, ...]:
        try:
            values = tuple(float(x) for x in _items(raw))
        except ValueError:
            values = ()
        if not values or not all(0.0 <= x <= 1.0 and (x or not lo_open) for x in values):
            span = "(0, 1]" if lo_open else "[0, 1]"
            raise click.BadParameter(
                f"{raw!r}: expected fractions in {span}, e.g. {example}", param_hint=param.opts[0]
            )
        return tuple(dict.fromkeys(values))

    return parse


def _keeps(ctx: click.Context, param: click.Parameter, raw: str | None) -> tuple[float, ...] | None:
    """``--keep``: fractions in (0, 1), or None when not given."""
    if raw is None:
        return None
    values = _fractions(True, "0.25,0.5,0.75")(ctx, param, raw)
    if max(values) >= 1.0:
        raise click.BadParameter(f"{raw!r}: keep ratios below 1, e.g. 0.25,0.5,0.75",
                                 param_hint="--keep")  # fmt: skip
    return values


def _choices(allowed: Callable[[], Sequence[str]]) -> Callable[..., tuple[str, ...]]:
    """A comma list of names from ``allowed()`` (imported late: the lab's modules import
    torch), duplicates dropped."""

    def parse(_ctx: click.Context, param: click.Parameter, raw: str) -> tuple[str, ...]:
        values = tuple(dict.fromkeys(_items(raw)))
        if not values or any(v not in allowed() for v in values):
            hint = param.opts[0]
            raise click.BadParameter(f"{raw!r}: allowed {', '.join(allowed())}", param_hint=hint)
        return values

    return parse


def _policies() -> Sequence[str]:
    from kcops.lab.sweep import POLICIES

    return POLICIES


def _sweep_policies() -> Sequence[str]:
    from kcops.lab.sweep import all_policies

    return all_policies()


def _rows(_ctx: click.Context, _param: click.Parameter, raw: str) -> str | int:
    """``last``, ``all`` or a positive int N."""
    raw = raw.strip()
    if raw in ("last", "all"):
        return raw
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    raise click.BadParameter(
        f"{raw!r}: allowed 'last', 'all' or a positive integer", param_hint="--rows"
    )


# -- the options every command takes -----------------------------------------------------
def lab_options(out: str, as_json: str, *, corpus: bool = True) -> Callable[[F], F]:
    """``--model``, ``--corpus`` (unless not ``corpus``), ``--threads``, ``--out`` and
    ``--json`` (their help: ``out``, ``as_json``), and the typed-error exit codes."""

    def apply(fn: F) -> F:
        options = [
            click.option("--model", "model_name", required=True, callback=_model,
                         help="tiny, smollm2 or a local HF folder."),
            click.option("--corpus", default="pydoc", show_default=True,
                         help="pydoc, stdlib, a file or a folder.") if corpus else None,
            click.option("--threads", type=click.IntRange(1, 256), default=None,
                         help="torch CPU threads."),
            click.option("--out", "out_dir", default=None, help=out),
            click.option("--json", "as_json", is_flag=True, help=as_json),
        ]  # fmt: skip
        fn = handle_errors(fn)
        for option in reversed(options):
            fn = option(fn) if option is not None else fn
        return fn

    return apply


def tolerance_option(help: str | None) -> Callable[[F], F]:
    return click.option(
        "--tolerance", type=FiniteFloat(0.0, 100.0), default=1.0, show_default=True, help=help
    )


def n_option(default: str) -> Callable[[F], F]:
    return click.option("--n", "ns", default=default, show_default=True, callback=_ints,
                        help="Budgets N.")  # fmt: skip


def policies_option(
    default: str, help: str, allowed: Callable[[], Sequence[str]] = _policies
) -> Callable[[F], F]:
    return click.option("--policies", default=default, show_default=True,
                        callback=_choices(allowed), help=help)  # fmt: skip


# -- what the commands share ---------------------------------------------------------------
def load_model(
    name: str, *, threads: int | None = None, attn: str | None = None, progress: bool = True
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The worker's loader with attention ``attn`` (default: the kernels' top-N) and
    ``threads`` torch CPU threads."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from kcops.kernels.topn import register
    from kcops.worker.models import load_model as load

    if threads is not None:
        torch.set_num_threads(threads)
    return load(name, progress=progress, attn_implementation=attn or register())


def check_context(model: PreTrainedModel, name: str, flag: str, want: int, margin: int) -> None:
    """Refuse ``want`` tokens (and ``margin`` more) past the model's context."""
    from kcops.lab.sweep import SweepError
    from kcops.worker.models import context_tokens

    limit = context_tokens(model)
    if want + margin > limit:
        raise SweepError(f"{flag} {want}: {name} allows at most {limit - margin}")


def corpus_seqs(
    tok: PreTrainedTokenizerBase, corpus: str, sequences: int, context: int
) -> torch.Tensor:
    """``sequences`` chunks of ``context`` corpus tokens (the ``kc kpred``/``verify`` cut)."""
    from kcops.lab.sweep import chunks, corpus_text

    ids = tok(corpus_text(corpus, 8 * sequences * context), add_special_tokens=False).input_ids
    return chunks(ids, sequences, context - 1)


def save(out_dir: str | None, name: str, doc: object) -> None:
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / name).write_text(json.dumps(doc), encoding="utf-8")


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


# -- kc measure ------------------------------------------------------------------------------
def measure(
    model: PreTrainedModel, input_ids: torch.Tensor, *, p_values: tuple[float, ...],
    rows: str | int, model_name: str,
) -> dict[str, Any]:  # fmt: skip
    """One forward pass with the probe recording every chosen row; returns the ``--json``
    document (see docs/probe.md)."""
    import torch

    import kcops.kernels as kernels

    kernels.uninstall()
    probe = kernels.install(
        kernels.ProbeConfig(
            sample_rate=1.0, rows=rows, p_values=p_values, topn=TOPN, record=True,
            publish=False, nvtx=False, integrations=("transformers",), max_batch_rows=1,
        )
    )  # fmt: skip
    try:
        with torch.no_grad():
            model(input_ids)
        records = list(probe.records)
    finally:
        kernels.uninstall()
    layers: dict[int, list[dict[str, object]]] = {}
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
        for p in doc["p"] if rows else ():
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
@click.option("--model", "model_name", required=True, callback=_model,
              help="tiny, smollm2 or a local HF folder.")  # fmt: skip
@click.option("--text", "text_file", required=True, help="UTF-8 text file to measure on.")
@click.option("--p", "p_values", default="0.9", show_default=True, help="Mass levels, e.g. "
              "0.9,0.95.", callback=_fractions(True, "0.9,0.95"))  # fmt: skip
@click.option("--rows", default="all", show_default=True, callback=_rows, help="last, all or N.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="Truncate the text to this many tokens (and to the model's "
              "context).")  # fmt: skip
@click.option("--out", "out_dir", default=None, help="Folder for measure.json and attention.npz "
              "(heatmaps and K_p per layer for kc report).")  # fmt: skip
@click.option("--map-rows", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Sampled queries whose attention maps --out keeps.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document (docs/probe.md).")
@handle_errors
def measure_cmd(
    model_name: str, text_file: str, p_values: tuple[float, ...], rows: str | int,
    max_tokens: int, out_dir: str | None, map_rows: int, as_json: bool,
) -> None:  # fmt: skip
    """Per layer K_p (median/p90 over query rows, union and per head), kappa and top-N mass."""
    text = read_text(text_file)
    model, tok = load_model(model_name, attn="sdpa")
    limit = min(max_tokens, int(getattr(model.config, "max_position_embeddings", max_tokens)))
    ids = tok(text, return_tensors="pt", truncation=True, max_length=limit)["input_ids"]
    if ids.shape[-1] < 1:
        raise click.BadParameter(f"{text_file!r}: no tokens", param_hint="--text")
    doc = measure(model, ids, p_values=p_values, rows=rows, model_name=model_name)
    if out_dir is not None:
        from kcops.lab import maps

        save(out_dir, "measure.json", doc)
        maps.capture(model, ids, rows=map_rows, p=p_values[0]).save(Path(out_dir))
    click.echo(json.dumps(doc) if as_json else "\n".join(summary_lines(doc)))


# -- kc sweep ------------------------------------------------------------------------------
@click.command("sweep")
@lab_options("Folder for rows (resumable) and tables.",
             "Print rows and recommendation as JSON.")  # fmt: skip
@n_option("16,32,64,128,256,512")
@click.option("--context", "contexts", default="1024", show_default=True, callback=_ints,
              help="Context lengths.")  # fmt: skip
@click.option("--keep", "keeps", default=None, callback=_keeps,
              help="Keep ratios instead of --n, e.g. 0.25,0.5,0.75: N = ratio x the "
              "prefilled tokens (context - eval tokens) of each context.")  # fmt: skip
@policies_option("uniform,per_layer,dense_first,window", "Budget policies to compare: kcops' "
                 "own and NVIDIA kvpress's presses as kvpress:NAME (prefill only) or "
                 "kvpress:NAME+decode (cut at every step); kvpress:kc is K(C)'s per-layer "
                 "N through kvpress (docs/kc.md).", _sweep_policies)  # fmt: skip
@click.option("--sequences", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option("--eval-tokens", type=click.IntRange(1, 4096), default=32, show_default=True)
@tolerance_option("Accuracy points below full attention still acceptable.")
def sweep_cmd(
    model_name: str, corpus: str, threads: int | None, out_dir: str | None, as_json: bool,
    ns: tuple[int, ...], keeps: tuple[float, ...] | None, contexts: tuple[int, ...],
    policies: tuple[str, ...], sequences: int, eval_tokens: int, tolerance: float,
) -> None:  # fmt: skip
    """Accuracy, agreement, perplexity, speed and KV bytes per budget N, against full attention.

    With kvpress policies, kvpress runs in its own venv (`make venv-kvpress`) on the same
    sequences and positions; this process scores both sides."""
    if eval_tokens >= min(contexts):
        raise click.BadParameter(
            f"{eval_tokens} must be below the smallest context {min(contexts)}",
            param_hint="--eval-tokens",
        )
    from kcops.lab.sweeprun import run_sweep

    model, tok = load_model(model_name, threads=threads)
    check_context(model, model_name, "--context", max(contexts), 0)
    doc = run_sweep(
        model_name=model_name, corpus=corpus, ns=ns, contexts=contexts, policies=policies,
        sequences=sequences, eval_tokens=eval_tokens, tolerance=tolerance,
        out=Path(out_dir) if out_dir else None, model=model, tok=tok, keeps=keeps or (),
    )  # fmt: skip
    click.echo(json.dumps(doc) if as_json else doc["markdown"])


# -- kc retrieve ---------------------------------------------------------------------------
@click.command("retrieve")
@lab_options("Folder for rows (resumable) and tables.",
             "Print cells and comparison as JSON.", corpus=False)  # fmt: skip
@click.option("--task", type=click.Choice(["passkey", "code"]), default="passkey",
              show_default=True)  # fmt: skip
@click.option("--lengths", default="512,1024,2048", show_default=True, callback=_ints,
              help="Tokens.")  # fmt: skip
@click.option("--depths", default="0.1,0.5,0.9", show_default=True,
              callback=_fractions(False, "0.1,0.5,0.9"))  # fmt: skip
@click.option("--items", type=click.IntRange(1, 100_000), default=8, show_default=True)
@n_option("32,64,128,256")
@policies_option("uniform,dense_first,window", "Budget policies (those of kc sweep, "
                 "kvpress's included).", _sweep_policies)  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--min-full", type=FiniteFloat(0.0, 1.0), default=0.5, show_default=True,
              help="Full attention's accuracy for a cell to count as one it succeeds "
              "in.")  # fmt: skip
@tolerance_option("Points of loss allowed: a budget holds when Δ − 2 SE ≥ −tolerance.")
def retrieve_cmd(
    model_name: str, threads: int | None, out_dir: str | None, as_json: bool, task: str,
    lengths: tuple[int, ...], depths: tuple[float, ...], items: int, ns: tuple[int, ...],
    policies: tuple[str, ...], seed: int, min_full: float, tolerance: float,
) -> None:  # fmt: skip
    """Accuracy of retrieving a key hidden deep in the context, full attention against budgets."""
    from kcops.lab.retrieverun import run_retrieve

    model, tok = load_model(model_name, threads=threads)
    check_context(model, model_name, "--lengths", max(lengths), 8)
    doc = run_retrieve(
        model_name=model_name, task=task, lengths=lengths, depths=depths, items=items, ns=ns,
        policies=policies, seed=seed, min_full=min_full, tolerance=tolerance,
        out=Path(out_dir) if out_dir else None, model=model, tok=tok,
    )  # fmt: skip
    markdown = doc.pop("markdown")
    click.echo(json.dumps(doc) if as_json else markdown)


# -- kc kpred ------------------------------------------------------------------------------
def _kpred_variants() -> Sequence[str]:
    from kcops.lab.kpred import VARIANTS

    return VARIANTS


@click.command("kpred")
@lab_options("Folder to write kpred.json into.", "Print summary and rows as JSON.")
@click.option("--context", type=click.IntRange(2, 1 << 20), default=1024, show_default=True)
@click.option("--positions", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="Query positions per sequence (second half, evenly spaced).")  # fmt: skip
@click.option("--sequences", type=click.IntRange(1, 256), default=2, show_default=True)
@click.option("--variants", default="recency,top", show_default=True,
              callback=_choices(_kpred_variants))  # fmt: skip
def kpred_cmd(
    model_name: str, corpus: str, threads: int | None, out_dir: str | None, as_json: bool,
    context: int, positions: int, sequences: int, variants: tuple[str, ...],
) -> None:  # fmt: skip
    """K_pred: the least recent / top-attended context that keeps the greedy token."""
    from tqdm import tqdm

    from kcops.lab import kpred

    model, tok = load_model(model_name, threads=threads, progress=not as_json)
    seqs = corpus_seqs(tok, corpus, sequences, context)
    total = sequences * len(kpred.positions(context, positions)) * len(variants)
    with tqdm(total=total, desc="kc kpred", unit="token") as bar:
        rows = kpred.measure(
            model, seqs, count=positions, variants=variants, tick=lambda: bar.update(1)
        )
    doc = kpred.summary(rows)
    save(out_dir, "kpred.json", doc)
    if as_json:
        click.echo(json.dumps(doc))
        return
    click.echo(f"K_pred on {model_name}, {corpus}, context {context}, {len(rows)} rows")
    for v, s in doc["summary"].items():
        click.echo(
            f"  {v:8} median {s['k_pred_median']:>6} p90 {s['k_pred_p90']:>6} "
            f"median ratio {s['ratio_median']:.3f}  share needing < 10% of context "
            f"{s['share_below_10pct']:.2f}"
        )


# -- kc verify -----------------------------------------------------------------------------
@click.command("verify")
@lab_options("Folder to write verify.json into.", "Print the results as JSON.")
@click.option("--context", type=click.IntRange(2, 1 << 16), default=256, show_default=True)
@click.option("--sequences", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--variants", "var_raw", show_default=True,
              default="full,topn:32,topn:128,window:64:4,performer:64,performer:256",
              help="full, topn:N, window:W:G, performer:M.")  # fmt: skip
def verify_cmd(
    model_name: str, corpus: str, threads: int | None, out_dir: str | None, as_json: bool,
    context: int, sequences: int, var_raw: str,
) -> None:  # fmt: skip
    """Relative error, KL and greedy agreement of approximations vs full attention; pass/fail."""
    from tqdm import tqdm

    from kcops.lab import verify as ver
    from kcops.lab.sweep import SweepError

    try:
        variants = [ver.parse_variant(v) for v in _items(var_raw)]
    except SweepError as exc:
        raise click.BadParameter(str(exc), param_hint="--variants") from None
    model, tok = load_model(model_name, threads=threads, attn=ver.register(), progress=not as_json)
    seqs = corpus_seqs(tok, corpus, sequences, context)
    with tqdm(total=len(variants), desc="kc verify", unit="variant") as bar:
        results = ver.verify(model, seqs, variants, tick=lambda: bar.update(1))
    doc = {"thresholds": ver.THRESHOLDS, "results": results}
    save(out_dir, "verify.json", doc)
    if as_json:
        click.echo(json.dumps(doc))
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


# -- kc claim, kc report: read --out folders, no model -------------------------------------
@click.command("claim")
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False))
@tolerance_option("Accuracy points below full attention still counted as kept.")
@click.option("--saving", type=FiniteFloat(0.01, 0.99), default=0.30, show_default=True,
              help="KV bytes saved that the claim promises (the documents say "
              "30–50%).")  # fmt: skip
@click.option("--pool", "pooled", is_flag=True,
              help="The FOLDERS are parts of one sweep run in batches of sequences (disjoint "
              "text, the same model and --eval-tokens; at 8k one batch of 8 fills 17-19 GB): "
              "pool them into one verdict per context.")  # fmt: skip
@click.option("--by-method", "by_method", is_flag=True,
              help="One line per method (policy) and context instead: its largest saving "
              "within the tolerance with confidence, Δ ± 2 SE there, its own verdict, and "
              "which method wins.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@handle_errors
def claim_cmd(
    folders: tuple[str, ...], tolerance: float, saving: float, pooled: bool, by_method: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Decide the K(C) claim on sweep folders: per corpus and context, confirmed (a budget
    saving SAVING of the KV keeps accuracy within TOLERANCE points with confidence,
    Δ − 2 SE ≥ −TOLERANCE), refuted (every such budget loses more, Δ + 2 SE < −TOLERANCE)
    or undecided; beside it the smallest KV kept within the tolerance, and the sweep's
    wall time and peak RSS."""
    from kcops.lab.sweepclaim import markdown, markdown_by_policy, methods, verdicts

    if by_method:
        best = methods([Path(f) for f in folders], tolerance, saving, pooled=pooled)
        if as_json:
            echo_json([b.as_json() for b in best])
        else:
            click.echo(markdown_by_policy(best, tolerance), nl=False)
        return
    items = verdicts([Path(f) for f in folders], tolerance, saving, pooled=pooled)
    if as_json:
        echo_json([v.as_json() for v in items])
    else:
        click.echo(markdown(items, tolerance, saving), nl=False)


@click.command("report")
@click.argument("folder")
@tolerance_option(None)
@click.option("--tensorboard", is_flag=True, help="Also write the pictures as TensorBoard "
              "event files under FOLDER/tensorboard.")  # fmt: skip
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
    from kcops.lab.report import render

    click.echo(str(render(Path(folder), tolerance, tensorboard=tensorboard)))
    if tensorboard:
        click.echo(str(Path(folder) / "tensorboard"))
