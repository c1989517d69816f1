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
from kcops.agent.actions.lease_core import FleetWrite
from kcops.agent.actions.lease_kube import ANN, KubeFleet
from kcops.agent.actions.scale_out import release_hold
from kcops.agent.config import parse_config
from kcops.agent.config.actions import KubernetesSection
from kcops.agent.outcome import ActionRejected
from tests.clock import ManualClock
from tests.unit.actions.harness import audit, make_ctx, make_rem
from tests.unit.kube.apiserver import ApiServer, shipped_lease

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
        api.put(LEASE_PATH, shipped_lease())  # deploy/ ships it: the Role has no create
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
            await rem.stop()
        calls = [(r.verb, r.path) for r in api.requests]
        assert calls == [
            ("GET", HPA_PATH),  # the last fence the HPA recorded
            ("GET", LEASE_PATH),
            ("PUT", LEASE_PATH),
            ("GET", HPA_PATH),
            ("GET", HPA_PATH),
            ("PATCH", HPA_PATH),
            ("GET", LEASE_PATH),
            ("PUT", LEASE_PATH),
        ]
        taken = api.requests[2].body
        assert taken["spec"]["holderIdentity"] == "pod-a"
        assert taken["spec"]["leaseTransitions"] == 1
        patch = api.requests[5]
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
        # a plain DELETE of a pod is not granted: it would skip the disruption budget
        pod_path = f"/api/v1/namespaces/{NS}/pods/llm-serving-7d9f-abcde"
        api.put(pod_path, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})
        kube = KubeClient(cfg)
        try:
            with pytest.raises(ActionRejected) as err:
                await kube.call(
                    "delete pod",
                    kube.apis().core.delete_namespaced_pod,
                    "llm-serving-7d9f-abcde",
                    NS,
                )
            assert err.value.reason == "forbidden"
        finally:
            await kube.close()
        assert pod_path in api.objects

    with_server(tmp_path, body)


POD = "llm-serving-7d9f-abcde"
POD_PATH = f"/api/v1/namespaces/{NS}/pods/{POD}"


def restart_actions(url: str, token: Path) -> dict[str, Any]:
    return {
        "mode": "enforce",
        "kubernetes": kube_section(url, token),
        "restart": {"mode": "kubernetes"},
    }


def test_restart_worker_evicts_its_own_pod_and_honours_the_budget(tmp_path: Path) -> None:
    """restart_worker goes through the Eviction API: 429 (the budget allows no
    disruption, another pod is down) is a refusal that passes, retried later."""

    async def body(api: ApiServer, url: str, token: Path) -> None:
        api.put(POD_PATH, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD}})
        api.evictions_allowed = False
        ctx, _ = make_ctx(tmp_path / "a", None, ManualClock(), **restart_actions(url, token))
        rem = await make_rem(ctx)
        try:
            run = rem.runner.submit("restart_worker", {})
            await run.task  # type: ignore[misc]
            assert run.outcome == "skipped_busy", (run.outcome, run.error)
            assert "disruption" in (run.error or "")
            assert POD_PATH in api.objects
            evictions = [r for r in api.requests if r.path == POD_PATH + "/eviction"]
            assert [r.verb for r in evictions] == ["POST"]
            assert evictions[0].body["metadata"] == {"name": POD, "namespace": NS}
            # no cooldown was spent: once the budget allows it, the same step runs
            api.evictions_allowed = True
            run = rem.runner.submit("restart_worker", {})
            await run.task  # type: ignore[misc]
            assert run.outcome == "ok", run.error
            assert POD_PATH not in api.objects
            assert run.result is not None and run.result.data == {"namespace": NS, "pod": POD}
        finally:
            await rem.stop()
        assert "DELETE" not in {r.verb for r in api.requests}

    with_server(tmp_path, body)


def test_a_recreated_lease_starts_above_the_hpa_fence(tmp_path: Path) -> None:
    """The Lease deleted and applied again (leaseTransitions back to nothing) while
    the HPA recorded fence N: the next token is N + 1, and its write goes through."""

    async def body(api: ApiServer, url: str, token: Path) -> None:
        cfg = KubernetesSection.model_validate(kube_section(url, token))
        a = KubeFleet(KubeClient(cfg), "kcops-fleet-scale-out", "llm-serving", 15)
        try:
            for t in (1000.0, 1100.0, 1200.0):  # three writes: the HPA records fence 3
                g = await a.acquire("pod-a", t)
                await a.read()
                await a.write(g, FleetWrite(2, 1, t + 600, t), 0.0, t)
                await a.release(g)
            ann = api.objects[HPA_PATH]["metadata"]["annotations"]
            assert ann[ANN + "fence"] == "3"
            # an operator deletes the Lease and re-applies deploy/
            del api.objects[LEASE_PATH]
            api.put(LEASE_PATH, shipped_lease())
            g = await a.acquire("pod-b", 1300.0)
            assert g.token == 4
            await a.read()
            await a.write(g, FleetWrite(3, 1, 1900.0, 1300.0), 0.0, 1300.0)
            assert api.objects[HPA_PATH]["metadata"]["annotations"][ANN + "fence"] == "4"
            assert api.objects[LEASE_PATH]["spec"]["leaseTransitions"] == 4
            # deleted and not applied again: the shipped Role cannot create it
            del api.objects[LEASE_PATH]
            with pytest.raises(ActionRejected) as err:
                await a.acquire("pod-b", 1400.0)
            assert err.value.reason == "forbidden" and "lease.yaml" in str(err.value)
            # a Role that may create it (outside deploy/): created above the fence too
            api.rules.append(
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}
            )
            g = await a.acquire("pod-c", 1500.0)
            assert g.token == 5
            assert api.objects[LEASE_PATH]["spec"]["leaseTransitions"] == 5
        finally:
            await a.close()

    with_server(tmp_path, body)


