"""``kc sweep``'s calibration: the K_p rows it measures are the probe's, and its
recommendation.json carries the K(C) coverage of the N it recommends."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner

from kcops.cli.kc import kc_group


def test_window_rows_are_the_probes_k_union() -> None:
    from kcops.kernels.kc import kc_rows
    from kcops.kernels.kvkeep import OBS_WINDOW, capture_scores, record_scores

    torch.manual_seed(5)
    b, hq, hkv, t, d = 2, 6, 2, 80, 8
    q, k = torch.randn(b, hq, t, d) * 2, torch.randn(b, hkv, t, d)
    with capture_scores(p_grid=(0.5, 0.9)) as cap:
        record_scores(0, q, k, None)
    ref = kc_rows(q, k, attention_mask=None, scaling=None, rows="all", p_values=(0.5, 0.9), topn=())
    for p in (0.5, 0.9):
        want = ref.k_union[p][:, -OBS_WINDOW:].flatten().tolist()
        assert cap.rows[0][p] == want


def test_sweep_records_the_coverage_of_its_n(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args = [
        "sweep", "--model", "tiny", "--n", "16,64", "--context", "128", "--policies", "uniform",
        "--sequences", "2", "--eval-tokens", "4", "--threads", "1", "--out", str(out), "--json",
    ]  # fmt: skip
    res = CliRunner().invoke(kc_group, args)
    assert res.exit_code == 0, res.output
    (rec,) = json.loads((out / "recommendation.json").read_text())
    cov = rec["kc_coverage"]
    print(json.dumps(cov))
    assert cov["n"] == rec["n"] and cov["p"] == 0.9 and cov["layers"] == "all"
    assert cov["samples_per_layer"] == 2 * 32  # sequences x the window's rows
    assert set(cov["by_p"]) == {"0.5", "0.8", "0.9", "0.95", "0.99"}
    assert "K(C) coverage of N=" in (out / "table.md").read_text()
    # tiny's attention is near-uniform: K_0.9 of its calls is near 0.9 t, far above any
    # small N, so the coverage is a bound (below_all) and says so
    assert cov["match"] in ("exact", "below_all", "above_all")
