"""Pictures of K(C): attention maps equal eager attention's, PNGs of the fixed size,
TensorBoard events readable back with the expected tags, one self-contained page."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kcops.kernels.kc import k_from_sorted
from kcops.lab import maps
from tests.unit.kernels.conftest import text_ids, tiny_llama

pytest.importorskip("matplotlib")


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


@pytest.fixture(scope="module")
def captured() -> tuple[Any, torch.Tensor, maps.AttentionMaps]:
    model = tiny_llama("eager", layers=3)
    ids = text_ids(48)
    return model, ids, maps.capture(model, ids, rows=4, p=0.9)


def test_maps_equal_eager_attention_weights(captured: Any) -> None:
    model, ids, got = captured
    assert model.config._attn_implementation == "eager"  # restored after the pass
    with torch.no_grad():
        att = torch.stack(model(ids, output_attentions=True).attentions)[:, 0]  # L, H, T, T
    rows = torch.tensor(got.positions)
    assert got.positions.tolist() == [0, 16, 31, 47]
    np.testing.assert_allclose(got.weights, att.mean(1)[:, rows].numpy(), atol=1e-5)
    # K_p by hand: per head, then the union over the 2 heads of each KV group
    w = att[:, :, rows]  # L, H, R, T
    for layer in range(w.shape[0]):
        for r in range(len(rows)):
            sets = []
            for h in range(w.shape[1]):
                k = int(k_from_sorted(w[layer, h, r].sort(descending=True).values, 0.9))
                sets.append(set(w[layer, h, r].argsort(descending=True)[:k].tolist()))
            union = max(len(sets[0] | sets[1]), len(sets[2] | sets[3]))
            assert got.kp[layer, r] == union


def test_pngs_tensorboard_and_page(captured: Any, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from kcops.lab import mapviz
    from kcops.lab.report import render

    _model, _ids, got = captured
    got.save(tmp_path)
    page = render(tmp_path, tensorboard=True)
    tags = ["kc/K_p_per_layer"] + [f"attention/query_{p}" for p in (0, 16, 31, 47)]
    for tag in tags:
        png = tmp_path / mapviz.png_name(tag)
        assert png.stat().st_size > 5_000  # a drawn figure, not an empty canvas
        assert _png_size(png) == mapviz.PNG_SIZE_PX
    text = page.read_text()
    assert text.count("data:image/png;base64,") == len(tags)
    assert "K(C) per layer" in text and 'src="http' not in text  # self-contained

    acc = EventAccumulator(str(tmp_path / mapviz.TB_FOLDER)).Reload()
    assert sorted(acc.Tags()["images"]) == sorted(tags)
    assert sorted(acc.Tags()["scalars"]) == ["kc/K_p0.9_median", "kc/kappa_median"]
    kp = acc.Scalars("kc/K_p0.9_median")
    assert [e.step for e in kp] == [0, 1, 2]
    assert [e.value for e in kp] == [float(np.median(got.kp[i])) for i in range(3)]
    img = acc.Images("attention/query_47")[0]
    assert (img.width, img.height) == mapviz.PNG_SIZE_PX


def test_maps_roundtrip_and_bad_rows(captured: Any, tmp_path: Path) -> None:
    model, ids, got = captured
    back = maps.AttentionMaps.load(got.save(tmp_path))
    np.testing.assert_array_equal(back.weights, got.weights)
    assert back.p == 0.9 and back.positions.tolist() == got.positions.tolist()
    with pytest.raises(ValueError, match="rows must be >= 1"):
        maps.capture(model, ids, rows=0, p=0.9)
