"""The serving pod's security and wiring (docs/architecture.md#processes-and-data-flow)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.conftest import OVERLAYS, find


def _containers(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = dep["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"] + spec.get("initContainers", [])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_sidecar(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    dep = find(rendered[overlay], "Deployment", "llm-serving")
    pod = dep["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    cs = _containers(dep)
    agent = cs["kcops-agent"]
    sc = agent["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"]
    # CAP_SYS_PTRACE for py-spy's file capability, in the agent container only (docs/deploy.md,
    # "Stacks of a hung engine"): a file capability needs no_new_privs off, nothing else does
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert sc["allowPrivilegeEscalation"] is True
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert agent["resources"]["requests"] and agent["resources"]["limits"]["memory"]
    # the probe socket lives on a volume both containers mount
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in vols["kcops-run"]
    for name in ("engine", "kcops-agent"):
        mounts = {m["name"]: m["mountPath"] for m in cs[name]["volumeMounts"]}
        assert mounts["kcops-run"] == "/run/kcops"
    # The engine's readiness is the agent's verdict (a stall takes it out of rotation);
    # no liveness probe on it: the agent (restart mode kubernetes) is the one restarter.
    ready = cs["engine"]["readinessProbe"]["httpGet"]
    assert ready == {"path": "/api/v1/engine/ready", "port": 9464}
    assert "livenessProbe" not in cs["engine"]
    engine_env = {e["name"]: e.get("value") for e in cs["engine"].get("env", [])}
    assert engine_env["KCOPS_PROBE_SOCKET"] == "/run/kcops/probe.sock"
    # the API token reaches the agent only; the control token comes from a Secret
    assert "kube-api-access" not in {m["name"] for m in cs["engine"]["volumeMounts"]}
    assert vols["kcops-token"]["secret"]["secretName"] == "kcops-token"


def _effective(pod: dict[str, Any], c: dict[str, Any], field: str) -> Any:
    return c.get("securityContext", {}).get(field, pod["securityContext"].get(field))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_engine_and_agent_run_as_different_users_sharing_only_a_group(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """With one UID and a shared process namespace the engine could open
    /proc/<agent pid>/root and read the agent's tokens; another UID cannot."""
    dep = find(rendered[overlay], "Deployment", "llm-serving")
    pod = dep["spec"]["template"]["spec"]
    cs = _containers(dep)
    agent_uid = _effective(pod, cs["kcops-agent"], "runAsUser")
    for name, c in cs.items():
        uid = _effective(pod, c, "runAsUser")
        assert isinstance(uid, int) and uid > 0, f"{name} runs as {uid}"
        if name == "kcops-agent":
            continue  # its one capability, for py-spy: test_agent_sidecar
        assert uid != agent_uid, f"{name} shares the agent's UID {uid}"
        caps = c.get("securityContext", {}).get("capabilities", {})
        assert caps.get("drop") == ["ALL"] and not caps.get("add"), f"{name}: {caps}"
        assert c["securityContext"].get("allowPrivilegeEscalation") is False, name
    # one group for the probe socket, and the agent makes it group-writable
    group = _effective(pod, cs["kcops-agent"], "runAsGroup")
    assert group == _effective(pod, cs["engine"], "runAsGroup") == pod["securityContext"]["fsGroup"]
    agent = cs["kcops-agent"]
    assert agent["command"] == ["/bin/sh", "-c"]
    assert agent["args"][0].startswith("umask 0007 && exec kcops agent run ")
    # no token file is world-readable
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["kcops-token"]["secret"]["defaultMode"] & 0o007 == 0
    assert vols["kube-api-access"]["projected"]["defaultMode"] & 0o007 == 0