def test_lease_times_are_micro_times_even_on_a_whole_second(tmp_path: Path) -> None:
    """datetime.isoformat() drops a zero fraction, which the API server refuses."""

    async def body(api: ApiServer, url: str, token: Path) -> None:
        cfg = KubernetesSection.model_validate(kube_section(url, token))
        a = KubeFleet(KubeClient(cfg), "kcops-fleet-scale-out", "llm-serving", 15)
        try:
            g = await a.acquire("pod-a", 1_800_000_000.0)  # a whole second
            await a.release(g)
        finally:
            await a.close()
        puts = [r.body["spec"] for r in api.requests if r.verb == "PUT"]
        assert len(puts) == 2
        assert puts[0]["renewTime"] == "2027-01-15T08:00:00.000000Z"
        assert puts[1]["acquireTime"] == puts[0]["acquireTime"]

    with_server(tmp_path, body)


def test_the_floor_never_goes_above_the_hpa_max(tmp_path: Path) -> None:
    async def body(api: ApiServer, url: str, token: Path) -> None:
        hpa = api.objects[HPA_PATH]
        hpa["spec"]["maxReplicas"] = 4
        ctx, _ = make_ctx(tmp_path / "a", None, ManualClock(), **fleet_actions(url, token, "a"))
        rem = await make_rem(ctx)
        try:
            run = rem.runner.submit("scale_out", {"step": 3})  # 3 running + 3 > the HPA's 4
            await run.task  # type: ignore[misc]
            assert run.outcome == "ok", run.error
            assert api.objects[HPA_PATH]["spec"]["minReplicas"] == 4
            clock = ctx.clock
            assert isinstance(clock, ManualClock)
            clock.advance(400)  # past the fleet cooldown, still inside the hold
            run = rem.runner.submit("scale_out", {"step": 1})
            await run.task  # type: ignore[misc]
            assert run.outcome == "refused" and "HPA's maxReplicas 4" in (run.error or "")
        finally:
            await rem.stop()

    with_server(tmp_path, body)


def test_any_agent_ends_the_hold_after_the_one_that_raised_it_is_gone(tmp_path: Path) -> None:
    """The hold's end is in the HPA: the agent that raised the floor is stopped
    (restarted, evicted), and another agent's tick puts the floor back."""

    async def body(api: ApiServer, url: str, token: Path) -> None:
        clock = ManualClock()
        ctx_a, _ = make_ctx(tmp_path / "a", None, clock, **fleet_actions(url, token, "pod-a"))
        rem_a = await make_rem(ctx_a)
        try:
            run = rem_a.runner.submit("scale_out", {"step": 1})
            await run.task  # type: ignore[misc]
            assert run.outcome == "ok", run.error
        finally:
            await rem_a.stop()  # pod-a is gone; nothing of it keeps a timer
        assert api.objects[HPA_PATH]["spec"]["minReplicas"] == 4

        ctx_b, _ = make_ctx(tmp_path / "b", None, clock, **fleet_actions(url, token, "pod-b"))
        rem_b = await make_rem(ctx_b)
        try:
            n = len(api.requests)
            await rem_b.tick(clock())  # inside the hold: one read, no lease taken
            await rem_b.holds.task  # type: ignore[misc]
            assert [(r.verb, r.path) for r in api.requests[n:]] == [("GET", HPA_PATH)]
            assert api.objects[HPA_PATH]["spec"]["minReplicas"] == 4
            clock.advance(601)
            await rem_b.tick(clock())
            await rem_b.holds.task  # type: ignore[misc]
            hpa = api.objects[HPA_PATH]
            assert hpa["spec"]["minReplicas"] == 1
            assert ANN + "hold-until" not in hpa["metadata"]["annotations"]
            assert hpa["metadata"]["annotations"][ANN + "scaled-by"] == "pod-b"
            assert await rem_b.audit.sync()  # the log's writer thread wrote it
            released = [r for r in audit(rem_b, "fleet") if r["event"] == "hold_released"]
            assert [r["min_replicas"] for r in released] == [1]
            # checked every RELEASE_CHECK_S, not every tick
            n = len(api.requests)
            await rem_b.tick(clock() + 1)
            assert len(api.requests) == n
        finally:
            await rem_b.stop()

    with_server(tmp_path, body)
