"""The recommendation document from a window's K(C) buckets: a pure step, no I/O.

Per layer, the budget that holds mass p for a share q of the window's attention calls
(the q-quantile of K_p, with the interval its bucket gives, :mod:`kcops.kcbudget`);
the uniform N over the layers the configuration names; the evidence. A layer with fewer
than ``min_samples`` observations makes the whole document ``insufficient_samples``: it
says which layers and how many, when the window will hold enough at the rate samples come,
and which sampling rate would give a first figure within an hour (:func:`progress`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kcops.kcbudget import Quantile, quantile, uniform

OK = "ok"
INSUFFICIENT = "insufficient_samples"
HOUR_S = 3600.0
NO_DATA = "no_data"
P_MISMATCH = "p_mismatch"
DEFAULT_P = 0.9  # the probe's default KCOPS_PROBE_P, when no probe has said yet


def resolve_p(
    configured: float | None, measured: Mapping[str, float]
) -> tuple[float, str, str | None]:
    """The mass p the recommendation is for: (p, where it comes from, why it is refused or
    None). What the probes measure (``kcops_probe_kc_mass`` by process) decides; a
    configured ``recommendation.p`` must agree with it, and the probes with each other."""
    values = sorted(set(measured.values()))
    if not values:
        if configured is not None:
            return configured, "config (no probe has said its p yet)", None
        return DEFAULT_P, "default (no probe has said its p yet)", None
    if len(values) > 1:
        by = ", ".join(f"{p:g} ({', '.join(sorted(k for k, v in measured.items() if v == p))})"
                       for p in values)  # fmt: skip
        return (
            values[0],
            "probe",
            (
                f"the probes measure different p: {by}; K(C) at different masses cannot be "
                "summed: give every engine the same KCOPS_PROBE_P"
            ),
        )
    p = values[0]
    if configured is not None and abs(configured - p) > 1e-9:
        return (
            p,
            "probe",
            (
                f"recommendation.p={configured:g} is not what the probe measures (p={p:g}, its "
                f"KCOPS_PROBE_P): remove recommendation.p, or set it to {p:g}"
            ),
        )
    return p, "probe", None


def refuse(rec: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    """``rec`` recommending nothing: the layers keep their sample counts, no figures."""
    for row in rec["layers"]:
        for k in ("tokens", "estimate", "interval"):
            row.pop(k, None)
    rec.update(status=status, reason=reason, uniform=None)
    return rec


@dataclass(frozen=True)
class Coverage:
    """The mass p and call quantile q the budget is sized for, and where they come from."""

    p: float
    quantile: float
    calibrated: bool
    source: str  # "default" or where the calibration came from
    notes: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "status": "calibrated" if self.calibrated else "uncalibrated",
            "p": self.p,
            "quantile": self.quantile,
            "source": self.source,
            "notes": list(self.notes),
        }


def sized_for(model: str | None, cov: Coverage, p_source: str, min_samples: int) -> dict[str, Any]:
    """What a recommendation document says it is sized for: the model, the mass p and
    where it comes from, the call quantile, the samples a layer needs, the calibration
    (the live document's and the fleet's alike)."""
    return {
        "model": model,
        "p": cov.p,
        "p_source": p_source,
        "quantile": cov.quantile,
        "min_samples": min_samples,
        "calibration": cov.as_json(),
    }


@dataclass
class Inputs:
    """What one computation reads: K(C) buckets by layer, top-N mass buckets by n."""

    kc: Mapping[str, tuple[Sequence[float], Sequence[float]]]  # layer -> (bounds, counts)
    topn: Mapping[str, tuple[Sequence[float], Sequence[float]]] = field(default_factory=dict)
    dense_layers: frozenset[int] | None = None  # as the engine reports them; None: unknown


def recommend(
    inp: Inputs,
    cov: Coverage,
    *,
    min_samples: int,
    uniform_over: str,
) -> dict[str, Any]:
    """The document's recommendation part: ``status``, ``layers``, ``uniform``, ``reason``."""
    dense = inp.dense_layers or frozenset()
    over = resolve_over(uniform_over, inp.kc, inp.dense_layers)
    layers: list[dict[str, Any]] = []
    quants: dict[str, Quantile] = {}
    short: list[str] = []
    for layer in sorted(inp.kc, key=_layer_order):
        bounds, counts = inp.kc[layer]
        n = round(sum(counts))
        is_dense = layer.isdigit() and int(layer) in dense
        row: dict[str, Any] = {"layer": layer, "samples": n, "dense": is_dense}
        used = not (over == "non_dense" and is_dense)
        row["in_uniform"] = used
        if n < min_samples:
            if used:
                short.append(f"{layer} ({n})")
        else:
            got = quantile(cov.quantile, counts, bounds)
            if got is not None:
                row.update(_figures(got))
                if used:
                    quants[layer] = got
        layers.append(row)
    out: dict[str, Any] = {"layers": layers, "uniform_over": over, "uniform": None}
    if not layers:
        out.update(status=NO_DATA, reason="no K(C) observations in the window")
        return out
    if short:  # nothing is recommended: no layer's figure either
        return refuse(
            out,
            INSUFFICIENT,
            f"{len(short)} layer(s) below {min_samples} K(C) samples in the window: "
            + ", ".join(short[:8])
            + (" ..." if len(short) > 8 else ""),
        )
    uni = uniform(quants)
    if uni is None:
        out.update(status=NO_DATA, reason="no layer is covered by the uniform N")
        return out
    binding = max(quants, key=lambda lay: quants[lay].tokens)
    out["uniform"] = {
        **_figures(uni),
        "binding_layer": binding,
        "layers": sorted(quants, key=_layer_order),
    }
    out.update(status=OK, reason=None)
    return out


