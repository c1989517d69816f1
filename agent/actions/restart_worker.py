"""``restart_worker``: restart the engine, in the one way configured.

- ``supervisor`` (``auto`` when the agent launched the engine): graceful
  drain, SIGTERM, SIGKILL, respawn — see :mod:`kcops.agent.supervisor`;
- ``signal``: SIGTERM the engine pid (shared process namespace), SIGKILL
  after the grace period; whoever owns the process restarts it;
- ``kubernetes``: delete the own pod through the API.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kcops.agent.actions.base import ActionContext, ActionResult, ActionSpec, NoParams
from kcops.agent.actions.kube import KubeClient
from kcops.agent.errors import ActionRejected

if TYPE_CHECKING:
    from kcops.agent.config import Config


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _signal_restart(ctx: ActionContext) -> ActionResult:
    pid = engine_pid(ctx)
    if pid is None:
        raise ActionRejected(
            "restart mode signal needs engine.pid or engine.pidfile", "unsupported"
        )
    grace = ctx.config.actions.restart.grace_s
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    killed = False
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        killed = True
    return ActionResult(
        detail=f"signalled pid {pid}" + (" (SIGKILL after grace)" if killed else ""),
        before={"pid": pid},
        after={"pid": None},
    )


def not_while_starting(config: Config, services: Mapping[str, Any], now: float) -> None:
    """A supervised engine that has not been healthy since its start is loading, not hung."""
    sup = services.get("supervisor")
    if sup is None or config.actions.restart.mode not in ("auto", "supervisor"):
        return
    if sup.starting(now):
        raise ActionRejected(
            "the engine is still starting (not healthy since it was started, within "
            f"actions.restart.startup_grace_s={config.actions.restart.startup_grace_s:g})",
            "starting",
        )


async def restart_worker(ctx: ActionContext, p: NoParams) -> ActionResult:
    mode = ctx.config.actions.restart.mode
    supervisor = ctx.services.get("supervisor")
    if mode == "auto":
        if supervisor is None:
            raise ActionRejected(
                "restart_worker: the agent does not supervise the engine; set "
                "actions.restart.mode to signal or kubernetes",
                "unsupported",
            )
        mode = "supervisor"
    if mode == "off":
        raise ActionRejected("restart_worker: actions.restart.mode is off", "unsupported")
    if mode == "supervisor":
        if supervisor is None:
            raise ActionRejected(
                "restart mode supervisor, but no engine command (--)", "unsupported"
            )
        out = await supervisor.restart(reason="restart_worker")
        return ActionResult(
            detail=out.get("detail", "restarted"), before=out["before"], after=out["after"]
        )
    if mode == "signal":
        return await _signal_restart(ctx)
    info = await KubeClient(ctx.config.actions.kubernetes).delete_own_pod()
    return ActionResult(detail=f"deleted pod {info['namespace']}/{info['pod']}", data=info)


SPEC = ActionSpec(
    "restart_worker",
    restart_worker,
    NoParams,
    "Restart the engine: drain, SIGTERM, SIGKILL, respawn (supervised), or signal/delete pod.",
    precheck=not_while_starting,
)
