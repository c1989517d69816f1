"""deploy/'s generated objects match their generators, and Prometheus accepts them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kcops.cli.dashboards import SIDECAR_LABEL, dashboard_files
from kcops.cli.deploy_export import render_generated
from tests.services import need_binary
from tests.unit.deploy.conftest import OVERLAYS, REPO, find


def test_committed_output_matches_generators() -> None:
    for path, text in render_generated().items():
        committed = (REPO / path).read_text()
        assert committed == text, f"{path} drifted from its generator: run `make deploy-gen`"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dashboard_configmaps_hold_exactly_the_built_files(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    maps = [
        d
        for d in rendered[overlay]
        if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get(SIDECAR_LABEL) == "1"
    ]
    got = {k: v for m in maps for k, v in m["data"].items()}
    assert got == dashboard_files()


def _promtool_check(tmp_path: Path, groups: list[dict[str, Any]]) -> None:
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    res = subprocess.run(
        [need_binary("promtool"), "check", "rules", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_prometheusrule_groups_pass_promtool(
    tmp_path: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    rule = find(rendered["vllm"], "PrometheusRule")
    groups = rule["spec"]["groups"]
    assert any(r.get("alert") == "KcopsKCSurge" for g in groups for r in g["rules"])
    _promtool_check(tmp_path, groups)


def test_adapter_queries_are_valid_promql(
    tmp_path: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """Each metricsQuery, with the adapter's templates filled in as it fills them."""
    cm = find(rendered["vllm"], "ConfigMap", "kcops-prometheus-adapter-rules")
    rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    hpa = find(rendered["vllm"], "HorizontalPodAutoscaler", "llm-serving")
    served = {r["name"]["as"] for r in rules}
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert wanted <= served, f"HPA metrics {wanted - served} have no adapter rule"
    exprs = []
    for r in rules:
        series = r["seriesQuery"].split("{", 1)[0].strip("'")
        q = (
            r["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", 'namespace="serving",pod=~"llm-serving-.*"')
            .replace("<<.GroupBy>>", "pod")
        )
        exprs.append({"record": f"adapter:{r['name']['as']}", "expr": q})
    _promtool_check(tmp_path, [{"name": "adapter", "rules": exprs}])


def _quantity(q: str | int | float) -> float:
    """A Kubernetes quantity as a number (the forms the HPA uses: plain or milli)."""
    text = str(q)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def test_hpa_kc_target_is_the_alert_rules_surge_ratio(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The HPA scales on the same "K(C) up 50%" as KcopsKCSurge fires on, over the
    same windows: changing one without the other fails here."""
    params = yaml.safe_load((REPO / "alerts" / "rules.yaml").read_text())["params"]
    ratio = float(params["kc_surge_ratio"])
    for overlay in OVERLAYS:
        hpa = find(rendered[overlay], "HorizontalPodAutoscaler", "llm-serving")
        targets = {
            m["pods"]["metric"]["name"]: _quantity(m["pods"]["target"]["averageValue"])
            for m in hpa["spec"]["metrics"]
        }
        assert targets["kcops_kc_surge_ratio"] == ratio
        rule = find(rendered[overlay], "PrometheusRule")
        surge = next(
            r
            for g in rule["spec"]["groups"]
            for r in g["rules"]
            if r.get("alert") == "KcopsKCSurge"
        )
        assert f">= {ratio:g} * (" in surge["expr"]
        cm = find(rendered[overlay], "ConfigMap", "kcops-prometheus-adapter-rules")
        rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
        q = next(r["metricsQuery"] for r in rules if r["name"]["as"] == "kcops_kc_surge_ratio")
        assert f"[{params['rate_window']}]" in q and f"[{params['baseline_window']}]" in q
