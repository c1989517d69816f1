"""K_pred on the tiny model: the grid search equals a brute-force search over every k."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from kcops.cli.kc import kc_group
from kcops.kernels.topn import register
from kcops.lab.kpred import KpredRow, grid, kpred_recency, kpred_top, summary
from kcops.lab.sweep import corpus_text
from kcops.worker.models import load_model


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any, list[int]]:
    torch.set_num_threads(1)
    model, tok = load_model("tiny", progress=False, attn_implementation=register())
    ids = tok(corpus_text("pydoc", 5_000), add_special_tokens=False).input_ids[:80]
    return model, tok, ids


def test_grid_is_increasing_and_ends_with_the_context() -> None:
    assert grid(10) == [1, 2, 3, 4, 6, 8, 10]
    assert grid(1) == [1]


@pytest.mark.slow
def test_recency_equals_brute_force_over_every_k(tiny: Any) -> None:
    _, _, ids = tiny
    eager, _ = load_model("tiny", progress=False, attn_implementation="eager")
    for t in (30, 55, 79):
        seq = torch.tensor([ids[: t + 1]])
        keeps: dict[int, bool] = {}
        with torch.inference_mode():
            want = int(eager(input_ids=seq).logits[0, -1].argmax())
            for k in range(1, t + 2):
                mask = torch.zeros(1, t + 1, dtype=torch.long)
                mask[0, t + 1 - k :] = 1  # older tokens masked, positions kept
                got = int(eager(input_ids=seq, attention_mask=mask).logits[0, -1].argmax())
                keeps[k] = got == want
        brute = min(k for k in grid(t + 1) if keeps[k])
        k_pred, token = kpred_recency(tiny[0], ids[: t + 1])
        assert (k_pred, token) == (brute, want)


def test_top_variant_keeps_the_prediction(tiny: Any) -> None:
    model, _, ids = tiny
    k, token = kpred_top(model, ids[:60])
    with torch.inference_mode():
        full = int(model(input_ids=torch.tensor([ids[:60]])).logits[0, -1].argmax())
    assert token == full and 1 <= k <= 60 and k in grid(60)
    rows = [KpredRow("top", 0, 59, 60, k), KpredRow("top", 0, 40, 41, 2)]
    doc = summary(rows)
    assert doc["summary"]["top"]["share_below_10pct"] == pytest.approx(0.5 * (k < 6) + 0.5)


@pytest.mark.slow
def test_cli_kpred_json() -> None:
    args = [
        "kpred", "--model", "tiny", "--context", "64", "--positions", "2",
        "--sequences", "1", "--threads", "1", "--json",
    ]  # fmt: skip
    res = CliRunner().invoke(kc_group, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(doc["summary"]) == {"recency", "top"}
    assert len(doc["rows"]) == 4
