"""``kc retrieve`` on the tiny model: items are deterministic with the key at the asked
depth, the teacher-forced score equals greedy generation, resume, bad input."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from kcops.cli.kc import kc_group
from kcops.kernels.topn import register
from kcops.lab.retrieve import FILLER, PASSKEY_INTRO, PASSKEY_QUESTION, Builder, score_batch
from kcops.lab.sweep import FULL
from kcops.worker.models import load_model


@pytest.fixture(scope="module")
def tiny() -> Iterator[tuple[Any, Any]]:
    torch.set_num_threads(1)
    yield load_model("tiny", progress=False, attn_implementation=register())


@pytest.mark.parametrize("task", ["passkey", "code"])
def test_items_are_deterministic_with_the_key_at_the_asked_depth(tiny: Any, task: str) -> None:
    _, tok = tiny
    a, b = Builder(tok, 7), Builder(tok, 7)
    longest = max(len(tok(" " + s, add_special_tokens=False).input_ids) for s in FILLER)
    keys = set()
    for depth in (0.0, 0.1, 0.5, 0.9, 1.0):
        for i in range(3):
            item = a.item(task, 600, depth, i)
            assert item == b.item(task, 600, depth, i)  # same seed, same item
            assert len(item.ids) == 600
            assert tok.decode(item.answer) == " " + item.key and len(item.key) == 5
            needle = tok.decode(item.ids[item.key_pos : item.key_pos + 16])
            want = f"The pass key is {item.key}." if task == "passkey" else f"= {item.key}\n"
            assert want in needle
            assert tok.decode(item.ids).count(item.key) == (2 if task == "passkey" else 1)
            keys.add(item.key)
            # the needle's position: depth x the filler's tokens after the intro, to within
            # one filler piece (a sentence, or a source line)
            head = _len(tok, "# settings and helpers\n" if task == "code" else PASSKEY_INTRO)
            filler = 600 - head - _needle_len(tok, item) - _tail_len(tok, item)
            piece = longest if task == "passkey" else 40
            assert abs(item.key_pos - (head + depth * filler)) <= piece, (depth, item.key_pos)
    assert len(keys) > 10
    assert Builder(tok, 8).item(task, 600, 0.5, 0).ids != a.item(task, 600, 0.5, 0).ids


def _len(tok: Any, text: str) -> int:
    return len(tok(text, add_special_tokens=False).input_ids)


def _needle_len(tok: Any, item: Any) -> int:
    if item.task == "passkey":
        text = f" The pass key is {item.key}. Remember it. {item.key} is the pass key."
    else:
        text = tok.decode(item.ids[item.key_pos :]).split("\n")[0] + "\n"
    return _len(tok, text)


def _tail_len(tok: Any, item: Any) -> int:
    if item.task == "passkey":
        return _len(tok, PASSKEY_QUESTION)
    name = tok.decode(item.ids[item.key_pos :]).split(" =")[0]
    tail = f"\n\ndef test_limit():\n    value = {name}\n    assert value =="
    return _len(tok, tail)


def test_teacher_forced_score_equals_greedy_generation(tiny: Any) -> None:
    """Brute force: each item's answer replaced by what ``generate`` (greedy, eager
    attention, the same weights) writes; the teacher-forced full-attention score must call
    it right, and wrong once any one of its tokens is changed (the first included: it is
    the prefill's last position)."""
    model, tok = tiny
    eager, _ = load_model("tiny", progress=False, attn_implementation="eager")
    items = [Builder(tok, 1).item("passkey", 300, 0.5, i) for i in range(3)]
    with torch.inference_mode():
        gen = eager.generate(
            torch.tensor([it.ids for it in items]),
            attention_mask=torch.ones(3, 300, dtype=torch.long),
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=2,
        )[:, 300:]
    as_generated = [dataclasses.replace(it, answer=gen[i].tolist()) for i, it in enumerate(items)]
    (full,) = score_batch(model, as_generated, [(FULL, None)])
    assert full["correct"] == [True, True, True]
    for j in (0, 2, 5):  # one token changed: wrong
        changed = []
        for it in as_generated:
            ans = list(it.answer)
            ans[j] = (ans[j] + 1) % 49152
            changed.append(dataclasses.replace(it, answer=ans))
        (res,) = score_batch(model, changed, [(FULL, None)])
        assert res["correct"] == [False, False, False], j
    # a budget that covers the whole prompt is full attention; a small one holds less KV
    got = score_batch(model, as_generated, [(FULL, None), ("uniform", 512), ("window", 16)])
    assert got[1]["correct"] == [True, True, True]
    assert got[1]["kv_bytes"] == got[0]["kv_bytes"] and got[2]["kv_bytes"] < got[0]["kv_bytes"] / 5


ARGS = [
    "retrieve", "--model", "tiny", "--lengths", "200", "--depths", "0.5", "--items", "3",
    "--n", "16,32", "--policies", "uniform", "--threads", "1", "--json",
]  # fmt: skip


def test_cli_json_and_resume(tmp_path: Path) -> None:
    out = tmp_path / "r"
    res = CliRunner().invoke(kc_group, [*ARGS, "--min-full", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    (cell,) = doc["cells"]
    assert (cell["length"], cell["depth"], cell["items"]) == (200, 0.5, 3)
    assert [b["n"] for b in cell["budgets"]] == [16, 32]
    assert doc["succeeding"] == [[200, 0.5]]  # --min-full 0: every cell counts
    assert {e["n"] for e in doc["pooled"]} == {16, 32} and doc["pooled"][0]["items"] == 3
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 3  # header, full, uniform 16, uniform 32
    again = CliRunner().invoke(kc_group, [*ARGS, "--min-full", "0", "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert (out / "rows.jsonl").read_text().splitlines() == lines  # nothing re-measured
    more = CliRunner().invoke(kc_group, [*ARGS, "--n", "16,32,64", "--out", str(out)])
    assert more.exit_code == 0, more.output
    added = (out / "rows.jsonl").read_text().splitlines()[len(lines) :]
    assert [json.loads(x)["n"] for x in added] == [64]  # only the new budget
    assert "Recommendation" in (out / "table.md").read_text()
    other = CliRunner().invoke(kc_group, [*ARGS, "--seed", "3", "--out", str(out)])
    assert other.exit_code == 2 and "other settings" in other.output


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--depths", "0.5,1.5", "fractions in [0, 1]"),
        ("--lengths", "20", "needs at least"),
        ("--lengths", "4000", "allows at most"),
        ("--n", "0", "positive integers"),
        ("--policies", "uniform,bogus", "allowed"),
        ("--task", "essay", "essay"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(flag: str, value: str, says: str) -> None:
    args = list(ARGS)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    res = CliRunner().invoke(kc_group, args)
    assert res.exit_code == 2, res.output
    assert says in res.output


def _rows(length: int, depth: float, plan: tuple[str, int | None], correct: list[bool]) -> Any:
    kv = {None: 1000, 64: 125, 128: 250}[plan[1]]
    return {"length": length, "depth": depth, "items": [0, len(correct)], "policy": plan[0],
            "n": plan[1], "correct": correct, "kv_bytes": kv, "keys_attended": 1.0}  # fmt: skip


def test_budgets_are_compared_over_the_cells_where_full_attention_succeeds() -> None:
    import statistics

    from kcops.lab.retrieverun import summarize

    full, u64, u128 = (FULL, None), ("uniform", 64), ("uniform", 128)
    t, f = True, False
    rows = [
        _rows(512, 0.1, full, [t, t, t, f]),
        _rows(512, 0.1, u64, [t, f, f, f]),
        _rows(512, 0.1, u128, [t, t, t, f]),
        _rows(512, 0.9, full, [f, f, f, t]),  # 0.25 < 0.5: full attention fails here
        _rows(512, 0.9, u64, [t, t, t, t]),  # so this cell's gain does not count
        _rows(512, 0.9, u128, [f, f, f, t]),
    ]
    doc = summarize(rows, [full, u64, u128], min_full=0.5, tolerance=1.0)
    assert [c["succeeds"] for c in doc["cells"]] == [True, False]
    assert doc["succeeding"] == [[512, 0.1]] and doc["succeeding_items"] == 4
    p64, p128 = doc["pooled"]
    assert p64["items"] == 4 and p64["delta_points"] == pytest.approx(-50.0)
    d = [0, -1, -1, 0]
    assert p64["se_points"] == pytest.approx(100 * statistics.stdev(d) / 2)
    assert not p64["holds"] and p128["holds"] and p128["se_points"] == 0.0
    assert doc["recommendation"]["n"] == 128
    assert [e["n"] for e in doc["neighbours"]] == [64, 128]
