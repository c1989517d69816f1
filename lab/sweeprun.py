"""Drive ``kc sweep``: read the corpus, run every context on the model given, write the tables.

The model comes loaded, with :func:`kcops.kernels.topn.register`'s attention, from the
caller (``kc sweep`` loads it through :mod:`kcops.worker.models`): the kernels sit below
the worker and import none of it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kcops.lab import sweepio
from kcops.lab.sweep import Row, chunks, corpus_text, recommend, sweep_context
from kcops.lab.sweepcal import coverage, measure_rows

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def run_sweep(
    *, model_name: str, corpus: str, ns: Sequence[int], contexts: Sequence[int],
    policies: Sequence[str], sequences: int, eval_tokens: int, tolerance: float,
    out: Path | None, model: PreTrainedModel, tok: PreTrainedTokenizerBase, progress: bool = True,
    keeps: Sequence[float] = (),
) -> dict[str, object]:  # fmt: skip
    """The ``--json`` document: ``rows`` (full attention's included), ``recommendation``,
    ``markdown``. ``model_name`` names the model in the resumable rows' settings.
    ``keeps``, when given, replace ``ns``: per context, N = keep x its prefilled tokens."""
    from tqdm import tqdm

    settings: dict[str, object] = {"model": model_name, "corpus": corpus,
                                   "sequences": sequences, "eval_tokens": eval_tokens}  # fmt: skip

    def ns_at(context: int) -> Sequence[int]:
        return sorted({max(1, round(k * (context - eval_tokens))) for k in keeps}) or ns

    done = sweepio.load_done(out, settings) if out is not None else {}
    need_chars = 8 * sequences * (max(contexts) + 1)  # > 4 chars a token, with margin
    ids = tok(corpus_text(corpus, need_chars), add_special_tokens=False).input_ids
    total = sum(1 + len(ns_at(c)) * len(policies) for c in contexts)
    rows: list[Row] = []
    kc_rows: dict[int, dict[int, dict[float, list[int]]]] = {}  # the prefills' K_p rows
    began = time.monotonic()
    with tqdm(total=total, desc="kc sweep", unit="row", disable=not progress) as bar:

        def on_row(row: Row) -> None:
            if out is not None:
                sweepio.append_json(out / sweepio.ROWS_FILE, row.as_json())
            bar.set_postfix_str(f"C={row.context} {row.policy} N={row.n}")

        for context in contexts:
            rows += sweep_context(
                model, chunks(ids, sequences, context), ns=ns_at(context), policies=policies,
                eval_tokens=eval_tokens, done=done, on_row=on_row, tick=lambda: bar.update(1),
                kc_rows=kc_rows,
            )  # fmt: skip
    rec = recommend(rows, tolerance)
    for item in rec:  # the K(C) coverage of each recommended N: the agent's calibration
        n = item.get("n")
        if n is not None:
            kc = kc_rows.get(item["context"]) or measure_rows(
                model, chunks(ids, sequences, item["context"]), eval_tokens
            )
            item["kc_coverage"] = coverage(kc, n, item.get("policy"))
    run = sweepio.run_record(began, measured=sum(1 for r in rows if r.key not in done))
    if out is not None:
        sweepio.write_tables(out, rows, rec, tolerance)
        sweepio.append_json(out / sweepio.RUNS_FILE, run)  # a line per invocation
    return {
        "run": run,
        "rows": [r.as_json() for r in rows],
        "recommendation": rec,
        "markdown": sweepio.markdown(rows, rec, tolerance),
    }
