"""The K(C) budget recommendation of a fleet: every pod a Prometheus scrapes (or one agent,
through the same query API), per served model, over the window asked.

Each pod's ``kcops_kc_tokens`` histograms are counted over the window the source holds
(the exact increase, as ``kcops cost`` counts: kcops.cli.cost.window_increase), by pod
(Prometheus's ``instance`` label) and layer; the pods serving one model are summed by
layer, and the sums go through the live recommendation's own code
(kcops.agent.kcrec.compute.recommend, with the calibration of the agent's config for
that model, kcops.agent.kcrec.calibration.coverage_for). Each pod is judged by the same
code on its own buckets: a pod whose uniform N differs from its model's by more than the
factor of the rule KcopsBudgetMismatch (4x) is named. The mass p is what the probes of
the model's pods say (``kcops_probe_kc_mass``); probes at different p are refused.
"""

from __future__ import annotations

import time

from kcops.agent.config.kcrec import RecommendationSection
from kcops.agent.kcrec.calibration import coverage_for
from kcops.agent.kcrec.component import ABOVE_RATIO
from kcops.agent.kcrec.compute import (
    OK,
    P_MISMATCH,
    Inputs,
    recommend,
    refuse,
    resolve_over,
    resolve_p,
    sized_for,
)
from kcops.agent.kcrec.window import buckets, parse_le
from kcops.cli.common import Doc
from kcops.cli.cost import QUERIES, window_increase
from kcops.cli.source import Source, Window

KC_BUCKET = "kcops_kc_tokens_bucket"
MASS = "kcops_probe_kc_mass"
POD = "instance"  # the label Prometheus gives each scraped target
UNKNOWN = "unknown"

Buckets = dict[str, tuple[tuple[float, ...], list[float]]]  # layer -> (bounds, counts)


def _by_layer(cum: dict[str, dict[float, float]]) -> Buckets:
    return {layer: got for layer, per in cum.items() if (got := buckets(per)) is not None}


def pod_buckets(source: Source, start: float, end: float) -> dict[str, Buckets]:
    """Each pod's K(C) buckets by layer over ``start..end`` (the pod is the source's URL
    where the series carry no ``instance``: one agent)."""
    inc = window_increase(source.client, source.sel(KC_BUCKET), start, end, by=(POD, "layer", "le"))
    cum: dict[str, dict[str, dict[float, float]]] = {}
    for (pod, layer, le), v in inc.items():
        ub = parse_le(le)
        if ub is None:
            continue
        per = cum.setdefault(pod or source.url, {}).setdefault(layer, {})
        per[ub] = per.get(ub, 0.0) + v
    return {pod: _by_layer(layers) for pod, layers in cum.items()}


def pod_models(source: Source, end: float, window_s: float) -> dict[str, str]:
    """The model each pod serves, from its request series (``unknown`` for a pod whose
    series name none, or several)."""
    w = f"{max(1, round(window_s))}s"
    expr = f"max by ({POD}, model) (last_over_time({source.sel(QUERIES)}[{w}]))"
    seen: dict[str, set[str]] = {}
    for labels, _v in source.client.vector(expr, at=end):
        model = labels.get("model") or UNKNOWN
        if model != UNKNOWN:
            seen.setdefault(labels.get(POD) or source.url, set()).add(model)
    return {pod: next(iter(m)) if len(m) == 1 else UNKNOWN for pod, m in seen.items()}


def pod_masses(source: Source, end: float, window_s: float) -> dict[str, dict[str, float]]:
    """The mass p each probe process measures, by pod: {pod: {pod/process: p}}."""
    w = f"{max(1, round(window_s))}s"
    out: dict[str, dict[str, float]] = {}
    for labels, v in source.client.vector(f"last_over_time({source.sel(MASS)}[{w}])", at=end):
        pod = labels.get(POD) or source.url
        out.setdefault(pod, {})[f"{pod}/{labels.get('process', '?')}"] = v
    return out


def merged(per_pod: list[Buckets]) -> Buckets:
    """The pods' buckets summed by layer (every probe uses the same bounds: the wire's)."""
    cum: dict[str, dict[float, float]] = {}
    for layers in per_pod:
        for layer, (bounds, counts) in layers.items():
            per = cum.setdefault(layer, {})
            acc = 0.0
            for ub, c in zip((*bounds, float("inf")), counts, strict=True):
                acc += c
                per[ub] = per.get(ub, 0.0) + acc
    return _by_layer(cum)


def _uniform(rec: Doc) -> int | None:
    uni = rec.get("uniform")
    return int(uni["tokens"]) if rec.get("status") == OK and uni else None


