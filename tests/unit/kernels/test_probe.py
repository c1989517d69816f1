"""The probe observes without changing results, counts per layer, publishes, never blocks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import pytest
import torch

import kcops.kernels as kernels
from kcops.kernels import wire
from tests.unit.kernels.conftest import Listener, drain, text_ids, tiny_llama


def cfg(**kw: Any) -> kernels.ProbeConfig:
    base: dict[str, Any] = {"flush_interval_ms": 60_000, "socket_path": "/nonexistent/kc.sock"}
    base.update(kw)
    return kernels.ProbeConfig(**base)


def test_import_is_inert() -> None:
    code = (
        "import sys, kcops.kernels, kcops.kernels.wire, kcops.kernels.config;"
        "assert 'torch' not in sys.modules, 'torch imported';"
        "assert 'transformers' not in sys.modules;"
        "assert kcops.kernels.get_probe() is None"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_outputs_bit_identical_and_calls_per_layer(
    attn: str, listener: tuple[str, Listener]
) -> None:
    path, sock = listener
    model = tiny_llama(attn, layers=3)
    ids = text_ids(64, 300)
    with torch.no_grad():
        ref = [model(ids).logits for _ in range(2)]
    probe = kernels.install(cfg(sample_rate=1.0, socket_path=path, rows=4))
    with torch.no_grad():
        got = [model(ids).logits for _ in range(2)]
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a, b)
    assert probe.flush() == 1
    frames = drain(sock)
    assert len(frames) == 1
    frame = frames[0]
    assert frame.calls_by_layer == {"0": 2, "1": 2, "2": 2}
    assert frame.pid == os.getpid()
    assert frame.errors == {"nan": 0, "inf": 0, "exception": 0}
    assert frame.histograms[wire.CONTEXT_TOKENS].count == 6
    assert frame.histograms[wire.ATTENTION_SECONDS].count == 6
    # 4 rows per sampled call, batch 1: one K(C) observation per row, by layer
    assert {k: h.count for k, h in frame.kc_by_layer.items()} == {"0": 8, "1": 8, "2": 8}
    assert wire.KC_TOKENS not in frame.histograms  # K(C) goes by layer only
    assert frame.histograms[wire.KC_RATIO].count == 24
    assert set(frame.topn_mass) == {16, 32, 64}
    assert frame.topn_mass[16].count == 24
    assert probe.internal_errors == 0 and frame.internal_errors == 0


def test_frames_are_deltas_with_sequence(listener: tuple[str, Listener]) -> None:
    path, sock = listener
    model = tiny_llama("sdpa")
    probe = kernels.install(cfg(sample_rate=0.0, socket_path=path))
    with torch.no_grad():
        model(text_ids(16))
    probe.flush()
    probe.flush()
    with torch.no_grad():
        model(text_ids(16))
    probe.flush()
    frames = drain(sock)
    assert [f.seq for f in frames] == [0, 1, 2]
    assert [f.calls_by_layer for f in frames] == [{"0": 1, "1": 1}, {}, {"0": 1, "1": 1}]
    assert frames[1].is_empty()
    assert len({f.instance for f in frames}) == 1
    assert frames[0].kc_by_layer == {}  # nothing sampled


def test_no_listener_never_raises_and_counts_drops() -> None:
    model = tiny_llama("sdpa")
    probe = kernels.install(cfg(sample_rate=1.0))
    with torch.no_grad():
        model(text_ids(16))
    assert probe.flush() == 0
    assert probe.flush() == 0
    assert probe.publisher.dropped_total == 2


def test_dropped_total_reaches_the_agent_when_it_appears(listener: tuple[str, Listener]) -> None:
    path, sock = listener
    probe = kernels.install(cfg(socket_path=path + ".absent"))
    probe.flush()
    probe.publisher.socket_path = path
    probe.flush()
    (frame,) = drain(sock)
    assert frame.dropped == 1  # the frames dropped since the last one sent
    assert frame.seq == 1  # seq 0 was the dropped frame: the receiver sees the gap
    probe.flush()
    (frame,) = drain(sock)
    assert frame.dropped == 0 and probe.publisher.dropped_total == 1


def test_full_socket_buffer_drops_instead_of_blocking(listener: tuple[str, Listener]) -> None:
    path, _sock = listener
    probe = kernels.install(cfg(socket_path=path))
    # nobody reads: the connection's queue fills up and a send would block
    for _ in range(5000):
        probe.flush()
        if probe.publisher.dropped_total:
            break
    assert probe.publisher.dropped_total >= 1


def test_nan_counted_once_per_affected_call() -> None:
    from transformers.modeling_utils import AttentionInterface
    from transformers.models.llama.modeling_llama import eager_attention_forward

    def nan_query(module: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if module.layer_idx == 2:  # the last layer: NaN cannot spread to a later one
            query = query.clone()
            query[0, 0, -1, 0] = float("nan")
        return eager_attention_forward(module, query, *args, **kwargs)

    AttentionInterface.register("kcops_test_nan", nan_query)
    model = tiny_llama("eager", layers=3)
    model.config._attn_implementation = "kcops_test_nan"
    probe = kernels.install(cfg(sample_rate=0.5))
    with torch.no_grad():
        for _ in range(4):
            out = model(text_ids(12)).logits  # the engine keeps running
    assert torch.isnan(out).any()
    probe.resolve_pending()  # 12 calls: fewer than one check group, so still pending
    assert probe.aggregator.errors == {"nan": 4, "inf": 0, "exception": 0}
    assert probe.aggregator.calls == {"0": 4, "1": 4, "2": 4}
    assert probe.internal_errors == 0


@pytest.mark.parametrize("rate", [0.0, kernels.ProbeConfig().sample_rate])
def test_nan_counted_on_every_unsampled_call(rate: float) -> None:
    """At the default rate (and with no sampling at all) a NaN in one layer's output is
    counted on every call, though almost no call is sampled: 40 forwards, 120 calls, more
    than three check groups and a partial one."""
    from transformers.modeling_utils import AttentionInterface
    from transformers.models.llama.modeling_llama import eager_attention_forward

    def nan_out(module: Any, *args: Any, **kwargs: Any) -> Any:
        out, weights = eager_attention_forward(module, *args, **kwargs)
        if module.layer_idx == 2:  # the last layer: NaN cannot spread to a later one
            out = out.clone()
            out[0, -1, 0, 0] = float("nan")
        return out, weights

    AttentionInterface.register("kcops_test_nan_out", nan_out)
    model = tiny_llama("eager", layers=3)
    model.config._attn_implementation = "kcops_test_nan_out"
    probe = kernels.install(cfg(sample_rate=rate))
    with torch.no_grad():
        for _ in range(40):
            model(text_ids(6))
    probe.resolve_pending()
    assert probe.aggregator.errors == {"nan": 40, "inf": 0, "exception": 0}
    assert probe.aggregator.calls == {"0": 40, "1": 40, "2": 40}
    sampled = probe.aggregator.hist[wire.ATTENTION_SECONDS].count
    assert sampled == 0 if rate == 0.0 else sampled <= 10
    assert probe.internal_errors == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_share_follows_the_rate(seed: int) -> None:
    """The sampler draws a geometric skip count per sampled call instead of a random number
    per call; every call is still sampled with probability ``sample_rate``: 4,000 calls at
    0.1 give 400 sampled, binomial SD 19, within 5 SD."""
    probe = kernels.install(cfg(sample_rate=0.1, seed=seed, integrations=("torch_sdpa",)))
    q = torch.randn(1, 2, 3, 4)
    for _ in range(4000):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    probe.resolve_pending()
    assert probe.aggregator.calls == {wire.UNKNOWN_LAYER: 4000}
    assert 305 <= probe.aggregator.hist[wire.ATTENTION_SECONDS].count <= 495


def test_kernel_exception_counted_and_reraised() -> None:
    from transformers.modeling_utils import AttentionInterface

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("kernel failed")

    AttentionInterface.register("kcops_test_broken", broken)
    model = tiny_llama("eager")
    model.config._attn_implementation = "kcops_test_broken"
    probe = kernels.install(cfg())
    with pytest.raises(RuntimeError, match="kernel failed"), torch.no_grad():
        model(text_ids(8))
    assert probe.aggregator.errors["exception"] == 1


def test_function_registered_after_install_is_instrumented() -> None:
    from transformers.modeling_utils import AttentionInterface
    from transformers.models.llama.modeling_llama import eager_attention_forward

    probe = kernels.install(cfg(sample_rate=1.0, record=True))
    seen: list[int] = []

    def custom(module: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(module.layer_idx)
        return eager_attention_forward(module, *args, **kwargs)

    AttentionInterface.register("kcops_test_late", custom)
    model = tiny_llama("eager")
    model.config._attn_implementation = "kcops_test_late"
    with torch.no_grad():
        model(text_ids(8))
    probe.resolve_pending()
    assert seen == [0, 1]
    assert probe.aggregator.calls == {"0": 1, "1": 1}
    assert {layer for layer, _ in probe.records} == {"0", "1"}


def test_install_is_idempotent_and_uninstall_restores() -> None:
    from transformers.modeling_utils import AttentionInterface

    original = AttentionInterface.get_interface
    original_sdpa = torch.nn.functional.scaled_dot_product_attention
    a = kernels.install(cfg())
    b = kernels.install(cfg(sample_rate=1.0))
    assert a is b is kernels.get_probe()
    model = tiny_llama("sdpa")
    with torch.no_grad():
        model(text_ids(8))
    a.resolve_pending()
    assert a.aggregator.calls == {"0": 1, "1": 1}  # not counted twice
    kernels.uninstall()
    assert kernels.get_probe() is None
    assert AttentionInterface.get_interface is original
    assert torch.nn.functional.scaled_dot_product_attention is original_sdpa
    kernels.uninstall()  # safe twice


def test_plain_torch_sdpa() -> None:
    probe = kernels.install(cfg(sample_rate=1.0, record=True, integrations=("torch_sdpa",)))
    q = torch.randn(1, 4, 5, 8)
    k = torch.randn(1, 4, 5, 8)
    v = torch.randn(1, 4, 5, 8)
    ref = torch.nn.functional.scaled_dot_product_attention
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    probe.resolve_pending()
    assert probe.aggregator.calls == {wire.UNKNOWN_LAYER: 1}
    kernels.uninstall()
    assert torch.equal(out, ref.__wrapped__(q, k, v, is_causal=True))  # type: ignore[attr-defined]
    assert [row.visible for _, row in probe.records] == [5]


def test_nvtx_ranges_pushed(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = kernels.install(cfg(integrations=("torch_sdpa",)))
    names: list[str] = []
    monkeypatch.setattr(probe.ranges, "push", names.append)
    monkeypatch.setattr(probe.ranges, "pop", lambda: None)
    monkeypatch.setattr(probe.ranges, "active", True)  # as with a tool attached
    q = torch.randn(1, 2, 3, 4)
    torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert names == ["kcops.attention.layerunknown"]


def test_unix_socket_path_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCOPS_PROBE_SOCKET", "/x/y.sock")
    assert kernels.ProbeConfig().socket_path == "/x/y.sock"


def test_config_validation() -> None:
    with pytest.raises(kernels.ProbeConfigError, match="sample_rate"):
        kernels.ProbeConfig(sample_rate=2.0)
    with pytest.raises(kernels.ProbeConfigError, match="rows"):
        kernels.ProbeConfig(rows="some")
    with pytest.raises(kernels.ProbeConfigError, match="integrations"):
        kernels.ProbeConfig(integrations=("sglang",))
    with pytest.raises(kernels.ProbeConfigError, match="p_values"):
        kernels.ProbeConfig(p_values=(1.5,))
    assert kernels.ProbeConfig().engine == wire.UNKNOWN_ENGINE == "unknown"
    for bad in ("", "vLLM", "x" * 17, 'a",b="c'):
        with pytest.raises(kernels.ProbeConfigError, match="engine"):
            kernels.ProbeConfig(engine=bad)


def test_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCOPS_PROBE_SAMPLE_RATE", "0.5")
    monkeypatch.setenv("KCOPS_PROBE_ROWS", "8")
    monkeypatch.setenv("KCOPS_PROBE_P", "0.9,0.95")
    monkeypatch.setenv("KCOPS_PROBE_INTEGRATIONS", "transformers")
    c = kernels.ProbeConfig.from_env()
    assert (c.sample_rate, c.rows, c.p_values, c.integrations) == (
        0.5,
        8,
        (0.9, 0.95),
        ("transformers",),
    )
    monkeypatch.setenv("KCOPS_PROBE_ROWS", "x")
    with pytest.raises(kernels.ProbeConfigError):
        kernels.ProbeConfig.from_env()
    monkeypatch.delenv("KCOPS_PROBE_ROWS")
    monkeypatch.setenv("KCOPS_PROBE_ENGINE", " sglang ")
    assert kernels.ProbeConfig.from_env().engine == "sglang"
    monkeypatch.setenv("KCOPS_PROBE_ENGINE", "SGLang")
    with pytest.raises(kernels.ProbeConfigError, match="engine"):
        kernels.ProbeConfig.from_env()


def test_frames_carry_the_engine_configured_then_set(listener: tuple[str, Listener]) -> None:
    path, sock = listener
    probe = kernels.install(cfg(socket_path=path, engine="sglang", integrations=()))
    probe.flush()
    probe.set_engine("vllm")  # an integration that knows where it runs
    probe.flush()
    assert [f.engine for f in drain(sock)] == ["sglang", "vllm"]
    with pytest.raises(wire.BadField, match="engine"):
        probe.set_engine("Not An Engine")
    assert probe.publisher.engine == "vllm"


def test_socket_module_unused_without_publish() -> None:
    probe = kernels.install(cfg(publish=False))
    assert probe.publisher._thread is None
    assert isinstance(socket.AF_UNIX, int)


@pytest.mark.parametrize(
    "values,expected",
    [
        ([1.0, 2.0], {"nan": 0, "inf": 0}),
        ([1.0, float("nan")], {"nan": 1, "inf": 0}),
        ([float("inf"), 1.0], {"nan": 0, "inf": 1}),
        ([float("inf"), float("-inf")], {"nan": 0, "inf": 1}),
        ([float("nan"), float("inf")], {"nan": 1, "inf": 1}),
    ],
)
def test_error_check_kinds(values: list[float], expected: dict[str, int]) -> None:
    from kcops.kernels.aggregate import Aggregator
    from kcops.kernels.errcheck import ErrorCheck

    agg = Aggregator((16,))
    check = ErrorCheck(agg)
    check.check(torch.tensor(values))
    check.check(torch.tensor([1, 2]))  # integer outputs are not checked
    check.drain()
    assert {k: agg.errors[k] for k in ("nan", "inf")} == expected


def test_forked_child_publishes_with_its_own_identity(listener: tuple[str, Listener]) -> None:
    path, sock = listener
    probe = kernels.install(cfg(socket_path=path, integrations=("torch_sdpa",)))
    probe.flush()
    pid = os.fork()
    if pid == 0:  # child: count a call and flush, then leave without cleanup
        code = 0
        try:
            q = torch.ones(1, 1, 2, 4)
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
            child = kernels.get_probe()
            code = 0 if child is not None and child.flush() == 1 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    frames = drain(sock)
    assert [f.pid for f in frames] == [os.getpid(), pid]
    parent, child = frames
    assert child.seq == 0 and child.instance != parent.instance
    assert child.calls_by_layer == {wire.UNKNOWN_LAYER: 1}


def test_the_reference_worker_says_kcops(
    listener: tuple[str, Listener], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kcops.worker.app import install_probe

    path, sock = listener
    monkeypatch.setenv("KCOPS_PROBE_SOCKET", path)
    assert install_probe() == "probe installed"
    probe = kernels.get_probe()
    assert probe is not None
    probe.flush()
    assert [f.engine for f in drain(sock)] == ["kcops"]


def test_the_reference_worker_takes_probe_settings_from_the_environment(
    listener: tuple[str, Listener], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kcops serve` honours KCOPS_PROBE_* as `kcops.kernels.run` and the vLLM plugin do."""
    from kcops.worker.app import install_probe

    path, _ = listener
    monkeypatch.setenv("KCOPS_PROBE_SOCKET", path)
    monkeypatch.setenv("KCOPS_PROBE_SAMPLE_RATE", "0.25")
    monkeypatch.setenv("KCOPS_PROBE_ROWS", "3")
    assert install_probe() == "probe installed"
    probe = kernels.get_probe()
    assert probe is not None
    assert (probe.config.sample_rate, probe.config.rows) == (0.25, 3)


def test_the_reference_worker_serves_on_when_probe_settings_are_bad(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kcops.worker.app import install_probe

    monkeypatch.setenv("KCOPS_PROBE_SAMPLE_RATE", "often")
    status = install_probe()
    assert status.startswith("probe install failed:") and "KCOPS_PROBE_" in status
    assert kernels.get_probe() is None
