"""The probe on the real SmolLM2-135M: outputs unchanged, frames per layer, K(C) exact."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kcops.kernels as kernels  # noqa: E402
from tests.unit.kernels.conftest import Listener  # noqa: E402

pytestmark = pytest.mark.slow


def _load(attn: str) -> tuple[Any, Any]:
    models = pytest.importorskip("kcops.worker.models")
    try:
        return models.load_model("smollm2", progress=False, attn_implementation=attn)  # type: ignore[no-any-return]
    except models.ModelUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def smollm2_sdpa() -> tuple[Any, Any]:
    return _load("sdpa")


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    kernels.uninstall()
    yield
    kernels.uninstall()


def _prompt(tok: Any, n: int) -> Any:
    from pydoc_data import topics

    text = topics.topics["assignment"] + topics.topics["compound"]
    return tok(text, return_tensors="pt", truncation=True, max_length=n)["input_ids"]


def test_bit_identical_and_frames_per_layer(smollm2_sdpa: tuple[Any, Any]) -> None:
    model, tok = smollm2_sdpa
    layers = model.config.num_hidden_layers
    ids = _prompt(tok, 96)
    with torch.no_grad():
        ref = model(ids).logits
        ref_gen = model.generate(ids, max_new_tokens=4, do_sample=False)
    folder = tempfile.mkdtemp(prefix="kcp-", dir="/tmp")
    path = os.path.join(folder, "p.sock")
    lst = Listener(path)  # the agent's stream socket, as the probe finds it
    try:
        probe = kernels.install(
            kernels.ProbeConfig(sample_rate=0.5, socket_path=path, flush_interval_ms=60_000)
        )
        with torch.no_grad():
            got = model(ids).logits
            gen = model.generate(ids, max_new_tokens=4, do_sample=False)
        probe.flush()
        (frame,) = lst.frames()
    finally:
        lst.close()
        os.unlink(path)
        os.rmdir(folder)
    assert torch.equal(ref, got)
    assert torch.equal(ref_gen, gen)
    passes = 1 + 4  # one forward, then a prefill and 3 decode steps for 4 new tokens
    assert frame.calls_by_layer == {str(i): passes for i in range(layers)}
    assert sum(frame.errors.values()) == 0
    # K(C) by layer: the layers whose calls were sampled (half of them, at random)
    assert frame.kc_by_layer and set(frame.kc_by_layer) <= {str(i) for i in range(layers)}
    assert all(h.count > 0 for h in frame.kc_by_layer.values())
    assert frame.internal_errors == 0 == probe.internal_errors


def test_kp_matches_eager_attention_matrix() -> None:
    from tests.unit.kernels.test_kc import brute_force

    model, tok = _load("eager")
    kv = model.config.num_key_value_heads
    ids = _prompt(tok, 160)
    p_values = (0.8, 0.9, 0.95)
    probe = kernels.install(
        kernels.ProbeConfig(sample_rate=1.0, rows=6, p_values=p_values, record=True, publish=False)
    )
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    assert len(probe.records) == 6 * model.config.num_hidden_layers
    for layer, row in probe.records:
        full = out.attentions[int(layer)][0, :, row.position, : row.position + 1]
        for p in p_values:
            heads, union = brute_force(full, kv, p)
            assert row.k_heads[p] == heads, (layer, row.position, p)
            assert row.k_union[p] == union, (layer, row.position, p)
