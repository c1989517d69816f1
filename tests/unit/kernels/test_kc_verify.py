"""``kc verify`` on the tiny model: the control has zero error, Performer improves with M."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from kcops.cli.kc import kc_group
from kcops.lab.sweep import SweepError, chunks, corpus_text
from kcops.lab.verify import parse_variant, register, verify
from kcops.worker.models import load_model


@pytest.fixture(scope="module")
def setup() -> tuple[Any, torch.Tensor]:
    torch.set_num_threads(1)
    model, tok = load_model("tiny", progress=False, attn_implementation=register())
    ids = tok(corpus_text("pydoc", 5_000), add_special_tokens=False).input_ids
    return model, chunks(ids, 1, 95)


def test_full_attention_as_a_variant_has_zero_error(setup: Any) -> None:
    model, seqs = setup
    (res,) = verify(model, seqs, [parse_variant("full")])
    assert res["max_rel_error"] == 0.0 and res["mean_kl"] == 0.0 and res["agreement"] == 1.0
    assert all(res["pass"].values())


def test_performer_error_falls_as_features_grow(setup: Any) -> None:
    model, seqs = setup
    res = verify(model, seqs, [parse_variant(f"performer:{m}") for m in (8, 64, 1024)])
    errs = [r["max_rel_error"] for r in res]
    assert errs[0] > errs[1] > errs[2] > 0.0


def test_window_covering_the_sequence_is_exact_and_bad_variants_are_named(setup: Any) -> None:
    model, seqs = setup
    (res,) = verify(model, seqs, [parse_variant("window:96:0")])
    assert res["max_rel_error"] == 0.0
    with pytest.raises(SweepError, match="allowed full, topn:N"):
        parse_variant("topn:0")


@pytest.mark.slow
def test_cli_verify_json() -> None:
    args = ["verify", "--model", "tiny", "--context", "48", "--sequences", "1",
            "--variants", "full,topn:8", "--threads", "1", "--json"]  # fmt: skip
    res = CliRunner().invoke(kc_group, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    names = [r["variant"] for r in doc["results"]]
    assert names == ["full", "topn:8"] and doc["thresholds"]["code_analysis"] == 1e-4
    assert doc["results"][1]["max_rel_error"] > 0
    bad = CliRunner().invoke(kc_group, [*args[:-3], "--variants", "nope", "--json"])
    assert bad.exit_code == 2 and "allowed full" in bad.output
