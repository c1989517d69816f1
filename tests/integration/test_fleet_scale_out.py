"""Fleet-scope scale_out: three agents sharing one real Redis, KcopsKCSurge firing on all.

Exactly one scale_out per fleet cooldown; a lease holder SIGKILLed mid-action
(a real process, stopped between taking the lease and writing) holds the
fleet back only until its lease expires, and a holder that wakes up after
losing its lease cannot write (fencing).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from kcops.agent.actions.lease_core import FleetWrite
from kcops.agent.actions.lease_redis import RedisFleet
from kcops.agent.events import Step
from kcops.agent.outcome import ActionName, ActionRejected
from tests.clock import ManualClock
from tests.services import wait_until
from tests.unit.actions.harness import audit, make_ctx, make_rem, settle, transition

REPO = Path(__file__).resolve().parents[2]
SURGE = (Step(ActionName.SCALE_OUT, {"step": 1}, 600.0),)
FLEET_COOLDOWN_S = 300.0
# Long enough that the lease of the killed holder is still there when the
# others fire right after the kill, even on a loaded machine.
LEASE_S = 8.0


def fleet_actions(redis_url: str, holder: str, lease_s: float = 30.0) -> dict[str, Any]:
    return {
        "mode": "enforce",
        # Each agent's own guard must not hide the fleet's behaviour: the fleet
        # cooldown below is what spaces scale-outs.
        "guards": {"cooldown_overrides_s": {"scale_out": 0}},
        "scale": {
            "min_replicas": 1,
            "max_replicas": 8,
            "hold_s": 3600,
            "lease": {
                "backend": "redis",
                "redis_url": redis_url,
                "holder": holder,
                "duration_s": lease_s,
                "cooldown_s": FLEET_COOLDOWN_S,
            },
        },
    }


def floor(redis_url: str) -> int:
    r = redis.Redis.from_url(redis_url)
    try:
        return int(r.hget("{kcops:fleet:kcops-fleet-scale-out}:state", "min_replicas") or 1)
    finally:
        r.close()


def scale_runs(rems: list[Any]) -> list[dict[str, Any]]:
    return [r for rem in rems for r in audit(rem, "action") if r["action"] == "scale_out"]


async def fire_all(rems: list[Any], clock: ManualClock) -> None:
    for rem in rems:
        rem.ctx.bus.publish(transition("KcopsKCSurge", "firing", clock(), SURGE))
    for rem in rems:
        await settle(rem)


async def resolve_all(rems: list[Any], clock: ManualClock) -> None:
    for rem in rems:
        rem.ctx.bus.publish(transition("KcopsKCSurge", "inactive", clock()))
    for rem in rems:
        await settle(rem)


async def stop_all(rems: list[Any]) -> None:
    for rem in rems:
        await rem.stop()


def test_one_scale_out_per_cooldown_across_three_agents(tmp_path: Path, redis_url: str) -> None:
    async def main() -> None:
        clock = ManualClock()
        rems = []
        for name in ("agent-a", "agent-b", "agent-c"):
            ctx, _ = make_ctx(tmp_path / name, None, clock, **fleet_actions(redis_url, name))
            rems.append(await make_rem(ctx))
        try:
            await fire_all(rems, clock)
            runs = scale_runs(rems)
            assert len(runs) == 3, runs
            ok = [r for r in runs if r["outcome"] == "ok"]
            assert len(ok) == 1, [(r["outcome"], r["error"]) for r in runs]
            others = [r for r in runs if r["outcome"] != "ok"]
            # another agent holds the lease (busy) or has just scaled (cooldown): both
            # are guard outcomes that pass by themselves, not refusals of the step
            assert all(r["outcome"] in ("skipped_busy", "skipped_cooldown") for r in others)
            assert all("lease" in r["error"] or "cooldown" in r["error"] for r in others)
            assert floor(redis_url) == 2
            # every agent publishes the fleet's floor it wrote or read
            assert ok[0]["after"] == {"min_replicas": 2}

            # still within the fleet cooldown: a re-fire anywhere does nothing
            await resolve_all(rems, clock)
            clock.advance(FLEET_COOLDOWN_S / 2)
            await fire_all(rems, clock)
            assert len([r for r in scale_runs(rems) if r["outcome"] == "ok"]) == 1
            assert floor(redis_url) == 2

            # past it: exactly one more across the fleet
            await resolve_all(rems, clock)
            clock.advance(FLEET_COOLDOWN_S)
            await fire_all(rems, clock)
            assert len([r for r in scale_runs(rems) if r["outcome"] == "ok"]) == 2
            assert floor(redis_url) == 3
        finally:
            await stop_all(rems)

    asyncio.run(main())


# The agent that gets killed: a real process running the real scale_out, whose fleet write
# this script (not the agent) stops between taking the lease and writing.
KILLED_AGENT = """
import asyncio, json, sys
from pathlib import Path
from kcops.agent.actions import lease_redis
from tests.clock import ManualClock
from tests.unit.actions.harness import make_ctx, make_rem, transition
from tests.integration.test_fleet_scale_out import LEASE_S, SURGE, fleet_actions

async def held(self, grant, *args, **kw):
    print(json.dumps({"paused": grant.token}), flush=True)
    await asyncio.Event().wait()

