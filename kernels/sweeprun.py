"""Drive ``kc sweep``: load the model and corpus, run every context, write the tables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kcops.kernels.sweep import Row, SweepError, chunks, corpus_text, recommend, sweep_context
from kcops.kernels.sweepio import append_row, load_done, markdown, write_tables
from kcops.kernels.topn import register


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
    threads: int | None = None,
    model: Any = None,
    tok: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """The ``--json`` document: ``rows`` (full attention's included), ``recommendation``,
    ``markdown``. ``model``/``tok`` may be passed in (tests)."""
    from tqdm import tqdm

    if threads is not None:
        torch.set_num_threads(threads)
    if model is None:
        from kcops.worker.models import context_tokens, load_model

        model, tok = load_model(model_name, progress=progress, attn_implementation=register())
        limit = context_tokens(model)
        if max(contexts) > limit:
            raise SweepError(f"--context {max(contexts)}: {model_name} allows at most {limit}")
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
            )
    rec = recommend(rows, tolerance)
    if out is not None:
        write_tables(out, rows, rec, tolerance)
    return {
        "rows": [r.as_json() for r in rows],
        "recommendation": rec,
        "markdown": markdown(rows, rec, tolerance),
    }
