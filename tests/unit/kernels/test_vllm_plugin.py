"""The vLLM plugin against a fake module laid out like vLLM's attention backends.

The real vLLM is not installed in make test: see tests marked ``vllm``.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kcops.kernels as kernels
from kcops.kernels.integrations import vllm_plugin

FAKE = "fake_vllm_kc.v1.attention.backend"


class _Meta:
    def __init__(self, max_seq_len: int) -> None:
        self.max_seq_len = max_seq_len


class _Layer:
    def __init__(self, i: int) -> None:
        self.layer_name = f"model.layers.{i}.self_attn.attn"


@pytest.fixture
def fake_vllm() -> Iterator[types.ModuleType]:
    mod = types.ModuleType(FAKE)

    class AttentionImpl:
        def forward(self, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any,
                    attn_metadata: Any, output: Any = None) -> Any:  # fmt: skip
            raise NotImplementedError

    class CPUAttentionBackendImpl(AttentionImpl):
        def forward(self, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any,
                    attn_metadata: Any, output: Any = None) -> Any:  # fmt: skip
            out = query * 2
            if output is not None:
                output.copy_(out)
                return output
            return out

    mod.AttentionImpl = AttentionImpl  # type: ignore[attr-defined]
    mod.CPUAttentionBackendImpl = CPUAttentionBackendImpl  # type: ignore[attr-defined]
    sys.modules[FAKE] = mod
    try:
        yield mod
    finally:
        del sys.modules[FAKE]


def _call(impl: Any, layer: int, query: torch.Tensor, seq: int = 7) -> Any:
    return impl.forward(_Layer(layer), query, query, query, None, _Meta(seq))


def test_wraps_existing_and_later_backends(fake_vllm: types.ModuleType) -> None:
    probe = kernels.install(kernels.ProbeConfig(publish=False, integrations=()))
    assert probe.ensure_integration("vllm", lambda p: vllm_plugin.install(p, (FAKE,)))

    # a backend defined after the plugin ran, as vLLM imports them lazily
    class FlashAttentionImpl(fake_vllm.AttentionImpl):  # type: ignore[name-defined,misc]
        def forward(self, layer: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            return query + 1

    q = torch.ones(3, 8)
    assert torch.equal(_call(fake_vllm.CPUAttentionBackendImpl(), 0, q), q * 2)
    assert torch.equal(_call(FlashAttentionImpl(), 1, q), q + 1)
    assert torch.equal(_call(FlashAttentionImpl(), 1, q), q + 1)
    probe.resolve_pending()  # unsampled calls are counted in groups, or at a flush
    assert probe.aggregator.calls == {"0": 1, "1": 2}
    ctx = probe.aggregator.hist["kcops_context_tokens"]
    assert ctx.count == 3 and ctx.sum == 21


def test_nan_and_exception_counted(fake_vllm: types.ModuleType) -> None:
    probe = kernels.install(kernels.ProbeConfig(publish=False, integrations=()))
    probe.ensure_integration("vllm", lambda p: vllm_plugin.install(p, (FAKE,)))

    class BadImpl(fake_vllm.AttentionImpl):  # type: ignore[name-defined,misc]
        def forward(self, layer: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if query.sum() < 0:
                raise RuntimeError("boom")
            return torch.full_like(query, float("nan"))

    _call(BadImpl(), 3, torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="boom"):
        _call(BadImpl(), 3, -torch.ones(2, 2))
    probe.resolve_pending()
    assert probe.aggregator.errors == {"nan": 1, "inf": 0, "exception": 1}


def test_uninstall_restores_forward(fake_vllm: types.ModuleType) -> None:
    original = fake_vllm.CPUAttentionBackendImpl.forward
    probe = kernels.install(kernels.ProbeConfig(publish=False, integrations=()))
    probe.ensure_integration("vllm", lambda p: vllm_plugin.install(p, (FAKE,)))
    assert fake_vllm.CPUAttentionBackendImpl.forward is not original
    kernels.uninstall()
    assert fake_vllm.CPUAttentionBackendImpl.forward is original

    class Later(fake_vllm.AttentionImpl):  # type: ignore[name-defined,misc]
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return None

    assert not getattr(Later.forward, vllm_plugin.WRAPPED_MARK, False)


def test_register_is_idempotent_and_never_raises(
    fake_vllm: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_plugin, "BASE_MODULES", (FAKE,))
    monkeypatch.setenv("KCOPS_PROBE_INTEGRATIONS", "torch_sdpa")
    monkeypatch.setenv("KCOPS_PROBE_SOCKET", "/nonexistent/p.sock")
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM loads plugins in several processes, sometimes twice
    probe = kernels.get_probe()
    assert probe is not None
    assert set(probe.patches) == {"torch_sdpa", "vllm"}
    assert probe.publisher.engine == vllm_plugin.ENGINE == "vllm"  # the label it sends
    _call(fake_vllm.CPUAttentionBackendImpl(), 5, torch.ones(1, 4))
    probe.resolve_pending()
    assert probe.aggregator.calls == {"5": 1}
    monkeypatch.setenv("KCOPS_PROBE_SAMPLE_RATE", "7")  # bad config: logged, not raised
    kernels.uninstall()
    vllm_plugin.register()
    assert kernels.get_probe() is None


def test_info_lines_name_the_backends_wrapped(
    fake_vllm: types.ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One line at install naming what is wrapped so far; then one per backend class wrapped
    later, which in vLLM's worker is the backend it picked (imported after the plugins)."""
    monkeypatch.setattr(vllm_plugin, "BASE_MODULES", (FAKE,))
    monkeypatch.setenv("KCOPS_PROBE_INTEGRATIONS", "torch_sdpa")
    monkeypatch.setenv("KCOPS_PROBE_SOCKET", "/nonexistent/p.sock")
    monkeypatch.setattr(vllm_plugin, "_announced_pid", None)
    caplog.set_level(logging.INFO, logger="vllm.plugins.kcops_probe")
    vllm_plugin.register()
    vllm_plugin.register()
    installed = [r.getMessage() for r in caplog.records if "installed" in r.getMessage()]
    assert len(installed) == 1 and "(now: CPUAttentionBackendImpl)" in installed[0]

    class FlashAttentionImpl(fake_vllm.AttentionImpl):  # type: ignore[name-defined,misc]
        def forward(self, layer: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            return query

    class TritonAttentionImpl(FlashAttentionImpl):
        def forward(self, layer: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            return query

    wrapped = [r.getMessage() for r in caplog.records if "wrapped" in r.getMessage()]
    assert len(wrapped) == 2, wrapped
    assert "wrapped FlashAttentionImpl.forward" in wrapped[0] and "engine vllm" in wrapped[0]
    assert "wrapped TritonAttentionImpl.forward" in wrapped[1]
    _call(TritonAttentionImpl(), 2, torch.ones(1, 4))
    probe = kernels.get_probe()
    assert probe is not None
    probe.resolve_pending()
    assert probe.aggregator.calls == {"2": 1}


def test_register_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCOPS_PROBE", "0")
    vllm_plugin.register()
    assert kernels.get_probe() is None


def test_install_without_vllm_is_a_no_op() -> None:
    probe = kernels.install(kernels.ProbeConfig(publish=False))
    assert "vllm" not in probe.patches  # vLLM is not imported here


@pytest.mark.parametrize(
    "name,expected",
    [("model.layers.12.self_attn.attn", "12"), ("decoder.layers.0.attn", "0"), ("x", "unknown")],
)
def test_layer_of(name: str, expected: str) -> None:
    layer = types.SimpleNamespace(layer_name=name)
    assert vllm_plugin.layer_of(layer) == expected


@pytest.mark.vllm
def test_real_vllm_base_class_found() -> None:
    pytest.importorskip("vllm")
    assert vllm_plugin.find_base() is not None
