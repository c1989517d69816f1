"""``kcops kc measure``: JSON shape, text table, bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from kcops.cli import cli
from kcops.lab import cli as kc_cli
from tests.unit.kernels.conftest import VOCAB, tiny_llama


class ByteTokenizer:
    """Bytes mod the tiny model's vocabulary: enough for the command's code path."""

    def __call__(self, text: str, return_tensors: str, truncation: bool, max_length: int) -> Any:
        ids = [b % VOCAB for b in text.encode()][:max_length]
        return {"input_ids": torch.tensor([ids])}


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    from pydoc_data import topics

    path = tmp_path / "text.txt"
    path.write_text(topics.topics["assignment"])
    return path


@pytest.fixture
def fake_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        kc_cli, "load_model", lambda name, **kw: (tiny_llama("sdpa"), ByteTokenizer())
    )


def test_measure_json_shape(fake_load: None, text_file: Path) -> None:
    res = CliRunner().invoke(
        cli,
        ["kc", "measure", "--model", "tiny", "--text", str(text_file), "--p", "0.9,0.95",
         "--rows", "3", "--max-tokens", "40", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc) == {"model", "tokens", "p", "layers"}
    assert doc["model"] == "tiny" and doc["tokens"] == 40 and doc["p"] == [0.9, 0.95]
    assert [layer["layer"] for layer in doc["layers"]] == [0, 1]
    for layer in doc["layers"]:
        assert [r["position"] for r in layer["rows"]] in ([0, 20, 39], [0, 19, 39])
        for row in layer["rows"]:
            assert set(row) == {"position", "k_union", "k_heads", "topn_mass"}
            assert set(row["k_union"]) == {"0.9", "0.95"}
            assert all(len(v) == 4 for v in row["k_heads"].values())
            assert set(row["topn_mass"]) == {"16", "32", "64"}
            assert 1 <= row["k_union"]["0.9"] <= row["k_union"]["0.95"] <= row["position"] + 1


def test_measure_table(fake_load: None, text_file: Path) -> None:
    res = CliRunner().invoke(
        cli, ["kc", "measure", "--model", "tiny", "--text", str(text_file), "--max-tokens", "32"]
    )
    assert res.exit_code == 0, res.output
    assert "K_union med" in res.output
    assert "kappa" in res.output


@pytest.mark.parametrize(
    "args",
    [
        ["--text", "/nonexistent/file.txt"],
        ["--p", "1.5"],
        ["--p", "abc"],
        ["--rows", "first"],
        ["--rows", "0"],
        ["--max-tokens", "0"],
        ["--model", "/nonexistent-model-dir"],
    ],
)
def test_bad_input_exits_2(fake_load: None, text_file: Path, args: list[str]) -> None:
    base = {"--model": "tiny", "--text": str(text_file)}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    flat = [x for kv in base.items() for x in kv]
    res = CliRunner().invoke(cli, ["kc", "measure", *flat])
    assert res.exit_code == 2, res.output


def test_empty_text_exits_2(fake_load: None, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    res = CliRunner().invoke(cli, ["kc", "measure", "--model", "tiny", "--text", str(empty)])
    assert res.exit_code == 2
    assert "empty" in res.output


def test_sweep_bad_usage_exits_2_before_loading_a_model() -> None:
    for extra, word in ((["--n", "0"], "--n"), (["--policies", "nope"], "--policies")):
        res = CliRunner().invoke(cli, ["kc", "sweep", "--model", "tiny", *extra])
        assert res.exit_code == 2 and word in res.output, res.output


def test_quantile() -> None:
    assert kc_cli._q([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == 9
    assert kc_cli._q([5], 0.9) == 5


@pytest.mark.slow
def test_measure_out_then_report(fake_load: None, text_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "kc"
    res = CliRunner().invoke(
        cli,
        ["kc", "measure", "--model", "tiny", "--text", str(text_file), "--max-tokens", "40",
         "--out", str(out), "--map-rows", "3"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "measure.json").read_text())
    assert doc["tokens"] == 40
    res = CliRunner().invoke(cli, ["kc", "report", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.glob("attention_query_*.png")) == [
        "attention_query_0.png",
        "attention_query_20.png",
        "attention_query_39.png",
    ]
    assert not (out / "tensorboard").exists()  # only with --tensorboard
