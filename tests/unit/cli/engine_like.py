"""A collector that writes what a busy engine's scrape, health check and probe would.

Counters and histogram buckets grow every tick, as real ones do, so rates and
quantiles over them have values; device memory sits at 95% of its total (the
memory alert's condition) so an alert is pending while the test looks. The
series are those the real parts write: the probe's K(C) histogram has no
``layer`` label (attention calls do), unless ``kc_by_layer`` asks for the
per-layer K(C) series that ``kcops top`` reads where a probe exports it.
"""

from __future__ import annotations

from kcops.agent.samples import Sample

LAYERS = 4
BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, float("inf"))
KC_BOUNDS = (8.0, 16.0, 32.0, 64.0, 128.0, float("inf"))


def _hist(
    name: str, bounds: tuple[float, ...], share: list[float], n: int, labels: dict[str, str]
) -> list[Sample]:
    out = []
    acc = 0.0
    for le, s in zip(bounds, share, strict=True):
        acc += s
        le_s = "+Inf" if le == float("inf") else repr(le)
        out.append(Sample.of(name + "_bucket", acc * n, {**labels, "le": le_s}))
    out.append(Sample.of(name + "_count", float(n), labels))
    out.append(Sample.of(name + "_sum", 0.2 * n, labels))
    return out


class EngineLike:
    name = "engine_like"

    def __init__(self, kc_by_layer: bool = False, state: str = "ready") -> None:
        self.ticks = 0
        self.kc_by_layer = kc_by_layer
        self.state = state

    def collect(self, now: float) -> list[Sample]:
        self.ticks += 1
        n = 10 * self.ticks
        share = [0.1, 0.3, 0.3, 0.2, 0.1, 0.0]
        out = [
            Sample.of("kcops_device_memory_used_bytes", 950 * 2**20, {"device": "0"}),
            Sample.of("kcops_device_memory_total_bytes", 1000 * 2**20, {"device": "0"}),
            Sample.of("kcops_kv_cache_usage_ratio", 0.42),
            Sample.of("kcops_engine_up", 1.0 if self.state == "ready" else 0.0),
            Sample.of("kcops_requests_running", 3.0),
            Sample.of("kcops_requests_waiting", 1.0),
            Sample.of("kcops_attention_topn", 32.0),
            Sample.of("kcops_shadow_agreement_ratio", 0.97),
            Sample.of("kcops_prefix_cache_queries_total", 100.0 * self.ticks),
            Sample.of("kcops_prefix_cache_hits_total", 60.0 * self.ticks),
        ]
        for name in ("kcops_ttft_seconds", "kcops_request_latency_seconds",
                     "kcops_inter_token_latency_seconds"):  # fmt: skip
            out += _hist(name, BOUNDS, share, n, {})
        for st in ("starting", "ready", "hung", "down"):
            out.append(Sample.of("kcops_engine_state", float(st == self.state), {"state": st}))
        # All layers together, as a probe before wire version 4 sends it.
        whole = {"layer": "unknown"} if self.kc_by_layer else {}
        out += _hist("kcops_kc_tokens", KC_BOUNDS, [0.0, 0.2, 0.5, 0.3, 0.0, 0.0], n, whole)
        for layer in range(LAYERS):
            lab = {"layer": f"model.layers.{layer}.self_attn"}
            if self.kc_by_layer:
                kc_share = [0.0] * 6
                kc_share[min(layer + 1, 4)] = 1.0
                out += _hist("kcops_kc_tokens", KC_BOUNDS, kc_share, n, lab)
            out.append(Sample.of("kcops_attention_calls_total", float(n), lab))
        return out
