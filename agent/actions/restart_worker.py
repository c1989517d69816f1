"""``restart_worker``: restart the engine, in the one way configured.

- ``supervisor`` (``auto`` when the agent launched the engine): drain, SIGTERM,
  SIGKILL, respawn (:mod:`kcops.agent.engine.supervisor`);
- ``signal``: SIGTERM the engine pid (shared process namespace), SIGKILL after
  ``grace_s`` plus the engine's own drain time; whoever owns the process
  restarts it, and the engine is ``starting`` again (no ``KcopsEngineDown``);
- ``kubernetes``: evict the own pod through the Eviction API (honouring the
  PodDisruptionBudget); its ``terminationGracePeriodSeconds`` must then cover
  vLLM's ``--shutdown-timeout``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from kcops.agent.actions.base import (
    ActionContext,
    ActionResult,
    ActionSpec,
    Check,
    JSONObject,
    NoParams,
    Params,
    kube_token,
)
from kcops.agent.actions.kube import KubeClient
from kcops.agent.engine import lifecycle as lc
from kcops.agent.engine import proctree
from kcops.agent.engine.shutdown import engine_drain_s
from kcops.agent.outcome import ActionName, ActionRejected, Refusal


def engine_pid(ctx: ActionContext) -> int | None:
    eng = ctx.config.engine
    if eng.pid:
        return eng.pid
    if eng.pidfile:
        try:
            return int(eng.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
    return None


async def _signal_restart(ctx: ActionContext) -> ActionResult:
    pid = engine_pid(ctx)
    if pid is None:
        raise ActionRejected(
            "restart mode signal needs engine.pid or engine.pidfile", Refusal.UNSUPPORTED
        )
    n = engine_drain_s(proctree.cmdline(pid), proctree.pgid_of(pid))
    grace = ctx.config.actions.restart.grace_s + n
    t0 = time.monotonic()
    ctx.engine.draining = "restart_worker (signal)"
    ctx.engine.observe(lc.Restarting(ctx.now))
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = t0 + grace
        while proctree.alive(pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        killed = False
        if proctree.alive(pid):
            os.kill(pid, signal.SIGKILL)
            killed = True
        # Whoever owns the process starts it again: from now on the engine is loading, so
        # KcopsEngineDown does not count and no action is taken at it until it is ready.
        ctx.engine.observe(lc.Spawned(ctx.now + (time.monotonic() - t0)))
    finally:
        ctx.engine.draining = None
    return ActionResult(
        detail=f"signalled pid {pid}" + (" (SIGKILL after grace)" if killed else ""),
        before={"pid": pid},
        after={"pid": None},
        data={"killed": killed, "grace_s": grace, "engine_drain_s": n},
    )


def _mode(check: Check) -> str:
    mode = check.config.actions.restart.mode
    if mode == "auto":
        if check.supervisor is None:
            raise ActionRejected(
                "restart_worker: the agent does not supervise the engine; set "
                "actions.restart.mode to signal or kubernetes",
                Refusal.NOT_CONFIGURED,
            )
        return "supervisor"
    if mode == "off":
        raise ActionRejected("restart_worker: actions.restart.mode is off", Refusal.NOT_CONFIGURED)
    if mode == "supervisor" and check.supervisor is None:
        raise ActionRejected(
            "restart mode supervisor, but no engine command (--)", Refusal.NO_TARGET
        )
    if mode == "signal" and not (check.config.engine.pid or check.config.engine.pidfile):
        raise ActionRejected(
            "restart mode signal needs engine.pid or engine.pidfile", Refusal.NOT_CONFIGURED
        )
    if mode == "kubernetes":
        kube_token(check, "restart_worker (mode kubernetes)")
    return mode


def applicable(check: Check, _: Params) -> None:
    """Refuse before any guard: no way to restart, the supervisor owns the next start, or
    the engine is still loading (a load looks like a hang)."""
    if _mode(check) != "supervisor" or check.supervisor is None:
        return
    why = check.supervisor.backing_off()
    if why is not None:
        # One owner of restarts: a ladder never respawns what the supervisor respawns.
        raise ActionRejected(f"restart_worker: {why}", Refusal.SUPERVISOR_OWNS)
    if check.supervisor.starting(check.now):
        raise ActionRejected(
            "the engine is still starting (not healthy since it was started, within "
            f"actions.restart.startup_grace_s={check.config.actions.restart.startup_grace_s:g})",
            Refusal.STARTING,
        )


async def restart_worker(ctx: ActionContext, p: NoParams) -> ActionResult:
    mode = _mode(Check(ctx.config, ctx.engine, ctx.supervisor, ctx.now))
    # The engine's stacks and last words before any signal (bounded by the capture budget).
    keeper = ctx.engine.incidents
    incident = await keeper.keep(ActionName.RESTART_WORKER, ctx.now) if keeper else None
    result = await _restart(ctx, mode)
    if incident is not None:
        result.data["incident"] = incident
        result.detail = f"{result.detail}; evidence in incident {incident}"
    return result


async def _restart(ctx: ActionContext, mode: str) -> ActionResult:
    if mode == "supervisor":
        assert ctx.supervisor is not None
        drain, evidence = _verdict(ctx)
        out = await ctx.supervisor.restart(reason=ActionName.RESTART_WORKER, drain=drain)
        data: JSONObject = {k: out[k] for k in ("drain", "killed", "shm_removed") if k in out}
        data["engine"] = evidence
        return ActionResult(
            detail=_why(out.get("detail", "restarted"), evidence),
            before=out["before"],
            after=out["after"],
            data=data,
        )
    if mode == "signal":
        return await _signal_restart(ctx)
    info = await KubeClient(ctx.config.actions.kubernetes).evict_own_pod()
    return ActionResult(detail=f"evicted pod {info['namespace']}/{info['pod']}", data=dict(info))


# -- the lifecycle's verdict (stall watch): drain or not, and the evidence ---------------


def _verdict(ctx: ActionContext) -> tuple[bool, JSONObject]:
    """A stalled or hung engine cannot drain: kill its tree at once. Else keep the drain."""
    evidence = ctx.engine.evidence()
    return ctx.engine.state not in (lc.EngineState.STALLED, lc.EngineState.HUNG), evidence


def _why(detail: object, ev: JSONObject) -> str:
    """The audit detail: what was killed and why (stalled N s, M pending, the canary)."""
    text = str(detail)
    if ev.get("state") in ("stalled", "hung"):
        text += f"; engine {ev['state']}"
        if ev.get("stalled_s") is not None:
            pending = ev.get("pending")
            n = f"{pending:g}" if isinstance(pending, float) else str(pending)
            text += f" for {ev['stalled_s']}s with {n} requests pending"
        canary = ev.get("canary")
        if isinstance(canary, dict):
            text += f", canary {canary.get('outcome')} after {canary.get('duration_s')}s"
    return text


SPEC = ActionSpec(
    ActionName.RESTART_WORKER,
    restart_worker,
    NoParams,
    "Restart the engine: drain, SIGTERM, SIGKILL, respawn (supervised), or signal/evict pod.",
    precheck=applicable,
)
