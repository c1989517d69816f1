"""The series around an incident as OpenMetrics text, from the agent's own store.

The store is read on the event loop (it is not thread-safe): :func:`snapshot` copies the
window's arrays, and :func:`render` formats them off the loop. Every family is typed
``unknown``, which OpenMetrics takes for any name; staleness markers are left out.
"""

from __future__ import annotations

from array import array

from kcops.agent.samples import SeriesKey, is_stale
from kcops.agent.store import Store

# Which families: the engine, K(C) and the probe, device and process memory, the stall
# watch's canary, the KV cache; the rest of the store is the agent's own bookkeeping.
PREFIXES = (
    "kcops_engine_", "kcops_kc", "kcops_probe_", "kcops_device_", "kcops_gpu_",
    "kcops_process_", "kcops_kv_", "kcops_canary", "kcops_request", "kcops_ttft",
    "kcops_inter_token", "kcops_prefix_cache", "kcops_attention",
)  # fmt: skip

Window = list[tuple[SeriesKey, array, array]]


def snapshot(store: Store, start: float, end: float) -> Window:
    out: Window = []
    for name in store.names():
        if name.startswith(PREFIXES):
            for key in store.keys(name):
                ts, vs = store.range_arrays(key, start, end)
                if len(ts):
                    out.append((key, array("d", ts), array("d", vs)))
    return out


def _labels(key: SeriesKey) -> str:
    if not key.labels:
        return ""
    esc = (v.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n") for _, v in key.labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(key.labels, esc, strict=True)) + "}"


def _value(v: float) -> str:
    return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}.get(repr(v), repr(v))


def render(window: Window, max_bytes: int) -> tuple[str, bool]:
    """The text and whether it was cut at ``max_bytes`` (whole series are kept or left;
    histogram buckets, the bulk of an engine's series, go last, so a cut takes them first)."""
    lines: list[str] = []
    size, cut, typed = 0, False, set()
    for key, ts, vs in sorted(window, key=lambda w: (w[0].name.endswith("_bucket"), w[0])):
        head = [] if key.name in typed else [f"# TYPE {key.name} unknown"]
        body = [f"{key.name}{_labels(key)} {_value(v)} {t:.3f}"
                for t, v in zip(ts, vs, strict=True) if not is_stale(v)]  # fmt: skip
        n = sum(len(x) + 1 for x in head + body)
        if size + n > max_bytes:
            cut = True
            continue
        typed.add(key.name)
        lines += head + body
        size += n
    return "\n".join([*lines, "# EOF"]) + "\n", cut
