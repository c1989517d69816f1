"""Kill the agent (SIGKILL) mid-ladder, start it again: the ladder resumes where
it was, and no step is repeated inside its cooldown."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.test_remediation_e2e import AUTH, TOKEN, Stack, traffic
from tests.services import free_port, kcops_bin, running, wait_http

pytestmark = pytest.mark.slow


def test_sigkill_mid_ladder_resumes(tmp_path: Path, redis_url: str) -> None:
    pytest.importorskip("kcops.cli.serve")
    wport, aport = free_port(), free_port()
    worker, agent = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{aport}"
    rules = {
        "groups": [
            {
                "name": "e2e",
                "rules": [
                    {
                        "alert": "KcopsAttentionErrors",
                        "expr": "sum(increase(kcops_attention_errors_total[30s])) > 0",
                        "remediation": [
                            {"action": "fallback_to_base", "verify": "15s"},
                            {"action": "lower_topn", "verify": "5m"},
                        ],
                    }
                ],
            }
        ]
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    cfg = {
        "agent": {"tick_s": 0.5},
        "engine": {"url": worker, "adapter": "kcops"},
        "actions": {"mode": "enforce", "guards": {"cooldown_s": 600}},
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
    env = {"KCOPS_TOKEN": TOKEN, "KCOPS_PROBE_SOCKET": str(tmp_path / "probe.sock")}
    state = tmp_path / "state"
    agent_cmd = [
        kcops_bin(), "agent", "run", "--config", str(tmp_path / "agent.yaml"),
        "--listen", f"127.0.0.1:{aport}", "--state-dir", str(state),
        "--rules", str(tmp_path / "rules.yaml"),
    ]  # fmt: skip
    worker_cmd = [kcops_bin(), "serve", "--model", "tiny", "--port", str(wport),
                  "--enable-faults", "--threads", "1"]  # fmt: skip
    log = tmp_path / "agent.log"
    s = Stack(agent, worker, state, log, redis_url)
    with running(worker_cmd, log_path=tmp_path / "worker.log", env=env) as wp:
        wait_http(f"{worker}/health", 120, wp)
        top_n = httpx.get(f"{worker}/admin/state").json()["top_n"]
        with traffic(worker):
            with running(agent_cmd, log_path=log, env=env) as ap:
                wait_http(f"{agent}/readyz", 60, ap)
                r = httpx.post(f"{worker}/admin/faults", json={"nan": True}, headers=AUTH)
                assert r.status_code == 200
                s.until(lambda: s.runs("fallback_to_base", "ok"), 60, "step 1")
                os.killpg(ap.pid, signal.SIGKILL)  # no clean shutdown
                ap.wait(10)
            assert s.state_of_worker()["route_mode"] == "fallback"
            with running(agent_cmd, log_path=log, env=env) as ap2:
                wait_http(f"{agent}/readyz", 60, ap2)
                s.until(
                    lambda: [x for x in s.audit("ladder") if x["event"] == "resumed"],
                    10,
                    "the ladder to resume",
                )
                # A manual run of step 1 inside the persisted cooldown is refused.
                r = httpx.post(f"{agent}/api/v1/actions/fallback_to_base", json={}, headers=AUTH)
                assert r.status_code == 409 and r.json()["outcome"] == "skipped_cooldown"
                s.until(lambda: s.runs("lower_topn", "ok"), 60, "step 2")
        assert [x["outcome"] for x in s.runs("fallback_to_base")] == ["ok", "skipped_cooldown"]
        assert s.state_of_worker()["top_n"] == top_n - 16
        events = [x["event"] for x in s.audit("ladder")]
        assert events[:3] == ["started", "resumed", "climb"], events
