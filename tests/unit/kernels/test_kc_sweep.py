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
from kcops.kernels.topn import register
from kcops.lab.sweep import FULL, chunks, corpus_text, sweep_context
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
    from kcops.lab.sweep import budgets, decode, decode_groups, prefill

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


def test_per_layer_budgets_keep_the_uniform_total_with_no_layer_above_the_context() -> None:
    from kcops.lab.sweep import budgets, share_budget

    # K_0.9 of 8, 1, 1 at N = 4, C = 6: layer 0's share (9.6) is capped at the context
    # (it keeps everything) and the other two get what it cannot use.
    assert share_budget(12, [8.0, 1.0, 1.0], 6) == [6, 3, 3]
    assert budgets("per_layer", 4, 3, 6, {0: 8.0, 1: 1.0, 2: 1.0}) == [None, 3, 3]
    # no cap reached: proportional, the rounding keeps the total
    assert share_budget(30, [3.0, 2.0, 1.0], 100) == [15, 10, 5]
    kp = [459.0, 200.0, 39.0, 120.0, 7.0]
    got = share_budget(64 * 5, kp, 1024)
    assert sum(got) == 64 * 5
    assert all(abs(g - 320 * w / sum(kp)) < 1 for g, w in zip(got, kp, strict=True))
    assert share_budget(99, [5.0, 1.0], 10) == [10, 10]  # more than the layers can hold
    assert share_budget(2, [1000.0, 1.0], 10) == [1, 1]  # every layer keeps a key


def test_layer_kp_is_the_union_over_each_kv_group() -> None:
    from kcops.kernels.kc import kc_rows
    from kcops.kernels.kvkeep import OBS_WINDOW, capture_scores, record_scores

    torch.manual_seed(3)
    b, hq, hkv, t, d = 2, 6, 2, 80, 8
    q, k = torch.randn(b, hq, t, d) * 2, torch.randn(b, hkv, t, d)
    with capture_scores(with_kp=True) as cap:
        record_scores(0, q, k, None)
    ref = kc_rows(q, k, attention_mask=None, scaling=None, rows="all", p_values=(0.9,), topn=())
    groups = ref.k_groups[0.9][:, -OBS_WINDOW:]  # (B, window rows, Hkv): union per group
    assert cap.kp[0] == float(groups.float().median())
    heads = ref.k_heads[0.9][:, -OBS_WINDOW:]
    assert cap.kp[0] > float(heads.float().median())  # the union holds more than one head


def _row(policy: str, n: int | None, accuracy: float, se: float, kv: int) -> Any:
    from kcops.lab.sweep import Row

    return Row(policy, n, 1024, accuracy, se, 1.0, 9.0, 0.1, 10.0, kv, 1.0, 128, [])


def test_paired_standard_error_and_a_recommendation_within_noise() -> None:
    import statistics

    from kcops.lab.sweep import paired_se, recommend
    from kcops.lab.sweepio import markdown

    target = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    full = torch.tensor([[1, 2, 3, 0, 5, 0, 7, 8]])
    pred = torch.tensor([[1, 0, 3, 4, 5, 0, 0, 8]])  # one gained, two lost
    d = [0, -1, 0, 1, 0, 0, -1, 0]
    assert paired_se(pred, full, target) == pytest.approx(statistics.stdev(d) / 8**0.5)
    assert paired_se(full, full, target) == 0.0
    rows = [
        _row(FULL, None, 0.50, 0.0, 1000),
        _row("uniform", 64, 0.495, 0.010, 63),  # -0.5 ± 1.0 pts: could be -2.5
        _row("uniform", 256, 0.50, 0.002, 250),  # 0.0 ± 0.2 pts
    ]
    # N=64's Δ is within 1 point but not with confidence; N=256's is: it is the one
    (rec,) = recommend(rows, 1.0)
    assert (rec["n"], rec["within_noise"]) == (256, False)
    # with no confident row, the point estimate's choice, marked within noise
    (rec,) = recommend(rows[:2], 1.0)
    assert (rec["n"], rec["within_noise"]) == (64, True)
    assert rec["accuracy_delta_se_points"] == pytest.approx(1.0)
    table = markdown(rows, [rec], 1.0)
    assert "| uniform | 64 | 1024 | 0.495 | -0.5 ± 1.0 |" in table
    assert "**uniform N=64** — accuracy -0.5 ± 1.0 pts (paired SE)" in table
    assert "within noise" in table
    (rec,) = recommend([rows[0], rows[2]], 1.0)
    assert (rec["n"], rec["within_noise"]) == (256, False)