def model_doc(
    model: str, pods: dict[str, Buckets], masses: dict[str, float], cfg: RecommendationSection
) -> Doc:
    """One model's fleet recommendation, with each pod's own figure beside it."""
    fleet = merged(list(pods.values()))
    p, p_source, refused = resolve_p(cfg.p, masses)
    over = resolve_over(cfg.uniform_over, fleet, None)
    cov = coverage_for(cfg, None if model == UNKNOWN else model, over, None, p)

    def one(layers: Buckets) -> Doc:
        rec = recommend(
            Inputs(layers), cov, min_samples=cfg.min_samples, uniform_over=cfg.uniform_over
        )
        return refuse(rec, P_MISMATCH, refused) if refused is not None else rec

    rec = one(fleet)
    n = _uniform(rec)
    rows = []
    for pod in sorted(pods):
        own = one(pods[pod])
        n_pod = _uniform(own)
        ratio = n_pod / n if n and n_pod else None
        rows.append(
            {
                "pod": pod,
                "samples": round(
                    sum(sum(c) for _b, c in pods[pod].values()) / max(1, len(pods[pod]))
                ),
                "layers": len(pods[pod]),
                "status": own["status"],
                "n": n_pod,
                "ratio": round(ratio, 3) if ratio is not None else None,
                "differs": ratio is not None and not (1 / ABOVE_RATIO <= ratio <= ABOVE_RATIO),
            }
        )
    return {**sized_for(model, cov, p_source, cfg.min_samples), **rec, "pods": rows}


def fleet_recommendation(
    source: Source, start: float, end: float, cfg: RecommendationSection
) -> Doc:
    """Every model's fleet recommendation over the part of ``start..end`` the source holds."""
    cover: Window = source.coverage(start, end)
    doc: Doc = {
        "source": {"kind": source.kind, "url": source.url, "selector": source.selector},
        "window": cover.as_json(),
        "computed_at": round(time.time(), 3),
        "factor": ABOVE_RATIO,
        "models": [],
    }
    if cover.start >= end:
        return doc
    held = end - cover.start
    per_pod = pod_buckets(source, cover.start, end)
    models = pod_models(source, end, held)
    masses = pod_masses(source, end, held)
    by_model: dict[str, dict[str, Buckets]] = {}
    for pod, layers in per_pod.items():
        if layers:
            by_model.setdefault(models.get(pod, UNKNOWN), {})[pod] = layers
    for model in sorted(by_model):
        pods = by_model[model]
        mass = {k: v for pod in pods for k, v in masses.get(pod, {}).items()}
        doc["models"].append(model_doc(model, pods, mass, cfg))
    return doc


def interval_text(interval: list[float | None]) -> str:
    low, high = interval
    return f"({low:g}, {'inf' if high is None else f'{high:g}'}]"


def layer_table(layers: list[Doc]) -> list[str]:
    """The per-layer rows of a recommendation: samples, budget, interval, dense, in N."""
    out = [
        "| layer | samples | budget (tokens) | interval | dense | in N |",
        "|---|---:|---:|---|---|---|",
    ]
    for row in layers:
        budget = row.get("tokens", "—")
        iv = interval_text(row["interval"]) if "interval" in row else "—"
        out.append(
            f"| {row['layer']} | {row['samples']} | {budget} | {iv} "
            f"| {'yes' if row['dense'] else ''} | {'yes' if row['in_uniform'] else ''} |"
        )
    return out


def lines(doc: Doc, what: str, cover: Window) -> list[str]:
    """The text view: per model, its layers, uniform N and pods."""
    out = [cover.line(what)]
    if not doc["models"]:
        out.append("no K(C) observations in the window (is a kcops probe sampling K(C)?)")
    for m in doc["models"]:
        pods = m["pods"]
        out += [
            "",
            f"Fleet K(C) budget recommendation, model {m['model']}: K_{m['p']:g} (p from the "
            f"{m['p_source']}) for {m['quantile']:.1%} of attention calls, over {len(pods)} "
            f"pod(s) ({m['calibration']['status']})",
            f"status: {m['status']}" + (f" — {m['reason']}" if m.get("reason") else ""),
            "",
            *layer_table(m["layers"]),
            "",
        ]
        uni = m.get("uniform")
        out.append(
            f"uniform N = {uni['tokens']} (binding layer {uni['binding_layer']})"
            if uni
            else "uniform N: none recommended"
        )
        out += [
            "",
            "| pod | mean samples a layer | layers | its own N | x the fleet's |",
            "|---|---:|---:|---:|---|",
        ]
        for row in pods:
            ratio = f"{row['ratio']:g}x" if row["ratio"] is not None else "—"
            flag = f" DIFFERS by more than {doc['factor']:g}x" if row["differs"] else ""
            n = row["n"] if row["n"] is not None else row["status"]
            out.append(
                f"| {row['pod']} | {row['samples']} | {row['layers']} | {n} | {ratio}{flag} |"
            )
    return out
