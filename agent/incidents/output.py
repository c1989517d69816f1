"""The engine's last output lines: the supervisor's ring, or (a sidecar) the engine
container's log through the Kubernetes API where the pod's RBAC allows it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kcops.agent.config import Config

if TYPE_CHECKING:
    from kcops.agent.engine.supervisor import Supervisor

TAIL_LINES = 200
# The access log of the agent's own polls (health, metrics, admin state) drowns the
# engine's last words: left out, and counted.
POLLS = re.compile(r'"GET /(health|metrics|admin/state|v1/models|ready)[ ?]')


def _words(lines: list[str]) -> list[str]:
    kept = [ln for ln in lines if not POLLS.search(ln)]
    dropped = len(lines) - len(kept)
    note = [f"# {dropped} access-log lines of the agent's own polls left out"] if dropped else []
    return note + kept[-TAIL_LINES:]


def engine_output(
    cfg: Config, supervisor: Supervisor | None
) -> Callable[[float], Awaitable[list[str]]]:
    async def lines(budget_s: float) -> list[str]:
        ring = getattr(supervisor, "output", None)
        if ring is not None:
            return _words(list(ring.lines()))
        if cfg.actions.restart.mode != "kubernetes":
            return ["# not captured: the agent does not supervise the engine, and "
                    "actions.restart.mode is not kubernetes (no pod log to read)"]  # fmt: skip
        try:
            return await asyncio.wait_for(_pod_log(cfg), budget_s)
        except TimeoutError:
            return [f"# not captured: the pod log did not come within {budget_s:g}s"]

    return lines


async def _pod_log(cfg: Config) -> list[str]:
    from kcops.agent.actions.kube import KubeClient, KubeError
    from kcops.agent.outcome import ActionRejected

    kube = cfg.actions.kubernetes
    try:
        async with KubeClient(kube) as client:
            return _words(await client.container_log(kube.engine_container, 4 * TAIL_LINES))
    except KubeError as exc:
        why = "RBAC does not allow pods/log" if exc.status == 403 else "the API refused it"
        return [f"# not captured: {why} (HTTP {exc.status}): {exc}"[:300]]
    except ActionRejected as exc:
        return [f"# not captured: {exc}"[:300]]