def test_vllm_engine_gets_the_plugin_from_the_init_container(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    dep = find(rendered["vllm"], "Deployment", "llm-serving")
    cs = _containers(dep)
    init = cs["kcops-install"]
    assert init["image"] == cs["kcops-agent"]["image"], "probe and agent from one release"
    target = init["command"][-1]
    env = {e["name"]: e.get("value") for e in cs["engine"]["env"]}
    assert env["PYTHONPATH"] == target
    assert {m["mountPath"] for m in cs["engine"]["volumeMounts"]} >= {target}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_admits_only_prometheus_and_alertmanager_to_the_agent(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    pol = find(rendered[overlay], "NetworkPolicy")
    agent_rules = [
        r for r in pol["spec"]["ingress"] if {"port": 9464, "protocol": "TCP"} in r["ports"]
    ]
    assert len(agent_rules) == 1
    peers = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in agent_rules[0]["from"]
    }
    assert peers == {"prometheus", "alertmanager"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_is_narrow(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered[overlay]
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role = find(docs, "Role", "kcops-agent")
    grants = set()
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        for res in rule["resources"]:
            for verb in rule["verbs"]:
                grants.add((res, verb, tuple(rule.get("resourceNames", ()))))
    # exactly these: a named Lease and HPA, evictions, and container logs (no create of
    # Leases, which RBAC cannot name; no pod delete, which would skip the disruption budget)
    assert grants == {
        ("leases", "get", ("kcops-fleet-scale-out",)),
        ("leases", "update", ("kcops-fleet-scale-out",)),
        ("horizontalpodautoscalers", "get", ("llm-serving",)),
        ("horizontalpodautoscalers", "patch", ("llm-serving",)),
        ("pods/eviction", "create", ()),
        ("pods/log", "get", ()),
    }
    lease = find(docs, "Lease", "kcops-fleet-scale-out")
    assert "spec" not in lease, "a re-apply must not reset what the agents wrote"
    hpa = find(docs, "HorizontalPodAutoscaler", "llm-serving")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "llm-serving"
    pdb = find(docs, "PodDisruptionBudget", "llm-serving")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # cluster-scoped objects are not in a namespaced overlay
    assert not [d for d in docs if d["kind"].startswith("ValidatingAdmission")]


def test_admission_policy_limits_evictions_to_the_agents_own_pod(
    cluster_scoped: list[dict[str, Any]],
) -> None:
    policy = find(cluster_scoped, "ValidatingAdmissionPolicy")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {"operations": ["CREATE"], "resources": ["pods/eviction"]}.items() <= rules[0].items()
    expr = policy["spec"]["validations"][0]["expression"]
    assert "authentication.kubernetes.io/pod-name" in expr and "request.name" in expr
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = find(cluster_scoped, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert all("namespace" not in d["metadata"] for d in cluster_scoped)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_config_is_valid(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    import yaml

    from kcops.agent.config import parse_config

    cm = next(
        d
        for d in rendered[overlay]
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("kcops-agent-")
    )
    cfg = parse_config(yaml.safe_load(cm["data"]["agent.yaml"]), f"{overlay} agent.yaml")
    assert cfg.actions.scale.hpa == "llm-serving"
    assert cfg.actions.scale.lease.backend == "kubernetes"
    assert cfg.engine.adapter == {"vllm": "vllm", "kcops-worker": "kcops"}[overlay]
    # the store fills to its budget: it must fit in the container with the rest
    # (idle RSS ~100 MiB with the Kubernetes client, docs/benchmarks.md)
    dep = find(rendered[overlay], "Deployment", "llm-serving")
    limit = _containers(dep)["kcops-agent"]["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    assert cfg.store.max_bytes * 1.25 + (128 << 20) <= int(limit[:-2]) << 20
    # the Role names exactly the objects the agent is configured to touch
    role = find(rendered[overlay], "Role", "kcops-agent")
    names = {n for r in role["rules"] for n in r.get("resourceNames", [])}
    assert {cfg.actions.scale.hpa, cfg.actions.scale.lease.name} <= names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_alertmanager_routes_kcops_alerts_to_the_agent_webhook(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[overlay]
    amc = find(docs, "AlertmanagerConfig")
    hook = amc["spec"]["receivers"][0]["webhookConfigs"][0]
    svc = find(docs, "Service", "kcops-agent")
    ns = svc["metadata"]["namespace"]
    assert ns == "serving"
    # Alertmanager runs in namespace monitoring: a short name would resolve there
    port = svc["spec"]["ports"][0]["port"]
    assert hook["url"] == f"http://kcops-agent.{ns}.svc:{port}/api/v1/alertmanager"
    # every namespaced object lands in the same namespace as the Service
    assert {d["metadata"].get("namespace") for d in docs} == {ns}
    # alerts still arrive while every engine (hence every pod's readiness) is down
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert hook["httpConfig"]["authorization"]["credentials"]["name"] == "kcops-token"
    # every alert the PrometheusRule defines matches the route
    import re

    rule = find(docs, "PrometheusRule")
    matcher = amc["spec"]["route"]["matchers"][0]
    names = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert names and all(re.fullmatch(matcher["value"], n) for n in names)
