"""Every rendered object validates against a current Kubernetes release's schema
(kubernetes-validate, strict: unknown fields are errors) or the Prometheus
Operator's CRD models (cloudcoil-models-prometheus-operator, compared after a
round trip so an unknown field, which the models would drop, is an error too)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.conftest import OVERLAYS

kv = pytest.importorskip("kubernetes_validate", reason="pip install kcops[deploy]")
operator_v1 = pytest.importorskip(
    "cloudcoil.models.prometheus_operator.v1", reason="pip install kcops[deploy]"
)
operator_v1alpha1 = pytest.importorskip(
    "cloudcoil.models.prometheus_operator.v1alpha1", reason="pip install kcops[deploy]"
)

OPERATOR_GROUP = "monitoring.coreos.com/"


def _prune(value: Any) -> Any:
    """Drop None and empty containers, as a manifest would not carry them."""
    if isinstance(value, dict):
        out = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def validate_operator(doc: dict[str, Any]) -> None:
    module = {"v1": operator_v1, "v1alpha1": operator_v1alpha1}[doc["apiVersion"].split("/")[1]]
    model = getattr(module, doc["kind"], None)
    assert model is not None, f"{doc['apiVersion']} {doc['kind']}: no Prometheus Operator model"
    obj = model.model_validate(doc)
    back = _prune(obj.model_dump(mode="json", by_alias=True, exclude_none=True))
    assert back == _prune(doc), f"{doc['kind']} {doc['metadata']['name']}: fields lost"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    version = kv.latest_version()
    kinds = set()
    for doc in rendered[overlay]:
        kinds.add(doc["kind"])
        if doc["apiVersion"].startswith(OPERATOR_GROUP):
            validate_operator(doc)
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} (Kubernetes {version}): {exc}")
    assert {
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodMonitor",
        "PrometheusRule",
        "AlertmanagerConfig",
    } <= kinds


def test_cluster_scoped_objects_validate(cluster_scoped: list[dict[str, Any]]) -> None:
    version = kv.latest_version()
    assert {d["kind"] for d in cluster_scoped} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for doc in cluster_scoped:
        kv.validate(doc, version, strict=True)


def test_validators_catch_a_bad_object(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The checks above can fail: a misspelt field is caught by both validators."""
    import copy

    dep = copy.deepcopy(next(d for d in rendered["vllm"] if d["kind"] == "Deployment"))
    dep["spec"]["template"]["spec"]["shareProcessNamspace"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, kv.latest_version(), strict=True)
    mon = copy.deepcopy(next(d for d in rendered["vllm"] if d["kind"] == "PodMonitor"))
    mon["spec"]["podMetricsEndpoint"] = mon["spec"].pop("podMetricsEndpoints")
    with pytest.raises(AssertionError):
        validate_operator(mon)