def resolve_over(uniform_over: str, layers: Iterable[str], dense: frozenset[int] | None) -> str:
    """``all`` or ``non_dense``: ``auto`` is the non-dense layers when the engine keeps some
    layers dense (and budgets some), else all."""
    if uniform_over != "auto":
        return uniform_over
    dense = dense or frozenset()
    some = any(not (lay.isdigit() and int(lay) in dense) for lay in layers)
    return "non_dense" if dense and some else "all"


def topn_coverage(
    topn: Mapping[str, tuple[Sequence[float], Sequence[float]]], p: float
) -> dict[str, dict[str, Any]]:
    """Per n: the share of sampled calls whose top-n keys hold more than ``b`` of the mass,
    ``b`` the largest bucket bound at or below p (the buckets cannot say more)."""
    out: dict[str, dict[str, Any]] = {}
    for n in sorted(topn, key=_layer_order):
        bounds, counts = topn[n]
        total = sum(counts)
        below = [i for i, b in enumerate(bounds) if b <= p + 1e-12]
        if total <= 0 or not below:
            continue
        i = below[-1]
        at_most = sum(counts[: i + 1])
        out[n] = {
            "samples": round(total),
            "mass_above": bounds[i],
            "share_of_calls": round(1.0 - at_most / total, 4),
        }
    return out


def _figures(q: Quantile) -> dict[str, Any]:
    high = None if q.high == float("inf") else q.high
    return {"tokens": q.budget, "estimate": round(q.tokens, 2), "interval": [q.low, high]}


def _layer_order(layer: str) -> tuple[int, int | str]:
    return (0, int(layer)) if layer.isdigit() else (1, layer)


def progress(
    layers: list[dict[str, Any]],
    arrivals: Mapping[str, tuple[float, float]],
    calls: Mapping[str, tuple[float, float]],
    min_samples: int,
    window_s: float,
) -> dict[str, Any]:
    """While samples are too few: per layer the samples there are, those needed, how fast
    they come and when the window holds enough (None: never at this rate, the window drops
    them as fast as they come); the share of attention calls the probe samples now, and the
    share that would give a first figure within an hour (``arrivals``/``calls``: per layer,
    (added in the window, seconds covered))."""
    rows, slowest, eta = [], math.inf, 0.0
    for row in layers:
        if not row["in_uniform"]:
            continue
        n, covered = arrivals.get(row["layer"], (0.0, 0.0))
        per_s = n / covered if covered > 0 else 0.0
        missing = max(0, min_samples - row["samples"])
        if not missing:
            when: float | None = 0.0
        else:
            when = missing / per_s if per_s * window_s >= min_samples else None
            slowest = min(slowest, per_s)
        eta = math.inf if when is None else max(eta, when)
        at = None if when is None else round(when)
        rows.append({"layer": row["layer"], "samples": row["samples"], "needed": min_samples,
                     "per_s": round(per_s, 5), "eta_s": at})  # fmt: skip
    sampled = sum(a[0] for a in arrivals.values())
    called = sum(c[0] for c in calls.values())
    share = sampled / called if called > 0 else None
    hour = min_samples / min(window_s, HOUR_S)  # samples a second the slowest layer needs
    for_hour = None
    if share is not None and 0 < slowest < math.inf:
        for_hour = min(1.0, share * hour / slowest)
    return {
        "layers": rows,
        "eta_s": None if eta == math.inf else round(eta),
        "sampled_share": None if share is None else round(share, 6),
        "share_for_first_within_1h": None if for_hour is None else round(for_hour, 6),
    }
