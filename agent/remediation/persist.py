"""Remediation's persistence: the state file (a snapshot of guards, ladders,
restores, replicas) saved atomically when something changed, and the status
document built from the same snapshot.

Every change is numbered (:meth:`Persist.touch`); a save records the change its
snapshot covers, so an action can wait (:meth:`Persist.durable`) until the guard state
it spent is on disk before it acts. Saves run on the state file's writer thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from kcops.agent.remediation.alertmanager import Addressed
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.guards import Guards, GuardsSummary
from kcops.agent.remediation.ladder import Ladder
from kcops.agent.remediation.records import JSONObject
from kcops.agent.remediation.remediation_state import RemediationState, RestoreState
from kcops.agent.remediation.statefile import StateFile

log = logging.getLogger("kcops.agent.actions")


class Persist:
    """The state file and whether the state changed since it was last written."""

    def __init__(self, path: Path) -> None:
        self.file: StateFile[RemediationState] = StateFile(path, RemediationState)
        self.dirty = False
        self.changes = 0  # changes so far
        self.saved = 0  # the change the file on disk includes
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []

    def touch(self) -> None:
        """Something changed: saved soon (the next save, at the latest the tick's)."""
        self.dirty = True
        self.changes += 1

    async def durable(self) -> bool:
        """Wait until every change so far is on disk; False when a save failed first."""
        target = self.changes
        if self.saved >= target:
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, fut))
        return await fut

    def _answer(self, ok: bool) -> None:
        keep = []
        for target, fut in self._waiters:
            if fut.done():
                continue
            if self.saved >= target or not ok:
                fut.set_result(self.saved >= target)
            else:
                keep.append((target, fut))
        self._waiters = keep

    @staticmethod
    def snapshot(
        guards: Guards,
        ladders: Mapping[str, Ladder],
        ended: Mapping[str, float],
        restores: Mapping[str, RestoreState],
        addressed: Addressed,
        replicas: int | None,
    ) -> RemediationState:
        return RemediationState(
            version=1,
            guards=guards.to_state(),
            ladders=dict(ladders),
            ended=dict(ended),
            restores=dict(restores),
            addressed=addressed.to_json(),
            replicas=replicas,
        )

    async def save_async(self, state: RemediationState) -> bool:
        """Write ``state`` (a snapshot taken now) on the writer thread; False when it
        failed: it stays dirty (tried again) and the waiters are answered no."""
        upto = self.changes
        self.dirty = False
        try:
            await self.file.save_async(state)
        except OSError as exc:
            self.dirty = True
            log.warning("cannot save %s: %s", self.file.path, exc.strerror or exc)
            self._answer(False)
            return False
        self.saved = max(self.saved, upto)
        self._answer(True)
        return True


class RemediationStatus(BaseModel):
    """``GET /api/v1/remediation`` and the component's status."""

    healthy: bool
    summary: str
    mode: str
    ladders: dict[str, Ladder]
    guards: GuardsSummary
    pending_restores: dict[str, RestoreState]
    pages: int
    instances_refused: int
    state_files_set_aside: int
    audit_torn_repairs: int
    # Records the disk refused (held in memory until it takes them), and dropped.
    audit_held: int = 0
    audit_dropped: int = 0
    audit_write_errors: int = 0
    audit_last_error: str | None = None

    @classmethod
    def of(
        cls,
        *,
        mode: str,
        guards: GuardsSummary,
        state: RemediationState,
        pages: int,
        instances_refused: int,
        set_aside: int,
        audit: AuditLog,
    ) -> JSONObject:
        open_breakers = guards["breakers_open"]
        return cls(
            healthy=not open_breakers,
            summary=(
                f"mode {mode}, {len(state.ladders)} ladder(s) active"
                + (f", breaker open: {', '.join(open_breakers)}" if open_breakers else "")
            ),
            mode=mode,
            ladders=state.ladders,
            guards=guards,
            pending_restores=state.restores,
            pages=pages,
            instances_refused=instances_refused,
            state_files_set_aside=set_aside,
            audit_torn_repairs=audit.torn_repairs,
            audit_held=audit.held,
            audit_dropped=audit.dropped,
            audit_write_errors=audit.write_errors,
            audit_last_error=audit.last_error,
        ).model_dump(mode="json")
