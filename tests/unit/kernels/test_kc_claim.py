"""``kc claim``: the documents' 30–50% claim decided from sweep rows, three ways."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from click.testing import CliRunner

from kcops.cli.kc import kc_group
from kcops.lab.sweep import Row

FULL_KV = 1000


def _row(policy: str, n: int | None, context: int, acc: float, se: float, kv: int) -> Row:
    return Row(policy, n, context, acc, se, 0.9, 9.0, 0.1, 10.0, kv, 1.0, 1024, [])


def _folder(tmp: Path, rows: list[Row], runs: list[dict[str, object]]) -> Path:
    out = tmp / "sweep"
    out.mkdir()
    head = {"settings": {"model": "tiny", "corpus": "pydoc", "sequences": 16, "eval_tokens": 64}}
    lines = [json.dumps(head)] + [json.dumps(r.as_json()) for r in rows]
    (out / "rows.jsonl").write_text("\n".join(lines) + "\n")
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    return out


def test_confirmed_refuted_and_undecided_by_the_paired_error(tmp_path: Path) -> None:
    rows = [
        # 2048: N=512 saves 50% and loses 0.2 ± 0.3 pts: confirmed
        _row("full", None, 2048, 0.50, 0.0, FULL_KV),
        _row("uniform", 256, 2048, 0.47, 0.010, 250),
        _row("uniform", 512, 2048, 0.498, 0.003, 500),
        # 4096: every budget saving >= 30% loses 5 ± 1 pts or worse: refuted
        _row("full", None, 4096, 0.50, 0.0, FULL_KV),
        _row("uniform", 512, 4096, 0.40, 0.010, 125),
        _row("uniform", 2048, 4096, 0.45, 0.010, 500),
        _row("uniform", 3000, 4096, 0.50, 0.0, 740),  # keeps accuracy, saves only 26%
        # 8160: -0.5 ± 1.5 pts: cannot tell
        _row("full", None, 8160, 0.50, 0.0, FULL_KV),
        _row("uniform", 2048, 8160, 0.495, 0.015, 250),
    ]
    runs = [
        {"wall_s": 100.0, "peak_rss_bytes": 2 * 1024**3, "rows_measured": 5},
        {"wall_s": 20.5, "peak_rss_bytes": 3 * 1024**3, "rows_measured": 4},
    ]
    out = _folder(tmp_path, rows, runs)
    res = CliRunner().invoke(kc_group, ["claim", str(out), "--json"])
    assert res.exit_code == 0, res.output
    got = {v["context"]: v for v in json.loads(res.output)}
    assert {c: v["verdict"] for c, v in got.items()} == {
        2048: "confirmed",
        4096: "refuted",
        8160: "undecided",
    }
    assert (got[2048]["policy"], got[2048]["n"], got[2048]["kv_fraction"]) == ("uniform", 512, 0.5)
    assert got[4096]["n"] == 3000  # the smallest KV within 1 pt with confidence, 26% saved
    assert got[8160]["policy"] is None  # nothing within 1 pt with confidence
    assert got[2048]["wall_s"] == 120.5 and got[2048]["peak_rss_bytes"] == 3 * 1024**3
    table = CliRunner().invoke(kc_group, ["claim", str(out)])
    assert "**confirmed**" in table.output and "2 min 00 s" in table.output
    assert "| pydoc | 4096 | 1024 | 0.500 | uniform N=3000 | 0.740 | +0.0 ± 0.0 |" in table.output


def test_a_folder_that_is_not_a_sweep_is_one_line_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(kc_group, ["claim", str(tmp_path)])
    assert res.exit_code == 2 and "no rows.jsonl" in res.output
    (tmp_path / "rows.jsonl").write_text("not json\n")
    res = CliRunner().invoke(kc_group, ["claim", str(tmp_path)])
    assert res.exit_code == 2 and "settings header" in res.output


def _part(tmp: Path, name: str, rows: list[Row], corpus: str, eval_tokens: int = 64) -> Path:
    out = tmp / name
    out.mkdir()
    head = {"settings": {"model": "tiny", "corpus": corpus, "sequences": 8,
                         "eval_tokens": eval_tokens}}  # fmt: skip
    lines = [json.dumps(head)] + [json.dumps(r.as_json()) for r in rows]
    (out / "rows.jsonl").write_text("\n".join(lines) + "\n")
    run = {"wall_s": 600.0, "peak_rss_bytes": (16 + len(name)) * 1024**3, "rows_measured": 2}
    (out / "runs.jsonl").write_text(json.dumps(run) + "\n")
    return out


def _seq_row(acc: float, se: float, se_seq: float, n: int | None = 4080, kv: int = 500) -> Row:
    row = _row("uniform" if n else "full", n, 8160, acc, se, kv)
    row.accuracy_delta_se_seq = se_seq
    return row


def test_parts_of_one_sweep_pool_into_one_verdict(tmp_path: Path) -> None:
    # Four parts of 8 sequences: each alone loses 0.5 ± 0.4 pts by sequence (undecided at
    # a 1-pt tolerance); pooled, the by-sequence SE halves and the 50% saving is confirmed.
    fulls = [0.60, 0.58, 0.62, 0.60]
    parts = [
        _part(tmp_path, f"p{i}", [_seq_row(f, 0.0, 0.0, None, FULL_KV),
                                  _seq_row(f - 0.005, 0.003, 0.004)], f"part{i}.md")
        for i, f in enumerate(fulls)
    ]  # fmt: skip
    alone = CliRunner().invoke(kc_group, ["claim", str(parts[0]), "--json"])
    assert json.loads(alone.output)[0]["verdict"] == "undecided", alone.output
    res = CliRunner().invoke(kc_group, ["claim", "--pool", *map(str, parts), "--json"])
    assert res.exit_code == 0, res.output
    (v,) = json.loads(res.output)
    assert v["verdict"] == "confirmed" and v["n"] == 4080, v
    assert v["positions"] == 4 * 1024 and abs(v["full_accuracy"] - 0.60) < 1e-9
    assert abs(v["delta_points"] - -0.5) < 1e-9
    assert abs(v["se_points"] - 0.2) < 1e-9  # sqrt(4 x (0.4 / 4)^2): the parts' errors pooled
    assert v["wall_s"] == 2400.0 and v["peak_rss_bytes"] == 18 * 1024**3
    assert v["corpus"].startswith("4 parts: part0.md + part1.md")


def test_parts_that_disagree_keep_their_spread_in_the_error(tmp_path: Path) -> None:
    # Each part is precise on its own (SE 0.1) but the parts' losses differ (0 to -3 pts):
    # the pooled error must carry that spread (sd / sqrt(parts)), not only the parts' SEs.
    losses = [0.0, -0.01, -0.02, -0.03]
    parts = [
        _part(tmp_path, f"p{i}", [_seq_row(0.6, 0.0, 0.0, None, FULL_KV),
                                  _seq_row(0.6 + d, 0.001, 0.001)], f"part{i}.md")
        for i, d in enumerate(losses)
    ]  # fmt: skip
    res = CliRunner().invoke(kc_group, ["claim", "--pool", *map(str, parts), "--json"])
    (v,) = json.loads(res.output)
    spread = 100 * statistics.stdev(losses) / 2  # 0.65 pts
    # -1.5 ± 0.65: undecided (with the parts' SEs alone, -1.5 ± 0.05, it would be refuted)
    assert v["verdict"] == "undecided" and v["policy"] is None, v
    rows = pool_rows(parts)
    budget = next(r for r in rows if r.n == 4080)
    assert abs(100 * budget.delta_se - spread) < 1e-9, (budget.delta_se, spread)


def test_pooling_refuses_parts_that_are_not_one_sweep(tmp_path: Path) -> None:
    rows = [_seq_row(0.6, 0.0, 0.0, None, FULL_KV), _seq_row(0.6, 0.001, 0.001)]
    a = _part(tmp_path, "a", rows, "part1.md")
    same = _part(tmp_path, "b", rows, "part1.md")
    other = _part(tmp_path, "c", rows, "part2.md", eval_tokens=128)
    cases = {
        (a,): "two or more",
        (a, same): "read the same sequences",
        (a, other): "eval_tokens 128",
    }
    for folders, message in cases.items():
        res = CliRunner().invoke(kc_group, ["claim", "--pool", *map(str, folders)])
        assert res.exit_code == 2 and message in res.output, res.output


def pool_rows(folders: list[Path]) -> list[Row]:
    from kcops.lab.sweepclaim import pool, read_folder

    return pool([(f, *read_folder(f)) for f in folders])[1]


def test_by_method_each_policy_gets_its_largest_safe_saving_and_one_wins(tmp_path: Path) -> None:
    rows = [
        _row("full", None, 2048, 0.50, 0.0, FULL_KV),
        # kcops: 50% within noise-free 0.2 pts; 75% loses 4 ± 1
        _row("uniform", 500, 2048, 0.498, 0.003, 500),
        _row("uniform", 250, 2048, 0.46, 0.010, 250),
        # a press: 75% within 1 pt with confidence (−0.4 − 2 x 0.2 = −0.8): it wins
        _row("kvpress:snapkv", 500, 2048, 0.50, 0.0, 500),
        _row("kvpress:snapkv", 250, 2048, 0.496, 0.002, 250),
        # a press that never holds: refuted at every ≥ 30% saving
        _row("kvpress:knorm", 500, 2048, 0.40, 0.010, 500),
    ]
    out = _folder(tmp_path, rows, [])
    res = CliRunner().invoke(kc_group, ["claim", "--by-method", str(out), "--json"])
    assert res.exit_code == 0, res.output
    got = {b["policy"]: b for b in json.loads(res.output)}
    assert got["uniform"]["saving"] == 0.5 and got["uniform"]["verdict"] == "confirmed"
    assert got["kvpress:snapkv"]["saving"] == 0.75 and got["kvpress:snapkv"]["wins"]
    assert got["kvpress:knorm"]["saving"] is None and got["kvpress:knorm"]["verdict"] == "refuted"
    assert [p for p, b in got.items() if b["wins"]] == ["kvpress:snapkv"]
    table = CliRunner().invoke(kc_group, ["claim", "--by-method", str(out)]).output
    assert "**75% (N=250)** (best)" in table and "| — | — | refuted |" in table
    assert "| uniform | -4.0 ± 1.0 (0.25); -0.2 ± 0.3 (0.50) | 50% (N=500) |" in table


def test_by_method_reads_a_retrieve_folder(tmp_path: Path) -> None:
    out = tmp_path / "retrieval"
    out.mkdir()
    pooled = [
        {"policy": "uniform", "n": 256, "items": 120, "accuracy": 0.4, "delta_points": -50.0,
         "se_points": 4.0, "kv_ratio": 0.5},
        {"policy": "kvpress:snapkv", "n": 256, "items": 120, "accuracy": 0.9,
         "delta_points": 0.0, "se_points": 0.0, "kv_ratio": 0.5},
    ]  # fmt: skip
    doc = {"settings": {"task": "passkey"}, "cells": [{"length": 512}], "pooled": pooled,
           "succeeding_full_accuracy": 0.9, "succeeding_items": 120}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(kc_group, ["claim", "--by-method", str(out), "--json"])
    assert res.exit_code == 0, res.output
    got = {b["policy"]: b for b in json.loads(res.output)}
    assert got["uniform"]["verdict"] == "refuted" and got["uniform"]["saving"] is None
    assert got["kvpress:snapkv"]["verdict"] == "confirmed" and got["kvpress:snapkv"]["wins"]
    assert got["kvpress:snapkv"]["corpus"] == "retrieval (passkey)"
