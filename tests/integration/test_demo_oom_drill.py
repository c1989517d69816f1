"""The OOM drill end to end on the tiny model: a kernel OOM kill the agent counts and acts on.

The worker runs in a real memory cgroup; the drill allocates past its limit, the
kernel's OOM killer ends it, and the agent (evidence: the cgroup's ``oom_kill``
count) fires ``KcopsEngineOOM``, respawns the worker and runs its ladder's first
step. Skipped where this machine gives no writable memory cgroup.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kcops.demo.drills import DEMO_PARAMS, run_drill, select
from kcops.demo.env import DemoEnv


@pytest.mark.slow
def test_oom_drill(tmp_path: Path) -> None:
    with DemoEnv(tmp_path, "tiny", DEMO_PARAMS) as env:
        env.make_cgroup()
        if env.cgroup is None:
            pytest.skip(f"no writable memory cgroup: {env.no_cgroup_reason}")
        env.start_agent(None)
        env.limit_device()
        first = env.first_pid
        (drill,) = select("KcopsEngineOOM")
        res = run_drill(env, drill)
        # The ladder's first step (lower_topn) may meet the worker still dead or
        # respawning and fail; the ladder then climbs to restart_worker.
        assert res.fired and res.action in ("lower_topn", "restart_worker"), (
            f"{res.note}\nthe agent's log:\n{env.log_tail('agent.log')}"
        )
        assert env.cgroup.oom_kills() == 1
        assert env.first_pid != first  # the supervisor respawned it
        assert env.query("max(kcops_engine_oom_total)") == 1.0
        exits = env.query("max(kcops_engine_restarts_total)")
        assert exits is not None and exits >= 1