async def main():
    lease_redis.RedisFleet.write = held
    clock = ManualClock(float(sys.argv[3]))
    actions = fleet_actions(sys.argv[1], "agent-k", LEASE_S)
    ctx, _ = make_ctx(Path(sys.argv[2]), None, clock, **actions)
    rem = await make_rem(ctx)
    rem.ctx.bus.publish(transition("KcopsKCSurge", "firing", clock(), SURGE))
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_killed_holder_loses_the_lease_and_another_takes_over(
    tmp_path: Path, redis_url: str
) -> None:
    clock = ManualClock()
    lock = "{kcops:fleet:kcops-fleet-scale-out}:lock"
    r = redis.Redis.from_url(redis_url)
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def start_and_kill_holder() -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_AGENT, redis_url, str(tmp_path / "k"), str(clock())],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until the holder sits inside the action
            assert '"paused"' in line, f"killed agent did not reach the write: {line!r}"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    async def main() -> None:
        rems = []
        for name in ("agent-b", "agent-c"):
            ctx, _ = make_ctx(
                tmp_path / name, None, clock, **fleet_actions(redis_url, name, LEASE_S)
            )
            rems.append(await make_rem(ctx))
        try:
            await asyncio.to_thread(start_and_kill_holder)
            # the dead holder's lease still stands: the fleet waits, nobody acts
            assert r.get(lock) is not None and r.get(lock).startswith(b"agent-k|")  # type: ignore[union-attr]
            await fire_all(rems, clock)
            runs = scale_runs(rems)
            assert [x["outcome"] for x in runs] == ["skipped_busy", "skipped_busy"]
            assert all("held by agent-k" in x["error"] for x in runs), runs
            await resolve_all(rems, clock)
            await asyncio.to_thread(wait_until, lambda: not r.exists(lock), 60, "lease expiry")
            clock.advance(1)
            await fire_all(rems, clock)
            ok = [x for x in scale_runs(rems) if x["outcome"] == "ok"]
            assert len(ok) == 1, [(x["outcome"], x["error"]) for x in scale_runs(rems)]
            assert floor(redis_url) == 2  # one step: the dead holder never wrote
        finally:
            await stop_all(rems)

    try:
        asyncio.run(main())
    finally:
        r.close()


def test_a_holder_that_lost_its_lease_cannot_write(redis_url: str) -> None:
    """Fencing: A pauses past its lease, B takes it and writes; A's late write is refused."""

    async def main() -> None:
        a = RedisFleet(redis_url, "fence-test", 1.0, 1)
        b = RedisFleet(redis_url, "fence-test", 30.0, 1)
        try:
            ga = await a.acquire("agent-a", 100.0)
            await asyncio.to_thread(
                wait_until,
                lambda: (
                    redis.Redis.from_url(redis_url).exists("{kcops:fleet:fence-test}:lock") == 0
                ),
                30,
                "A's lease to expire",
            )
            gb = await b.acquire("agent-b", 102.0)
            assert gb.token > ga.token
            await b.write(gb, FleetWrite(2, 1, 200.0, 102.0), 300.0, 102.0)
            with pytest.raises(ActionRejected) as err:
                # bypass A's own clock check: the store itself must refuse
                object.__setattr__(ga, "taken_mono", time.monotonic())
                await a.write(ga, FleetWrite(2, 1, 200.0, 102.0), 300.0, 102.5)
            assert err.value.reason == "fenced"
            assert (await b.read()).fence == gb.token
            await b.release(gb)
            # an older token is refused even with the lock free and taken again by it
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


def test_scopes() -> None:
    from kcops.agent.actions.registry import builtin_actions

    scopes = {s.name: s.scope for s in builtin_actions().specs()}
    assert scopes.pop("scale_out") == "fleet"
    assert set(scopes.values()) == {"pod"}
    assert builtin_actions().get("scale_out").describe()["scope"] == "fleet"


@pytest.mark.slow
def test_one_scale_out_across_three_agents_on_a_redis_cluster(tmp_path: Path) -> None:
    """The fleet lock on a three-master Redis Cluster: each agent is pointed at a
    different master, so two of them reach the lock's slot only through the
    cluster client (a plain client would get MOVED there)."""
    from redis.cluster import RedisCluster
    from redis.crc import key_slot

    from tests.redis_cluster import redis_cluster

    tag = "{kcops:fleet:kcops-fleet-scale-out}"
    with redis_cluster(tmp_path / "cluster") as c:
        masters = c.masters()
        rc = RedisCluster.from_url(c.url())
        owner = rc.get_node_from_key(tag + ":lock").port
        assert key_slot((tag + ":state").encode()) == key_slot((tag + ":lock").encode())
        assert sum(1 for p in masters if p != owner) == 2

        async def main() -> None:
            clock = ManualClock()
            rems = []
            for name, port in zip(("agent-a", "agent-b", "agent-c"), masters, strict=True):
                actions = fleet_actions(c.url(port), name)
                ctx, _ = make_ctx(tmp_path / name, None, clock, **actions)
                rems.append(await make_rem(ctx))
            try:
                await fire_all(rems, clock)
                runs = scale_runs(rems)
                assert len(runs) == 3
                ok = [r for r in runs if r["outcome"] == "ok"]
                assert len(ok) == 1, [(r["outcome"], r["error"]) for r in runs]
                assert all(r["outcome"] in ("ok", "skipped_busy", "skipped_cooldown") for r in runs)
                assert int(rc.hget(tag + ":state", "min_replicas")) == 2
            finally:
                await stop_all(rems)

        try:
            asyncio.run(main())
        finally:
            rc.close()
