"""What a ladder started by an Alertmanager alert may run in the agent it reached.

Alertmanager hands each notification to one arbitrary agent of the fleet (the
kcops-agent Service), and the alerts aggregate across pods: pod steps run only
where the alert names this pod or instance, fleet steps only under the fleet
lease; anything else is recorded as refused with the reason. Real HTTP for the
engine (the worker's admin API stand-in) and the Kubernetes API (stand-in).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kcops.agent.outcome import ActionName

pytest.importorskip("kubernetes_asyncio", reason="pip install 'kcops[kubernetes]'")

from kcops.agent.config import parse_config
from kcops.agent.events import Step
from kcops.agent.remediation.alertmanager import (
    HERE,
    UNNAMED,
    Identity,
    addressed,
    identity_of,
    step_refusal,
    transitions,
)
from kcops.agent.remediation.remediation import Remediation
from tests.clock import ManualClock
from tests.unit.actions.fakeworker import FakeWorker
from tests.unit.actions.harness import audit, make_ctx, make_rem, settle, transition
from tests.unit.kube.apiserver import ApiServer, shipped_lease
from tests.unit.kube.test_kube_client import HPA, HPA_PATH, LEASE_PATH, NS, kube_section

POD = "llm-serving-7d9f-abcde"  # kube_section's pod_name
ME = Identity(POD, NS, frozenset({f"{POD}:9464", "10.0.0.7:9464"}), in_fleet=True)
ALONE = Identity(None, None, frozenset({"127.0.0.1:9464"}), in_fleet=False)


@pytest.mark.parametrize(
    ("labels", "me", "where"),
    [
        ({"pod": POD, "namespace": NS}, ME, HERE),
        ({"pod": POD}, ME, HERE),
        ({"pod": POD, "namespace": "other"}, ME, f"pod other/{POD}"),
        ({"pod": "llm-serving-x", "namespace": NS}, ME, f"pod {NS}/llm-serving-x"),
        ({"instance": "10.0.0.7:9464"}, ME, HERE),
        ({"instance": "10.0.0.8:9464"}, ME, "instance 10.0.0.8:9464"),
        ({"instance": "10.0.0.7:8000"}, ME, "instance 10.0.0.7:8000"),  # the engine's port
        ({"engine": "vllm", "severity": "page"}, ME, UNNAMED),
        ({"instance": "127.0.0.1:9464"}, ALONE, HERE),
    ],
)
def test_what_the_labels_name(labels: dict[str, str], me: Identity, where: str) -> None:
    assert addressed(labels, me) == where


@pytest.mark.parametrize(
    ("scope", "where", "me", "lease", "refused"),
    [
        ("pod", HERE, ME, "kubernetes", False),
        ("pod", UNNAMED, ME, "kubernetes", True),  # one of a fleet: whose pod?
        ("pod", "pod serving/x", ME, "kubernetes", True),
        ("pod", UNNAMED, ALONE, "none", False),  # the only agent there is
        ("pod", "pod serving/x", ALONE, "none", True),
        ("fleet", UNNAMED, ME, "kubernetes", False),  # under the lease
        ("fleet", UNNAMED, ME, "none", True),  # a fleet with no lease
        ("fleet", UNNAMED, ALONE, "none", False),
    ],
)
def test_step_refusal_table(
    scope: str, where: str, me: Identity, lease: str, refused: bool
) -> None:
    assert (step_refusal(scope, where, me, lease) is not None) == refused


def test_identity_from_config_and_downward_api_env() -> None:
    cfg = parse_config(
        {"agent": {"listen": "0.0.0.0:9464"}, "actions": {"restart": {"mode": "kubernetes"}}}
    )
    me = identity_of(cfg, {"POD_NAME": "p-1", "POD_NAMESPACE": "serving", "POD_IP": "10.1.2.3"})
    assert (me.pod, me.namespace, me.in_fleet) == ("p-1", "serving", True)
    assert {"10.1.2.3:9464", "p-1:9464"} <= me.instances
    assert not any(i.endswith(":8000") for i in me.instances)
    alone = identity_of(parse_config({}), {})
    assert alone.in_fleet is False


def am(name: str, labels: dict[str, str], fp: str, status: str = "firing") -> list[Any]:
    alert = {
        "status": status,
        "labels": {"alertname": name, "severity": "page", **labels},
        "annotations": {},
        "startsAt": "2026-11-30T13:00:00Z",
        "fingerprint": fp,
    }
    return transitions({"version": "4", "alerts": [alert]}, 0.0)


def deliver(rem: Remediation, events: list[Any]) -> None:
    for ev in events:
        rem.on_transition(ev)


Body = Callable[[Remediation, FakeWorker, ApiServer], Awaitable[None]]


def with_agent(tmp_path: Path, actions: Callable[[str, Path], dict[str, Any]], test: Body) -> None:
    async def main() -> None:
        token = tmp_path / "token"
        token.write_text("sa-token-1\n")
        api = ApiServer(token="sa-token-1")
        api.put(HPA_PATH, HPA)
        api.put(LEASE_PATH, shipped_lease())
        url = await api.start()
        w = FakeWorker()
        wurl = await w.start()
        ctx, _ = make_ctx(
            tmp_path / "state", wurl, ManualClock(1_796_043_700.0), **actions(url, token)
        )
        rem = await make_rem(ctx)
        try:
            await test(rem, w, api)
        finally:
            await rem.stop()
            await w.stop()
            await api.stop()

    asyncio.run(main())


def fleet(url: str, token: Path) -> dict[str, Any]:
    return {
        "mode": "enforce",
        "kubernetes": kube_section(url, token),
        "restart": {"mode": "kubernetes"},
        "scale": {"hpa": "llm-serving", "max_replicas": 6, "lease": {"backend": "kubernetes"}},
    }


def actions_of(rem: Remediation) -> list[tuple[str, str, str | None]]:
    return [(r["action"], r["outcome"], r["refusal"]) for r in audit(rem, "action")]


def test_pod_steps_of_an_alert_about_no_pod_or_another_pod_are_refused(tmp_path: Path) -> None:
    async def body(rem: Remediation, w: FakeWorker, api: ApiServer) -> None:
        # KcopsAttentionErrors: fallback_to_base, restart_worker — pod steps only
        deliver(rem, am("KcopsAttentionErrors", {"kind": "nan"}, "f1"))
        deliver(rem, am("KcopsAttentionErrors", {"pod": "llm-serving-x", "namespace": NS}, "f2"))
        await settle(rem)
        assert rem.driver.ladders == {}
        refused = [r for r in audit(rem, "alert") if r["event"] == "refused"]
        assert len(refused) == 2
        assert "names no pod" in refused[0]["detail"]
        assert f"pod {NS}/llm-serving-x, not pod {POD}" in refused[1]["detail"]
        assert actions_of(rem) == []
        assert w.calls == [] and [r.verb for r in api.requests] == []  # nothing evicted

    with_agent(tmp_path, fleet, body)


def test_fleet_steps_run_under_the_lease_and_the_pods_own_alert_takes_over(tmp_path: Path) -> None:
    async def body(rem: Remediation, w: FakeWorker, api: ApiServer) -> None:
        # KcopsP99LatencyHigh: fallback_to_base (pod), then scale_out (fleet)
        deliver(rem, am("KcopsP99LatencyHigh", {"engine": "vllm"}, "g1"))
        await settle(rem)
        runs = actions_of(rem)
        assert runs == [("fallback_to_base", "refused", "not_this_pod"), ("scale_out", "ok", None)]
        assert w.calls == []  # the engine's route was not touched
        assert api.objects[HPA_PATH]["spec"]["minReplicas"] == 4  # under the Lease
        assert ("PUT", LEASE_PATH) in [(r.verb, r.path) for r in api.requests]
        # this pod's own rule fires now: its ladder starts over here, pod step first
        steps = (
            Step(ActionName.FALLBACK_TO_BASE, {}, 120.0),
            Step(ActionName.SCALE_OUT, {}, 300.0),
        )
        rem.ctx.bus.publish(transition("KcopsP99LatencyHigh", "firing", rem.clock(), steps))
        await settle(rem)
        assert actions_of(rem)[2] == ("fallback_to_base", "ok", None)
        assert [c[1] for c in w.calls] == ["/admin/route"]
        events = [r["event"] for r in audit(rem, "ladder")]
        assert "superseded" in events
        lad = rem.driver.ladders["KcopsP99LatencyHigh"]
        assert set(lad.instances.values()) == {"alertmanager", "local"}

    with_agent(tmp_path, fleet, body)


def test_an_alert_naming_this_pod_runs_its_pod_steps(tmp_path: Path) -> None:
    async def body(rem: Remediation, w: FakeWorker, api: ApiServer) -> None:
        deliver(rem, am("KcopsAttentionErrors", {"pod": POD, "namespace": NS}, "h1"))
        await settle(rem)
        assert actions_of(rem) == [("fallback_to_base", "ok", None)]
        assert [c[1] for c in w.calls] == ["/admin/route"]

    with_agent(tmp_path, fleet, body)


def test_a_fleet_without_a_lease_refuses_fleet_steps_from_alertmanager(tmp_path: Path) -> None:
    def no_lease(url: str, token: Path) -> dict[str, Any]:
        return {
            "mode": "enforce",
            "kubernetes": kube_section(url, token),
            "restart": {"mode": "kubernetes"},
            "scale": {"hpa_reads_gauge": True},
        }

    async def body(rem: Remediation, w: FakeWorker, api: ApiServer) -> None:
        deliver(rem, am("KcopsKCSurge", {"engine": "vllm"}, "k1"))  # ladder: scale_out
        await settle(rem)
        assert rem.driver.ladders == {} and actions_of(rem) == []
        (rec,) = [r for r in audit(rem, "alert") if r["event"] == "refused"]
        assert "fleet lease" in rec["detail"]

    with_agent(tmp_path, no_lease, body)


def test_a_lone_agent_takes_an_alert_that_names_no_pod(tmp_path: Path) -> None:
    def alone(url: str, token: Path) -> dict[str, Any]:
        return {"mode": "enforce"}

    async def body(rem: Remediation, w: FakeWorker, api: ApiServer) -> None:
        deliver(rem, am("KcopsAttentionErrors", {"kind": "nan"}, "m1"))
        await settle(rem)
        assert actions_of(rem) == [("fallback_to_base", "ok", None)]
        # but not one about a pod it is not
        rem.driver.ladders.clear()
        rem.driver.ended.clear()
        deliver(rem, am("KcopsDeviceMemoryHigh", {"pod": "somewhere-else"}, "m2"))
        await settle(rem)
        assert [r["event"] for r in audit(rem, "alert")] == ["refused"]

    with_agent(tmp_path, alone, body)
