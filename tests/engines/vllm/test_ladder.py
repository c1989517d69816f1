"""A ladder whose first step vLLM cannot do (fallback_to_base: vLLM has no route control)
moves on to the next step at once (the same tick), spends no cooldown or budget on the
refused step (the agent's guard state shows the cooldown of the step that ran and none of
the refused one), and the audit log says why."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from tests.engines.vllm.harness import AUTH, POLL_S, TOKEN, Stack, agent_cmd, process
from tests.services import free_port, wait_until

pytestmark = pytest.mark.vllm

RULES = {
    "groups": [
        {
            "name": "vllm-suite",
            "rules": [
                {
                    # true whenever the engine answers: the ladder starts at once
                    "alert": "VllmSuiteLadder",
                    "expr": "kcops_engine_up > 0",
                    "for": "0s",
                    "labels": {"severity": "ticket"},
                    "remediation": [
                        {"action": "fallback_to_base", "verify": "10m"},
                        {"action": "evict_cache", "params": {"policy": "all"}, "verify": "10m"},
                    ],
                }
            ],
        }
    ]
}


def _audit(state: Path, kind: str) -> list[dict]:
    import json

    path = state / "audit.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("kind") == kind]


def test_refused_first_step_moves_on_without_cooldown(after_soak: Stack, tmp_path: Path) -> None:
    stack = after_soak
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(RULES))
    aport = free_port()
    agent = f"http://127.0.0.1:{aport}"
    state = tmp_path / "state"
    # a second agent beside the engine (not supervising it), with its own probe socket
    cmd = agent_cmd(aport, state, stack.engine_url, "--rules", str(tmp_path / "rules.yaml"))
    env = {"KCOPS_TOKEN": TOKEN, "KCOPS_PROBE_SOCKET": str(tmp_path / "p.sock")}
    log = tmp_path / "agent.log"
    with process(cmd, log, env, stop_s=20):

        def evicted() -> list[dict]:
            return [a for a in _audit(state, "action") if a["action"] == "evict_cache"]

        wait_until(
            evicted,
            120,
            "the ladder's second step",
            lambda: log.read_text()[-3000:],
            interval_s=POLL_S,
        )
        actions = _audit(state, "action")
        first = [a for a in actions if a["action"] == "fallback_to_base"]
        assert [a["outcome"] for a in first] == ["refused"], actions
        why = " ".join(str(first[0].get(k) or "") for k in ("error", "reason")).lower()
        assert "route" in why, first[0]
        assert evicted()[0]["outcome"] == "ok", evicted()
        # the ladder records the refused step as skipped, with the reason, and moves on
        skipped = [x for x in _audit(state, "ladder") if x["event"] == "skipped"]
        assert skipped and "fallback_to_base" in skipped[0].get("why", ""), _audit(state, "ladder")
        assert "route" in skipped[0]["why"].lower(), skipped[0]
        # the next step ran at once: in the same tick, not after the refused step's verify
        assert evicted()[0]["ts"] == first[0]["ts"], (first[0], evicted()[0])
        # no cooldown or budget was spent on the refused step, while the step that ran has
        # its cooldown: the agent's own guard state says so
        guards = httpx.get(f"{agent}/api/v1/actions", timeout=10).json()["guards"]
        assert "evict_cache|engine" in guards["cooldowns"], guards
        assert not any(k.startswith("fallback_to_base") for k in guards["cooldowns"]), guards
        assert guards["runs_last_hour"] == 1, guards
        # asked again, the ran step is held back by its cooldown; the refused one is refused
        # for its reason (route), never for a cooldown
        again = httpx.post(
            f"{agent}/api/v1/actions/evict_cache",
            json={"params": {"policy": "all"}},
            headers=AUTH,
            timeout=30,
        )
        assert again.json()["outcome"] == "skipped_cooldown", again.json()
        r = httpx.post(
            f"{agent}/api/v1/actions/fallback_to_base", json={}, headers=AUTH, timeout=30
        )
        assert (r.json()["outcome"], r.json()["refusal"]) == ("refused", "unsupported"), r.json()
        assert "route" in r.json()["error"], r.json()
