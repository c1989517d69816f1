"""The fleet recommendation's arithmetic (kcops.cli.kc_fleet): pods' buckets summed by layer
through the live recommendation's own code, and a pod far from its fleet named. Against
real Prometheus: tests/integration/test_fleet_prometheus.py."""

from __future__ import annotations

from kcops.agent.config.kcrec import RecommendationSection
from kcops.agent.kcrec.calibration import coverage_for
from kcops.agent.kcrec.compute import Inputs, recommend
from kcops.cli.kc_fleet import Buckets, merged, model_doc
from kcops.histogram import BUCKETS, KC_TOKENS

BOUNDS = tuple(BUCKETS[KC_TOKENS])


def at(tokens: float, n: int, layers: int = 2) -> Buckets:
    """``n`` K(C) observations of ``tokens`` in each of ``layers`` layers."""
    counts = [0.0] * (len(BOUNDS) + 1)
    counts[next((i for i, b in enumerate(BOUNDS) if tokens <= b), len(BOUNDS))] = n
    return {str(i): (BOUNDS, list(counts)) for i in range(layers)}


def test_merged_adds_each_layers_buckets() -> None:
    got = merged([at(100, 30), at(100, 12), at(3000, 5)])
    assert set(got) == {"0", "1"}
    for _bounds, counts in got.values():
        assert sum(counts) == 47
        assert sorted(c for c in counts if c) == [5, 42]


def test_the_fleet_figure_is_the_live_code_on_the_sum_and_a_far_pod_is_named() -> None:
    cfg = RecommendationSection(min_samples=5)
    # c:1 sees long contexts: 2% of the fleet's calls, under the 5% a 0.95 quantile leaves
    pods = {"a:1": at(100, 1000), "b:1": at(110, 1000), "c:1": at(6000, 40)}
    doc = model_doc("m", pods, {"a:1/p": 0.9, "b:1/p": 0.9}, cfg)
    cov = coverage_for(cfg, "m", "all", None, 0.9)
    same = recommend(Inputs(merged(list(pods.values()))), cov, min_samples=5, uniform_over="auto")
    assert doc["status"] == "ok" and doc["uniform"] == same["uniform"]
    assert [r["samples"] for r in doc["layers"]] == [2040, 2040]
    rows = {r["pod"]: r for r in doc["pods"]}
    assert not rows["a:1"]["differs"] and not rows["b:1"]["differs"]
    assert rows["c:1"]["differs"] and rows["c:1"]["ratio"] > 4, rows["c:1"]


def test_probes_at_different_p_are_refused_not_summed() -> None:
    cfg = RecommendationSection(min_samples=5)
    doc = model_doc("m", {"a:1": at(100, 40), "b:1": at(100, 40)}, {"a": 0.9, "b": 0.8}, cfg)
    assert doc["status"] == "p_mismatch" and doc["uniform"] is None
    assert "different p" in doc["reason"]