MEASURED = ("accuracy", "accuracy_delta_se", "agreement", "perplexity", "kv_bytes")


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_with_the_same_numbers(tiny: Any, tmp_path: Path) -> None:
    from kcops.lab.sweeprun import run_sweep

    model, tok, _ = tiny
    kw: dict[str, Any] = dict(
        model_name="tiny", corpus="pydoc", ns=[8, 16], contexts=[128], sequences=2,
        policies=["uniform", "window"], eval_tokens=6, tolerance=1.0, model=model, tok=tok,
        progress=False,
    )  # fmt: skip
    first = run_sweep(out=tmp_path / "a", **kw)["rows"]
    out = tmp_path / "b"
    run_sweep(out=out, **kw)
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 5  # header, full attention, 4 rows
    # killed while writing the third row: header, full, one row, half a line
    (out / "rows.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])
    again = run_sweep(out=out, **kw)["rows"]
    assert [[r[k] for k in MEASURED] for r in again] == [[r[k] for k in MEASURED] for r in first]
    kept = (out / "rows.jsonl").read_text().splitlines()
    assert kept[:3] == lines[:3] and kept[3] == lines[3][:40]  # nothing kept re-measured
    rows = [json.loads(line) for line in kept[4:]]
    assert [(r["policy"], r["n"]) for r in rows] == [("uniform", 16), ("window", 8), ("window", 16)]


@pytest.mark.slow
def test_heavy_hitter_step_equals_eager_attention_masked_per_layer_and_head(tiny: Any) -> None:
    """The first decode step over a cache cut by kvkeep (sinks, recent window, heavy
    hitters by the SnapKV scores, per layer and KV head) equals transformers' eager
    attention on the whole sequence with a per-layer, per-head mask kept by hand."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from kcops.kernels.topn import register_attention
    from kcops.lab.sweep import decode, prefill

    model, _, seqs = tiny
    pre = prefill(model, seqs, EVAL)
    start, n = pre.start, 24
    sinks, recent = split_budget(n)
    cfg = model.config
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    masks: dict[int, torch.Tensor] = {}
    for layer, score in pre.scores.items():  # (S, Hkv, start)
        allowed = torch.ones(SEQS, cfg.num_attention_heads, start + 1, start + 1).tril().bool()
        for s in range(SEQS):
            for h in range(cfg.num_key_value_heads):
                forced = set(range(sinks)) | set(range(start - recent, start))
                rest = sorted(set(range(start)) - forced, key=lambda j: -float(score[s, h, j]))
                keep = [*sorted(forced | set(rest[: n - len(forced)])), start]  # + its own
                row = torch.zeros(start + 1, dtype=torch.bool)
                row[keep] = True
                allowed[s, h * group : (h + 1) * group, start] = row
        masks[layer] = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo().min)

    def masked(module: Any, query: Any, key: Any, value: Any, mask: Any, **kw: Any) -> Any:
        return eager_attention_forward(module, query, key, value, masks[module.layer_idx], **kw)

    name = register_attention("kcops_test_hh_masked", masked)
    model_e, _ = load_model("tiny", progress=False, attn_implementation=name)
    with torch.inference_mode():
        want = model_e(input_ids=seqs[:, : start + 1]).logits[:, start].float()
    got = decode(model, pre, [n] * len(pre.kv), True, steps=1)["logits"][:, 0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_the_calibration_comes_from_the_shared_prefill_and_each_run_is_recorded(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recommended N's K(C) coverage is computed from the rows' own prefill (no second
    one), equal to a separate measurement; ``runs.jsonl`` holds each invocation's cost."""
    from kcops.lab import sweepcal
    from kcops.lab.sweeprun import run_sweep

    model, tok, _ = tiny
    kw: dict[str, Any] = dict(
        model_name="tiny", corpus="pydoc", ns=[8, 64], contexts=[128], sequences=2,
        policies=["uniform"], eval_tokens=6, tolerance=100.0, model=model, tok=tok,
        progress=False,
    )  # fmt: skip
    calls: list[int] = []
    real = sweepcal.measure_rows

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr("kcops.lab.sweeprun.measure_rows", counting)
    doc = run_sweep(out=tmp_path, **kw)
    (rec,) = doc["recommendation"]
    assert rec["n"] == 8 and calls == []  # tolerance 100: the smallest; no second prefill
    ids = tok(corpus_text("pydoc", 40_000), add_special_tokens=False).input_ids
    alone = sweepcal.coverage(real(model, chunks(ids, 2, 128), 6), 8, "uniform")
    assert rec["kc_coverage"] == alone
    run = json.loads((tmp_path / "runs.jsonl").read_text().splitlines()[-1])
    assert run["rows_measured"] == 3 and run["wall_s"] > 0 and run["peak_rss_bytes"] > 10**7
    assert doc["run"] == run


def test_the_error_by_sequence_counts_when_one_text_holds_the_losses() -> None:
    """Positions of one sequence share its text: when all the losses sit in one of them,
    the per-sequence error is larger than the per-position one, and the recommendation
    trusts the larger."""
    import statistics

    from kcops.lab.sweep import paired_se, paired_se_by_sequence, recommend

    target = torch.ones(4, 50, dtype=torch.long)
    full = target.clone()
    pred = target.clone()
    pred[0, :6] = 0  # six losses, all in sequence 0
    by_pos = paired_se(pred, full, target)
    by_seq = paired_se_by_sequence(pred, full, target)
    assert by_seq == pytest.approx(statistics.stdev([-6 / 50, 0, 0, 0]) / 2)
    assert by_seq is not None and by_seq > by_pos
    assert paired_se_by_sequence(pred[:1], full[:1], target[:1]) is None
    loss = -6 / 200
    rows = [_row(FULL, None, 0.5, 0.0, 1000), _row("uniform", 64, 0.5 + loss, by_pos, 100)]
    rows[1].accuracy_delta_se_seq = by_seq
    # by position alone it passes a 6-point tolerance with confidence, by sequence not
    assert 100 * (loss - 2 * by_pos) >= -6 > 100 * (loss - 2 * by_seq)
    (rec,) = recommend(rows, 6.0)
    assert rec["within_noise"] and rec["accuracy_delta_se_points"] == pytest.approx(100 * by_seq)


def test_a_step_cut_in_place_equals_the_cut_by_gather(tiny: Any) -> None:
    """The sweep's decode cut (the new key takes the evicted slot) keeps the same keys
    as re-gathering in position order (the worker's cut): same logits for every step,
    same KV and keys attended, for heavy-hitter and window layers."""
    from kcops.lab import sweep as sw
    from kcops.lab.sweep import decode, prefill

    model, _, seqs = tiny
    pre = prefill(model, seqs, EVAL)
    real = sw._kept_layer

    def by_gather(pre: Any, i: int, n: int | None, heavy: bool) -> Any:
        layer = real(pre, i, n, heavy)
        if layer.pos is not None:  # back to the gather path: slots in position order
            order = layer.pos.argsort(dim=-1)
            layer.keys = layer.keys.gather(-2, order[..., None].expand_as(layer.keys))
            layer.values = layer.values.gather(-2, order[..., None].expand_as(layer.values))
            layer.valid, layer.score = layer.valid.gather(-1, order), layer.score.gather(-1, order)
            layer.pos = None
        return layer

    for n, heavy in ((16, True), (40, True), (16, False)):
        per: list[int | None] = [n] * len(pre.kv)
        fast = decode(model, pre, per, heavy)
        sw._kept_layer = by_gather  # type: ignore[assignment]
        try:
            slow = decode(model, pre, per, heavy)
        finally:
            sw._kept_layer = real  # type: ignore[assignment]
        torch.testing.assert_close(fast["logits"], slow["logits"], rtol=1e-4, atol=1e-4)
        assert torch.equal(fast["logits"].argmax(-1), slow["logits"].argmax(-1))
        assert (fast["kv_bytes"], fast["keys_attended"]) == (
            slow["kv_bytes"],
            slow["keys_attended"],
        )
