"""Drive ``kc sweep``: read the corpus, run every context on the model given, write the tables.

The model comes loaded, with :func:`kcops.kernels.topn.register`'s attention, from the
caller (``kc sweep`` loads it through :mod:`kcops.worker.models`): the kernels sit below
the worker and import none of it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcops.lab.sweep import Row, chunks, corpus_text, recommend, sweep_context
from kcops.lab.sweepcal import coverage, measure_rows
from kcops.lab.sweepio import (
    append_row,
    append_run,
    load_done,
    markdown,
    run_record,
    write_tables,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def run_sweep(
    *,
    model_name: str,
    corpus: str,
    ns: Sequence[int],
    contexts: Sequence[int],
    policies: Sequence[str],
    sequences: int,
    eval_tokens: int,
    tolerance: float,
    out: Path | None,
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    progress: bool = True,
) -> dict[str, Any]:
    """The ``--json`` document: ``rows`` (full attention's included), ``recommendation``,
    ``markdown``. ``model_name`` names the model in the resumable rows' settings."""
    from tqdm import tqdm

    settings = {
        "model": model_name,
        "corpus": corpus,
        "sequences": sequences,
        "eval_tokens": eval_tokens,
    }
    done = load_done(out, settings) if out is not None else {}
    need_chars = 8 * sequences * (max(contexts) + 1)  # > 4 chars a token, with margin
    ids = tok(corpus_text(corpus, need_chars), add_special_tokens=False).input_ids
    total = len(contexts) * (1 + len(ns) * len(policies))
    rows: list[Row] = []
    kc_rows: dict[int, dict[int, dict[float, list[int]]]] = {}  # the prefills' K_p rows
    began = time.monotonic()
    with tqdm(total=total, desc="kc sweep", unit="row", disable=not progress) as bar:

        def tick() -> None:
            bar.update(1)

        def on_row(row: Row) -> None:
            if out is not None:
                append_row(out, row)
            bar.set_postfix_str(f"C={row.context} {row.policy} N={row.n}")

        for context in contexts:
            rows += sweep_context(
                model,
                chunks(ids, sequences, context),
                ns=ns,
                policies=policies,
                eval_tokens=eval_tokens,
                done=done,
                on_row=on_row,
                tick=tick,
                kc_rows=kc_rows,
            )
    rec = recommend(rows, tolerance)
    for item in rec:  # the K(C) coverage of each recommended N: the agent's calibration
        n = item.get("n")
        if n is not None:
            kc = kc_rows.get(item["context"]) or measure_rows(
                model, chunks(ids, sequences, item["context"]), eval_tokens
            )
            item["kc_coverage"] = coverage(kc, n, item.get("policy"))
    run = run_record(began, measured=sum(1 for r in rows if r.key not in done))
    if out is not None:
        write_tables(out, rows, rec, tolerance)
        append_run(out, run)
    return {
        "run": run,
        "rows": [r.as_json() for r in rows],
        "recommendation": rec,
        "markdown": markdown(rows, rec, tolerance),
    }
