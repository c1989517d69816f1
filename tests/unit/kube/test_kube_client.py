"""kcops's Kubernetes calls through kubernetes_asyncio's real request path, against
a stand-in API server (tests/unit/kube/apiserver.py) that enforces the shipped
Role, resourceVersion preconditions and the bearer token."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes_asyncio", reason="pip install 'kcops[kubernetes]'")

from kcops.agent.actions.kube import KubeClient
from kcops.agent.actions.lease import ANN, FleetWrite, KubeFleet
from kcops.agent.actions.scale_out import release_hold
from kcops.agent.clock import ManualClock
from kcops.agent.config import parse_config
from kcops.agent.config.actions import KubernetesSection
from kcops.errors import ActionRejected
from tests.unit.actions.harness import make_ctx, make_rem
from tests.unit.kube.apiserver import ApiServer

NS = "serving"
HPA_PATH = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/llm-serving"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/kcops-fleet-scale-out"
HPA = {
    "apiVersion": "autoscaling/v2",
    "kind": "HorizontalPodAutoscaler",
    "metadata": {
        "name": "llm-serving",
        "namespace": NS,
        "uid": "0b6c3e4e-5f1a-4a8e-9d52-3f3c1f0e2a11",
        "creationTimestamp": "2026-11-30T10:00:00Z",
    },
    "spec": {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm-serving"},
        "minReplicas": 1,
        "maxReplicas": 8,
    },
    "status": {"currentReplicas": 3, "desiredReplicas": 3},
}


def kube_section(url: str, token_file: Path) -> dict[str, Any]:
    return {
        "api_url": url,
        "token_file": str(token_file),
        "ca_file": None,
        "namespace": NS,
        "pod_name": "llm-serving-7d9f-abcde",
    }


def with_server(tmp_path: Path, test: Callable[[ApiServer, str, Path], Awaitable[None]]) -> None:
    async def main() -> None:
        token = tmp_path / "token"
        token.write_text("sa-token-1\n")
        api = ApiServer(token="sa-token-1")
        api.put(HPA_PATH, HPA)
        url = await api.start()
        try:
            await test(api, url, token)
        finally:
            await api.stop()

    asyncio.run(main())


def fleet_actions(url: str, token: Path, holder: str) -> dict[str, Any]:
    return {
        "mode": "enforce",
        "kubernetes": kube_section(url, token),
        "scale": {
            "hpa": "llm-serving",
            "max_replicas": 6,
            "hold_s": 600,
            "lease": {"backend": "kubernetes", "holder": holder, "cooldown_s": 300},
        },
    }


def test_scale_out_raises_the_hpa_floor_under_a_lease(tmp_path: Path) -> None:
    async def body(api: ApiServer, url: str, token: Path) -> None:
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path / "a", None, clock, **fleet_actions(url, token, "pod-a"))
        rem = await make_rem(ctx)
        try:
            run = rem.runner.submit("scale_out", {"step": 1})
            await run.task  # type: ignore[misc]
            assert run.outcome == "ok", run.error
        finally:
            for t in list(rem.replicas.tasks):
                t.cancel()
            await rem.stop()
        calls = [(r.verb, r.path) for r in api.requests]
        assert calls == [
            ("GET", LEASE_PATH),
            ("POST", LEASE_PATH.rsplit("/", 1)[0]),
            ("GET", HPA_PATH),
            ("GET", HPA_PATH),
            ("PATCH", HPA_PATH),
            ("GET", LEASE_PATH),
            ("PUT", LEASE_PATH),
        ]
        created = api.requests[1].body
        assert created["spec"]["holderIdentity"] == "pod-a"
        assert created["spec"]["leaseTransitions"] == 1
        patch = api.requests[4]
        assert patch.content_type in (
            "application/strategic-merge-patch+json",
            "application/merge-patch+json",
        )
        # fenced by the resourceVersion it read; never touches replicas
        assert patch.body["metadata"]["resourceVersion"]
        assert patch.body["spec"] == {"minReplicas": 4}  # 3 running + 1
        hpa = api.objects[HPA_PATH]
        assert hpa["spec"]["minReplicas"] == 4 and hpa["spec"]["maxReplicas"] == 8
        ann = hpa["metadata"]["annotations"]
        assert ann[ANN + "base-min-replicas"] == "1" and ann[ANN + "scaled-by"] == "pod-a"
        assert api.objects[LEASE_PATH]["spec"].get("holderIdentity") is None  # released

        # another pod's agent, within the fleet cooldown: refused, nothing written
        ctx_b, _ = make_ctx(tmp_path / "b", None, clock, **fleet_actions(url, token, "pod-b"))
        rem_b = await make_rem(ctx_b)
        try:
            n = len(api.requests)
            run = rem_b.runner.submit("scale_out", {"step": 1})
            await run.task  # type: ignore[misc]
            assert run.outcome == "skipped_cooldown" and "cooldown" in (run.error or "")
            assert "PATCH" not in [r.verb for r in api.requests[n:]]
        finally:
            await rem_b.stop()

        # after the hold, the floor goes back
        cfg = parse_config({"actions": fleet_actions(url, token, "pod-b")})
        assert await release_hold(cfg, clock() + 10) is None  # hold not over yet
        assert await release_hold(cfg, clock() + 601) == 1
        hpa = api.objects[HPA_PATH]
        assert hpa["spec"]["minReplicas"] == 1
        assert ANN + "base-min-replicas" not in hpa["metadata"]["annotations"]

    with_server(tmp_path, body)


def test_a_stale_lease_holder_is_fenced(tmp_path: Path) -> None:
    async def body(api: ApiServer, url: str, token: Path) -> None:
        cfg = KubernetesSection.model_validate(kube_section(url, token))
        a = KubeFleet(KubeClient(cfg), "kcops-fleet-scale-out", "llm-serving", 15)
        b = KubeFleet(KubeClient(cfg), "kcops-fleet-scale-out", "llm-serving", 15)
        try:
            ga = await a.acquire("pod-a", 1000.0)
            with pytest.raises(ActionRejected) as busy:
                await b.acquire("pod-b", 1001.0)
            assert busy.value.reason == "busy"
            # pod-a stops renewing; 15 s later its lease has expired
            gb = await b.acquire("pod-b", 1016.0)
            assert gb.token == ga.token + 1
            await b.read()
            await b.write(gb, FleetWrite(4, 1, 2000.0, 1016.0), 300.0, 1016.0)
            await a.read()
            with pytest.raises(ActionRejected) as fenced:
                await a.write(ga, FleetWrite(4, 1, 2000.0, 1017.0), 300.0, 1017.0)
            assert fenced.value.reason == "fenced"
            assert api.objects[HPA_PATH]["metadata"]["annotations"][ANN + "fence"] == "2"
        finally:
            await a.close()
            await b.close()

    with_server(tmp_path, body)


def test_concurrent_hpa_write_gets_409_and_is_fenced(tmp_path: Path) -> None:
    """A patch carrying a resourceVersion someone else has moved past is refused (409)."""

    async def body(api: ApiServer, url: str, token: Path) -> None:
        cfg = KubernetesSection.model_validate(kube_section(url, token))
        a = KubeFleet(KubeClient(cfg), "kcops-fleet-scale-out", "llm-serving", 15)
        try:
            await a.read()
            stale = api.objects[HPA_PATH]["metadata"]["resourceVersion"]
            api.put(HPA_PATH, api.objects[HPA_PATH])  # another writer got in between
            with pytest.raises(ActionRejected) as err:
                await a._write(
                    "patch hpa",
                    a.kube.apis().autoscaling.patch_namespaced_horizontal_pod_autoscaler,
                    "llm-serving",
                    NS,
                    {"metadata": {"resourceVersion": stale}, "spec": {"minReplicas": 5}},
                    conflict="fenced",
                )
            assert err.value.reason == "fenced"
        finally:
            await a.close()
        assert api.objects[HPA_PATH]["spec"]["minReplicas"] == 1

    with_server(tmp_path, body)


def test_rotated_token_is_picked_up(tmp_path: Path) -> None:
    async def body(api: ApiServer, url: str, token: Path) -> None:
        cfg = KubernetesSection.model_validate(kube_section(url, token))
        kube = KubeClient(cfg)
        fleet = KubeFleet(kube, "kcops-fleet-scale-out", "llm-serving", 15)
        try:
            await fleet.read()
            # the kubelet rotates the projected token; the old one is refused from now on
            token.write_text("sa-token-2-longer\n")
            api.token = "sa-token-2-longer"
            await fleet.read()
            assert [r.token for r in api.requests] == [
                "Bearer sa-token-1",
                "Bearer sa-token-2-longer",
            ]
        finally:
            await kube.close()

    with_server(tmp_path, body)


def test_the_role_allows_nothing_else(tmp_path: Path) -> None:
    async def body(api: ApiServer, url: str, token: Path) -> None:
        cfg = KubernetesSection.model_validate(kube_section(url, token))
        other = KubeFleet(KubeClient(cfg), "kcops-fleet-scale-out", "another-hpa", 15)
        try:
            with pytest.raises(ActionRejected) as err:
                await other.read()
            assert err.value.reason == "forbidden" and "another-hpa" in str(err.value)
        finally:
            await other.close()
        # its own pod: allowed by the Role (the admission policy narrows it in-cluster)
        pod_path = f"/api/v1/namespaces/{NS}/pods/llm-serving-7d9f-abcde"
        api.put(pod_path, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})
        out = await KubeClient(cfg).delete_own_pod()
        assert out == {"namespace": NS, "pod": "llm-serving-7d9f-abcde"}
        assert pod_path not in api.objects
        assert api.requests[-1].verb == "DELETE"

    with_server(tmp_path, body)
