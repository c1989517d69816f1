"""The incident record of a real vLLM's stall (issue 38).

The hang: kcops' plugin's test-only fault (conftest ``hang_file``) holds vLLM's
engine core inside its own Python code (``kcops_test_hang`` in the wrapped
``execute_model``, in the process that runs the model: the EngineCore, or its
``VLLM::Worker`` under the multiprocessing executor, as here) with a streaming request
in flight. The shipped KcopsEngineStalled
pages, the incident opens, its capture takes every process's stacks, then
``restart_worker`` kills the tree. After it: one incident, whose record names the
EngineCore and the frame where it hung, the API server's process too, the engine's last
output, the timeline (the page, the restart), the inhibited Down/StartSlow joined to it;
``kcops incident show`` says the same.

The stopped core: SIGSTOP, and the cgroup freezer. Such a process cannot be paused by
ptrace: the capture must still end within its budget and say what it could read.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engines.vllm.harness import (
    AUTH,
    HEALTH_TIMEOUT_S,
    MAX_MODEL_LEN,
    POLL_S,
    TOKEN,
    Stack,
    StreamResult,
    Watch,
    stream_completion,
)
from tests.engines.vllm.test_stall import (
    PROMPT,
    answers,
    engine_core_pid,
    firing,
    ready_status,
    restart_cooldown_s,
    restarts,
    stopped,
)
from tests.freezer import freezer, frozen
from tests.services import kcops_bin, wait_until

pytestmark = pytest.mark.vllm

# The alerts the agent's own restart causes: inhibited, they join the stall's incident.
RESTART_ALERTS = ("KcopsEngineDown", "KcopsEngineStartSlow")
CLOSE_WITHIN_S = 180.0  # after serving again: alerts resolve, then the record's settle time


def incidents(stack: Stack) -> list[dict[str, Any]]:
    r = httpx.get(f"{stack.agent_url}/api/v1/incidents", headers=AUTH, timeout=10)
    r.raise_for_status()
    return list(r.json()["incidents"])


def record(stack: Stack, incident_id: str) -> dict[str, Any]:
    r = httpx.get(f"{stack.agent_url}/api/v1/incidents/{incident_id}", headers=AUTH, timeout=10)
    r.raise_for_status()
    return dict(r.json())


def new_incidents(stack: Stack, known: set[str]) -> list[dict[str, Any]]:
    return [i for i in incidents(stack) if i["id"] not in known]


def none_open(stack: Stack) -> bool:
    """No incident open: a stall now opens its own."""
    return not any(i["status"] == "open" for i in incidents(stack))


def closed(stack: Stack, incident_id: str) -> dict[str, Any] | None:
    rec = record(stack, incident_id)
    return rec if rec["status"] != "open" else None


def of_role(rec: dict[str, Any], needle: str) -> list[dict[str, Any]]:
    return [
        p
        for p in rec["processes"]
        if needle in str(p.get("role")) or needle in str(p.get("cmdline"))
    ]


def frames(proc: dict[str, Any]) -> list[str]:
    stacks = proc.get("stacks") or {}
    return [str(f.get("name")) for t in stacks.get("threads") or [] for f in t.get("frames") or []]


def settled(stack: Stack, *, restartable: bool) -> set[str]:
    """Wait for an engine serving, with no incident open (and, ``restartable``, that the
    guards allow restarting); return the incidents kept so far."""
    if restartable:
        # test_stall.py restarted this engine minutes ago: the 5-minute cooldown would
        # (rightly) refuse restart_worker, and the test needs the restart.
        wait_until(lambda: restart_cooldown_s(stack) == 0.0, 330,
                   "restart_worker's cooldown over", stack.log_tail, interval_s=5.0)  # fmt: skip
    wait_until(lambda: answers(stack), HEALTH_TIMEOUT_S, "vLLM serving", stack.log_tail)
    wait_until(lambda: ready_status(stack) == 200, 300, "readiness 200", stack.log_tail)
    wait_until(lambda: none_open(stack), CLOSE_WITHIN_S, "no incident open", stack.log_tail,
               interval_s=1.0)  # fmt: skip
    return {i["id"] for i in incidents(stack)}


def in_flight(stack: Stack) -> StreamResult:
    """A long streaming request, decoding: vLLM has published it running, so the stall has
    pending work to see."""
    req = stream_completion(stack.engine_url, PROMPT, MAX_MODEL_LEN - 64)
    assert req.first_chunk.wait(120) and req.error is None, req.error
    return req


def test_hung_engine_core_leaves_one_incident_naming_where_it_hung(
    quiet: Stack, hang_file: Path
) -> None:
    stack = quiet
    known = settled(stack, restartable=True)
    before = len(restarts(stack))
    watch = Watch(stack.agent_url)
    watch.start()
    req = in_flight(stack)
    wall0 = time.time()
    try:
        hang_file.touch()  # the next step of the EngineCore waits in kcops_test_hang
        wait_until(lambda: "KcopsEngineStalled" in firing(stack), 120,
                   "KcopsEngineStalled firing", stack.log_tail, interval_s=POLL_S)  # fmt: skip
        wait_until(lambda: len(restarts(stack)) > before, 300, "restart_worker recorded",
                   stack.log_tail, interval_s=POLL_S)  # fmt: skip
    finally:
        hang_file.unlink(missing_ok=True)  # the new engine must not hang too
    run = restarts(stack)[before]
    assert run["outcome"] == "ok" and "SIGKILL at once, no drain" in run["detail"], run
    wait_until(lambda: answers(stack), HEALTH_TIMEOUT_S, "a completion from the new vLLM",
               stack.log_tail, interval_s=1.0)  # fmt: skip
    inc = wait_until(lambda: new_incidents(stack, known), 30, "the incident", stack.log_tail)[0]
    rec = wait_until(lambda: closed(stack, inc["id"]), CLOSE_WITHIN_S, "the incident closed",
                     stack.log_tail, interval_s=1.0)  # fmt: skip
    watch.stop()
    assert req.done.wait(60) and req.error is not None, "the hung request was not ended"
    # One incident for the stall: nothing else opened one.
    assert [i["id"] for i in new_incidents(stack, known)] == [inc["id"]]
    assert rec["status"] == "closed" and rec["trigger"] == "KcopsEngineStalled", rec["trigger"]
    assert run["result"].get("incident") == inc["id"], run["result"]
    cap = rec["capture"]
    assert cap is not None and cap["seconds"] <= cap["budget_s"] + 0.5, cap
    # Where it hung: the frame of the fault, in the process that runs the model (the
    # EngineCore itself, or its VLLM::Worker child under vLLM's multiprocessing executor,
    # as on this CPU backend: the EngineCore then waits on it).
    roles = [(p["pid"], p["role"], p["cmdline"][:60], len(frames(p))) for p in rec["processes"]]
    hung = [p for p in rec["processes"] if "kcops_test_hang" in frames(p)]
    assert len(hung) == 1, roles
    assert any(n in hung[0]["cmdline"] for n in ("EngineCore", "VLLM::Worker")), hung[0]
    # The EngineCore and the API server, each with stacks of its own.
    (core,) = of_role(rec, "EngineCore")
    assert frames(core), core
    assert any(p["role"] == "API server" and frames(p) for p in rec["processes"]), roles
    assert rec["output"], "no engine output lines in the record"
    assert rec["series_bytes"] > 0
    # The timeline: the page, the capture, the restart that followed it.
    tl = rec["timeline"]
    assert any(e.get("alertname") == "KcopsEngineStalled" and e.get("state") == "firing"
               for e in tl), tl  # fmt: skip
    assert any(e.get("action") == "restart_worker" and e.get("outcome") == "ok" for e in tl), tl
    # The alerts the restart caused joined this incident, inhibited (none opened its own).
    alerts = {a["alertname"]: a for a in rec["alerts"]}
    for name in RESTART_ALERTS:
        if name in watch.firing:
            assert name in alerts, (name, rec["alerts"])
            assert alerts[name]["inhibited_by"] == "KcopsEngineRestarting", alerts[name]
    # What on-call runs (the page names it): the process, the frame, the API server.
    shown = show(stack, inc["id"])
    assert "EngineCore" in shown and "kcops_test_hang" in shown and "API server" in shown, shown
    print(
        f"\nvLLM hang: incident {inc['id']} after {inc['opened_at'] - wall0:.1f}s, capture "
        f"{cap['seconds']:.2f}s of {cap['budget_s']:g}s, alerts "
        f"{sorted((a['alertname'], a['state']) for a in rec['alerts'])}\n{shown}"
    )


def show(stack: Stack, incident_id: str) -> str:
    done = subprocess.run(
        [kcops_bin(), "incident", "show", incident_id, "--agent", stack.agent_url],
        capture_output=True, text=True, timeout=60, env={**os.environ, "KCOPS_TOKEN": TOKEN},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


# -- stopped and frozen ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["SIGSTOP", "freezer"])
def test_stopped_engine_core_is_captured_within_the_budget(quiet: Stack, how: str) -> None:
    """The capture of a core that cannot run: it ends within its budget and the record
    says what it read (the process, stopped or frozen, and its stacks or why not). The
    engine is resumed once the capture is in; the restart follows if its cooldown allows
    (the hang test's restart, minutes ago, usually does not: not what is tested here)."""
    stack = quiet
    fz = freezer() if how == "freezer" else None  # skipped here when the host has none
    known = settled(stack, restartable=False)
    core = engine_core_pid(stack)
    req = in_flight(stack)
    stop = stopped(core) if fz is None else frozen(fz, core)
    wall0 = time.time()
    with stop:
        inc = wait_until(lambda: new_incidents(stack, known), 120, "an incident",
                         stack.log_tail, interval_s=POLL_S)[0]  # fmt: skip
        rec = wait_until(lambda: (r := record(stack, inc["id"]))["processes"] and r, 60,
                         "the incident's capture", stack.log_tail, interval_s=POLL_S)  # fmt: skip
    req.stop.set()
    wait_until(lambda: answers(stack), HEALTH_TIMEOUT_S, "vLLM serving again", stack.log_tail,
               interval_s=1.0)  # fmt: skip
    wait_until(lambda: closed(stack, inc["id"]), CLOSE_WITHIN_S, "the incident closed",
               stack.log_tail, interval_s=1.0)  # fmt: skip
    assert [i["id"] for i in new_incidents(stack, known)] == [inc["id"]]
    cap = rec["capture"]
    assert cap is not None and cap["seconds"] <= cap["budget_s"] + 0.5, cap
    assert inc["opened_at"] >= wall0 - 1, (inc, wall0)
    (proc,) = [p for p in rec["processes"] if p["pid"] == core]
    assert proc["frozen"] is True or proc["state"] == "T", proc
    stacks = proc["stacks"]
    assert frames(proc) or stacks["error"], stacks
    if not cap["complete"]:
        assert cap["missing"], cap  # what it could not read, said
    print(
        f"\nvLLM core {how}: incident {inc['id']}, capture {cap['seconds']:.2f}s of "
        f"{cap['budget_s']:g}s, state {proc['state']} frozen {proc['frozen']}, "
        f"{len(stacks.get('threads') or [])} threads read, error {stacks['error']!r}, "
        f"missing {cap['missing']}"
    )
