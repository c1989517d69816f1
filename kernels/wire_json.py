"""Version 1 of the probe frame: a JSON payload. Read for one release, never sent.

Probes before version 2 send it; the agent still decodes it with the same
bounds as version 2 (counts a float holds exactly, finite non-negative sums,
bounded layers, top-N entries and label lengths). :func:`encode_v1` exists for
tests and for the side-by-side benchmark. Stdlib only, like :mod:`wire`.
"""

from __future__ import annotations

import json
from typing import Any

from kcops.kernels import wire


def _hist_json(h: wire.Histogram) -> dict[str, Any]:
    return {"c": h.counts, "s": h.sum, "n": h.count}


def encode_v1(frame: wire.Frame) -> bytes:
    """The version-1 datagram of ``frame`` (what probes before version 2 sent)."""
    body = {
        "pid": frame.pid,
        "process": frame.process,
        "seq": frame.seq,
        "instance": frame.instance,
        "ts": frame.ts,
        "calls": frame.calls_by_layer,
        "errors": frame.errors,
        "hist": {name: _hist_json(h) for name, h in frame.histograms.items()},
        "topn": {str(n): _hist_json(h) for n, h in frame.topn_mass.items()},
        "dropped_total": frame.dropped_total,
    }
    payload = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION_JSON, len(payload)) + payload


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= wire.MAX_COUNT:
        raise wire.WireError(f"{what}: expected an integer in 0..2**53, got {wire.excerpt(v)}")
    return v


def _label(v: Any, what: str, *, empty: bool = True) -> str:
    if not isinstance(v, str):
        raise wire.WireError(f"{what}: process, instance and layers must be strings")
    if len(v) > wire.MAX_LABEL_CHARS or (not empty and not v) or "\x00" in v:
        raise wire.WireError(
            f"{what}: {wire.excerpt(v)} must be 1..{wire.MAX_LABEL_CHARS} characters without NUL"
        )
    if not v.isascii():
        # JSON's \u escapes can spell lone surrogates, which no UTF-8 encoder (the
        # agent's /metrics, OTLP) accepts: the binary versions decode strict UTF-8 instead.
        try:
            v.encode()
        except UnicodeEncodeError:
            raise wire.WireError(f"{what}: {wire.excerpt(v)} is not valid Unicode text") from None
    return v


def _hist(name: str, raw: Any) -> wire.Histogram:
    if name not in wire.BUCKETS:
        raise wire.WireError(f"unknown histogram {wire.excerpt(name)}")
    if not isinstance(raw, dict) or not isinstance(raw.get("c"), list):
        raise wire.WireError(f"histogram {name}: expected an object with c, s, n")
    bounds = wire.BUCKETS[name]
    if len(raw["c"]) != len(bounds) + 1:
        raise wire.WireError(
            f"histogram {name} has {len(raw['c'])} bucket counts, expected {len(bounds) + 1}"
        )
    counts = [_int(c, f"{name} bucket") for c in raw["c"]]
    s = raw.get("s")
    if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s <= wire.MAX_SUM:
        # the range first: float() of an integer literal past 1e308 raises OverflowError
        raise wire.WireError(
            f"histogram {name}: sum {wire.excerpt(s)} is not a number in 0..{wire.MAX_SUM:g}"
        )
    return wire.checked_histogram(
        name, bounds, counts, float(s), _int(raw.get("n"), f"{name} count")
    )


def _topn_key(k: str) -> int:
    if not (k.isdecimal() and len(k) <= 7 and 1 <= int(k) <= wire.MAX_TOPN_N):
        raise wire.WireError(
            f"bad frame field: top-N key {wire.excerpt(k)} is not 1..{wire.MAX_TOPN_N}"
        )
    return int(k)


def _maps(body: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    maps = tuple(body.get(k, {}) for k in ("calls", "errors", "hist", "topn"))
    if not all(isinstance(x, dict) for x in maps):
        raise wire.WireError("calls, errors, hist and topn must be objects")
    calls, _, hist, topn = maps
    if len(calls) > wire.MAX_LAYERS or len(topn) > wire.MAX_TOPN or len(hist) > len(wire.BUCKETS):
        raise wire.WireError(
            f"too many entries: {len(calls)} layers (max {wire.MAX_LAYERS}), "
            f"{len(topn)} top-N (max {wire.MAX_TOPN})"
        )
    return maps


def decode_v1(payload: bytes) -> wire.Frame:
    """Parse and validate a version-1 payload (the bytes after the header)."""
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        # ValueError: bad JSON, bad UTF-8, and an integer literal past Python's 4,300-digit
        # conversion limit (not a JSONDecodeError); RecursionError: deep nesting.
        raise wire.WireError(f"frame payload is not JSON: {wire.excerpt(str(exc))}") from None
    if not isinstance(body, dict):
        raise wire.WireError("frame payload must be a JSON object")
    calls, errors, hist, topn = _maps(body)
    ts = body.get("ts", 0.0)
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not 0.0 <= ts <= wire.MAX_TS:
        raise wire.WireError(f"ts must be a finite number of Unix seconds, got {wire.excerpt(ts)}")
    frame = wire.Frame(
        pid=_int(body.get("pid"), "pid"),
        process=_label(body.get("process", ""), "process"),
        seq=_int(body.get("seq"), "seq"),
        instance=_label(body.get("instance", ""), "instance"),
        ts=float(ts),
        calls_by_layer={
            _label(k, "layer", empty=False): _int(v, f"calls[{wire.excerpt(k)}]")
            for k, v in calls.items()
        },
        histograms={name: _hist(name, raw) for name, raw in hist.items()},
        topn_mass={_topn_key(n): _hist(wire.TOPN_MASS, raw) for n, raw in topn.items()},
        dropped_total=_int(body.get("dropped_total", 0), "dropped_total"),
    )
    for kind, v in errors.items():
        if kind not in wire.ERROR_KINDS:
            raise wire.WireError(
                f"unknown error kind {wire.excerpt(kind)}, allowed: {', '.join(wire.ERROR_KINDS)}"
            )
        frame.errors[kind] = _int(v, f"errors[{kind}]")
    return frame
