"""kvpress as ``kc sweep`` policies, for real: kvpress 0.5.5 in its own venv (``make
venv-kvpress``) on the tiny model, one cell, two presses beside kcops' own policy.

The two sides must score the same sequences at the same positions: the kvpress side's
hash of what it ran equals the hash of the sweep's own chunks, its own full attention
agrees with the sweep's, and a side that ran other text stops the sweep."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kcops.kernels.topn import register
from kcops.lab import presses
from kcops.lab.kvpress_side import fingerprint
from kcops.lab.sweep import FULL, SweepError, chunks, corpus_text, sweep_context
from kcops.lab.sweepclaim import by_policy
from kcops.worker.models import load_model

pytestmark = pytest.mark.slow
CONTEXT, EVAL, SEQS, N = 256, 16, 2, 120
POLICIES = ["uniform", "kvpress:snapkv", "kvpress:streamingllm+decode"]


@pytest.fixture(scope="module")
def tiny() -> Iterator[tuple[Any, torch.Tensor]]:
    presses.venv()  # the venv make test builds; missing, this says how to get it
    model, tok = load_model("tiny", progress=False, attn_implementation=register())
    ids = tok(corpus_text("pydoc", 40_000), add_special_tokens=False).input_ids
    yield model, chunks(ids, SEQS, CONTEXT)


def test_kvpress_rows_score_the_sweeps_own_sequences(tiny: Any) -> None:
    model, seqs = tiny
    rows = sweep_context(model, seqs, ns=[N], policies=POLICIES, eval_tokens=EVAL, done={},
                         on_row=lambda r: None)  # fmt: skip
    by = {r.policy: r for r in rows}
    assert set(by) == {FULL, *POLICIES}
    full = by[FULL]
    for name in POLICIES[1:]:
        row = by[name]
        assert row.kvpress is not None and row.kvpress["sha"] == fingerprint(seqs)
        assert row.kvpress["versions"]["kvpress"] == "0.5.5"  # type: ignore[index]
        # the kvpress side's own full attention (transformers 5.2, sdpa) is this sweep's
        assert row.kvpress["full_agreement"] == 1.0
        assert row.positions == full.positions == SEQS * EVAL
        assert 0.0 <= row.agreement <= 1.0 and row.kv_bytes < full.kv_bytes
    # prefill only: N kept, then the cache grows by the fed tokens; +decode: back to N
    start = CONTEXT - EVAL
    assert by["kvpress:snapkv"].budgets == [N] * 2
    assert by["kvpress:snapkv"].keys_attended == pytest.approx(N + (EVAL + 1) / 2)
    assert by["kvpress:streamingllm+decode"].keys_attended <= N + 1
    assert by["kvpress:snapkv"].kv_bytes > by["uniform"].kv_bytes * (N + EVAL - 1) / (N + 1)
    table = by_policy(rows, tolerance=100.0)
    assert {t.policy for t in table} == set(POLICIES)
    assert all(t.saving is not None and 0 < t.saving < 1 - N / start + 0.1 for t in table)


def test_a_side_that_ran_other_sequences_stops_the_sweep(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, seqs = tiny
    # the lab hashes one text, the side runs (and hashes) the sequences it was sent
    monkeypatch.setattr(presses, "fingerprint", lambda s: fingerprint(s.flip(1)))
    with pytest.raises(SweepError, match="different text"):
        sweep_context(model, seqs, ns=[N], policies=POLICIES[1:2], eval_tokens=EVAL, done={},
                      on_row=lambda r: None)  # fmt: skip


def test_without_the_venv_a_press_policy_says_how_to_get_it(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, seqs = tiny
    monkeypatch.setenv(presses.VENV_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(SweepError, match="make venv-kvpress"):
        sweep_context(model, seqs, ns=[N], policies=POLICIES[1:2], eval_tokens=EVAL, done={},
                      on_row=lambda r: None)  # fmt: skip


def test_retrieve_scores_a_press_on_the_same_items() -> None:
    from click.testing import CliRunner

    from kcops.cli.kc import kc_group

    args = ["retrieve", "--model", "tiny", "--lengths", "256", "--depths", "0.5", "--items",
            "2", "--n", "128", "--policies", "uniform,kvpress:snapkv", "--min-full", "0",
            "--json"]  # fmt: skip
    res = CliRunner().invoke(kc_group, args)
    assert res.exit_code == 0, res.output
    pooled = {e["policy"]: e for e in json.loads(res.stdout.strip().splitlines()[-1])["pooled"]}
    assert pooled["kvpress:snapkv"]["items"] == pooled["uniform"]["items"] == 2
    # 128 of 256 prompt keys, then the answer's tokens: about half of full's KV
    assert 0.45 < pooled["kvpress:snapkv"]["kv_ratio"] < 0.55
