"""``kc sweep`` on the tiny model: agreement equals an independent masked computation,
a budget covering the context is full attention, the CLI's JSON rows, resume."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from kcops.cli.kc import kc_group
from kcops.kernels.kvkeep import split_budget
from kcops.kernels.sweep import FULL, chunks, corpus_text, sweep_context
from kcops.kernels.topn import register
from kcops.worker.models import load_model

CONTEXT, EVAL, SEQS = 256, 16, 2


@pytest.fixture(scope="module")
def tiny() -> Iterator[tuple[Any, Any, torch.Tensor]]:
    torch.set_num_threads(1)
    model, tok = load_model("tiny", progress=False, attn_implementation=register())
    ids = tok(corpus_text("pydoc", 40_000), add_special_tokens=False).input_ids
    yield model, tok, chunks(ids, SEQS, CONTEXT)


def _rows(model: Any, seqs: torch.Tensor, ns: list[int], policies: list[str]) -> list[Any]:
    return sweep_context(
        model, seqs, ns=ns, policies=policies, eval_tokens=EVAL, done={}, on_row=lambda r: None
    )


def _window_mask(length: int, start: int, n: int) -> torch.Tensor:
    """Causal; rows from ``start`` on see only the sinks and the last n - sinks keys."""
    sinks, _ = split_budget(n)
    t = torch.arange(length)[:, None]
    k = torch.arange(length)[None, :]
    allowed = k <= t
    windowed = (k < sinks) | (k >= t - (n - sinks))
    allowed &= (t < start) | windowed
    return torch.zeros(length, length).masked_fill(~allowed, torch.finfo(torch.float32).min)


@pytest.mark.slow
def test_window_agreement_equals_eager_attention_masked_by_hand(tiny: Any) -> None:
    _, _, seqs = tiny
    model_e, _ = load_model("tiny", progress=False, attn_implementation="eager")
    n = 16
    start = CONTEXT - EVAL
    inputs = seqs[:, :CONTEXT]
    with torch.inference_mode():
        full = model_e(input_ids=inputs).logits[:, start:].argmax(-1)
        mask = _window_mask(CONTEXT, start, n)[None, None].expand(SEQS, 1, -1, -1)
        kept = model_e(input_ids=inputs, attention_mask=mask).logits[:, start:].argmax(-1)
    want = float((kept == full).float().mean())
    rows = _rows(tiny[0], seqs, [n], ["window"])
    assert rows[1].policy == "window" and rows[1].n == n
    assert rows[1].agreement == pytest.approx(want, abs=1e-9)
    target = seqs[:, start + 1 :]
    assert rows[1].accuracy == pytest.approx(float((kept == target).float().mean()), abs=1e-9)
    assert rows[0].accuracy == pytest.approx(float((full == target).float().mean()), abs=1e-9)


@pytest.mark.slow
def test_budget_covering_the_context_is_exactly_full_attention(tiny: Any) -> None:
    rows = _rows(tiny[0], tiny[2], [8, CONTEXT], ["uniform", "per_layer"])
    full = rows[0]
    assert full.policy == FULL
    for row in rows[1:]:
        if row.n == CONTEXT:
            assert (row.accuracy, row.agreement, row.perplexity, row.kv_bytes) == (
                full.accuracy,
                1.0,
                full.perplexity,
                full.kv_bytes,
            )
        else:
            assert row.kv_bytes < full.kv_bytes / 10


@pytest.mark.slow
def test_cli_json_rows_and_resume(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args = [
        "sweep", "--model", "tiny", "--n", "32", "--context", "1024", "--policies", "uniform",
        "--sequences", "1", "--eval-tokens", "4", "--threads", "1", "--out", str(out), "--json",
    ]  # fmt: skip
    res = CliRunner().invoke(kc_group, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    rows = doc["rows"]
    full = next(r for r in rows if r["policy"] == "full")
    row = next(r for r in rows if r["policy"] == "uniform")
    for key in ("n", "context", "accuracy", "agreement", "kv_bytes", "tokens_per_s"):
        assert key in row and key in full
    assert row["n"] == 32 and row["context"] == 1024 and full["n"] is None
    assert row["kv_bytes"] <= full["kv_bytes"] / 4
    assert (out / "table.md").exists() and (out / "table.csv").exists()
    lines = (out / "rows.jsonl").read_text().splitlines()
    again = CliRunner().invoke(kc_group, args)
    assert again.exit_code == 0, again.output
    assert (out / "rows.jsonl").read_text().splitlines() == lines  # nothing re-measured
    bad = CliRunner().invoke(kc_group, [*args[:-1], "--sequences", "2"])
    assert bad.exit_code == 2 and "other settings" in bad.output
    page = CliRunner().invoke(kc_group, ["report", str(out)])
    assert page.exit_code == 0, page.output
    text = (out / "report.html").read_text()
    assert "Budget sweep" in text and "data:image/png;base64," in text
    assert (out / "sweep_1024.png").stat().st_size > 1000
    empty = CliRunner().invoke(kc_group, ["report", str(tmp_path)])
    assert empty.exit_code == 2 and "no rows.jsonl" in empty.output


def test_batched_groups_equal_each_row_decoded_alone(tiny: Any) -> None:
    from kcops.kernels.sweep import budgets, decode, decode_groups, prefill

    model, _, seqs = tiny
    pre = prefill(model, seqs, EVAL)
    layers = len(pre.kv)
    plans = [
        ([None] * layers, True),
        (budgets("uniform", 8, layers, CONTEXT, pre.kp), True),
        (budgets("dense_first", 32, layers, CONTEXT, pre.kp), True),
        (budgets("window", 16, layers, CONTEXT, pre.kp), False),
    ]
    together = decode_groups(model, pre, plans)
    for (per, heavy), got in zip(plans, together, strict=True):
        alone = decode(model, pre, per, heavy)
        torch.testing.assert_close(got["logits"], alone["logits"], rtol=1e-4, atol=1e-4)
        assert torch.equal(got["logits"].argmax(-1), alone["logits"].argmax(-1))
        assert (got["kv_bytes"], got["keys_attended"]) == (
            alone["kv_bytes"],
            alone["keys_attended"],
        )
    assert together[1]["kv_bytes"] < together[0]["kv_bytes"] / 10
