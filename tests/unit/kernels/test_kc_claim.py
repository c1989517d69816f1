"""``kc claim``: the documents' 30–50% claim decided from sweep rows, three ways."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kcops.cli.kc import kc_group
from kcops.kernels.sweep import Row

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
