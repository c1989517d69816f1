"""The remediation component: wires alert intake, the ladder driver, restores,
paging, metrics and persistence, runs them each tick, and answers the control API.

Alerts come from the event bus alone (the local rule engine and the Alertmanager
webhook); the :class:`~.driver.LadderDriver` keeps one ladder per alert name, so
one incident never runs twice. Each job is its own module; this one builds and
orders them, and is the one face the routes see (:class:`~.routes.RemediationAPI`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from kcops.agent.actions.base import Registry, Replicas, SupervisorHandle
from kcops.agent.actions.registry import builtin_actions
from kcops.agent.actions.scale_out import HoldKeeper
from kcops.agent.component import AgentContext
from kcops.agent.engine import Engine
from kcops.agent.events import AlertTransition
from kcops.agent.outcome import ActionName, Outcome
from kcops.agent.remediation.alertmanager import (
    OVER_CAP,
    TRUNCATED,
    Addressed,
    BadPayload,
    dropped_samples,
    identity_of,
    parse_webhook,
)
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.auditread import interrupted_runs, read_audit
from kcops.agent.remediation.driver import LadderDriver
from kcops.agent.remediation.guards import Guards
from kcops.agent.remediation.intake import Alert, AlertState
from kcops.agent.remediation.paging import Pager
from kcops.agent.remediation.persist import Persist, RemediationStatus
from kcops.agent.remediation.publish import samples
from kcops.agent.remediation.records import FleetRecord, JSONObject, Trigger
from kcops.agent.remediation.remediation_state import RemediationState
from kcops.agent.remediation.restore import Restores
from kcops.agent.remediation.routes import STATUS_OF, Answer, RunActionBody, build_routes
from kcops.agent.remediation.runner import Run, Runner

if TYPE_CHECKING:
    from kcops.agent.rules.loader import RuleSet

__all__ = ["Remediation"]

log = logging.getLogger("kcops.agent.actions")

STATE_FILE = "remediation-state.json"
AUDIT_FILE = "audit.jsonl"


class Remediation:
    name = "remediation"

    def __init__(
        self,
        ctx: AgentContext,
        registry: Registry | None = None,
        *,
        engine: Engine,
        supervisor: SupervisorHandle | None = None,
        ruleset: RuleSet | None,
    ) -> None:
        """``ruleset``: the loaded rule set whose ladders cluster alerts climb (None: none)."""
        self.ctx = ctx
        self.config = cfg = ctx.config
        self.clock = ctx.clock
        self.registry = registry or builtin_actions()
        self.audit = AuditLog(Path(ctx.state_dir) / AUDIT_FILE)
        self.persist = Persist(Path(ctx.state_dir) / STATE_FILE)
        self.state_file = self.persist.file
        self.guards = Guards(cfg.actions.guards)
        self.replicas = Replicas()
        # Any agent of the fleet ends an expired scale_out hold (docs/deploy.md).
        self.holds = HoldKeeper(cfg, self._hold_released)
        self.engine = engine
        self.supervisor = supervisor
        self.runner = Runner(
            cfg, self.registry, self.guards, self.audit, self.engine, ctx.tracer, ctx.clock,
            replicas=self.replicas, supervisor=supervisor, store=ctx.store,
            on_change=self._mark_dirty, on_breaker=self._breaker_opened,
            durable=self.persist.durable,
        )  # fmt: skip
        self.pager = Pager(cfg.actions.notify, self.audit, ctx.clock)
        self.pager.incident = lambda: engine.incidents.current() if engine.incidents else None
        self.alert_state = AlertState(ruleset)
        self.restorer = Restores(self.runner, self.persist.touch)
        # Which pod each Alertmanager alert is about: a ladder it started runs its
        # pod steps only here if it names this pod (alertmanager.step_refusal).
        self.addressed = Addressed(identity_of(cfg))
        self.driver = LadderDriver(
            cfg, self.registry, self.runner, self.audit, self.alert_state, self.addressed,
            self.pager, self.restorer, self.persist.touch, ctx.clock,
        )  # fmt: skip
        self.webhook = cfg.actions.alertmanager_webhook
        self._subscribed = False
        self._saving: asyncio.Task[None] | None = None
        # Webhook alerts not taken, by reason (kcops_webhook_alerts_dropped_total).
        self.webhook_dropped: dict[str, int] = {}

    # -- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        now = self.clock()
        state = self.persist.file.read() or RemediationState()
        try:
            self._load(state, now)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            # Validated, yet not rebuildable (a model that lets through what the
            # code cannot take): the same as a corrupt file, never a failed start.
            self.persist.file.set_aside(f"cannot be rebuilt ({type(exc).__name__}: {exc!s:.120})")
            self._load(RemediationState(), now)
        await self._interrupted(now)
        for lad in self.driver.ladders.values():
            self.driver.record(lad, "resumed", now)
        if not self._subscribed:
            self.ctx.bus.subscribe(self.on_transition)
            self._subscribed = True
        self.persist.dirty = bool(self.driver.ladders)

    async def _interrupted(self, now: float) -> None:
        """Each run the last agent started and never finished, on record as interrupted."""
        for rec in await asyncio.to_thread(interrupted_runs, self.audit.path, now):
            self.audit.append(rec)
            self.runner.count(rec.action, Outcome.INTERRUPTED)
            log.warning(
                "action %s (run %s) was interrupted by an agent stop", rec.action, rec.run_id
            )

    def _load(self, st: RemediationState, now: float) -> None:
        """Guards, ladders, restores and replicas from a validated state (empty: defaults)."""
        self.guards.load(st.guards)
        grace = self.config.actions.guards.resume_grace_s
        self.driver.ladders = {n: lad.resumed(now, grace) for n, lad in st.ladders.items()}
        self.driver.ended = dict(st.ended)
        self.restorer.pending = dict(st.restores)
        self.addressed.load(st.addressed)
        desired = st.replicas
        self.replicas.desired = (
            desired if desired is not None else self.config.actions.scale.min_replicas
        )

    async def stop(self) -> None:
        await self.holds.stop()
        await self.runner.drain(timeout_s=max(0.5, self.config.agent.shutdown_deadline_s / 2))
        await self.pager.stop()
        if self._saving is not None:
            await asyncio.gather(self._saving, return_exceptions=True)
        await self.save_async()
        self.persist.file.writer.close()
        self.audit.close()

    def _state(self) -> RemediationState:
        return Persist.snapshot(
            self.guards,
            self.driver.ladders,
            self.driver.ended,
            self.restorer.pending,
            self.addressed,
            self.replicas.desired,
        )

    def _mark_dirty(self) -> None:
        """Guard state changed: saved now, on the state file's writer thread (the loop never
        waits for a disk). An action waits, bounded, until it is on disk before it acts
        (:meth:`Runner._durable`), so a crash during the action never lets a restarted
        agent repeat it. A disk that refuses it: saved again each tick."""
        self.persist.touch()
        if self._saving is None or self._saving.done():
            self._saving = asyncio.get_running_loop().create_task(self._save_dirty())

    async def _save_dirty(self) -> None:
        while self.persist.dirty:
            if not await self.save_async():
                return  # the disk refused it: the next tick tries again

    async def save_async(self) -> bool:
        """Write the state from a snapshot taken now, on the state file's writer thread."""
        return await self.persist.save_async(self._state())

    # -- alerts, pages ----------------------------------------------------------

    def on_transition(self, ev: AlertTransition) -> None:
        """Bus subscriber (local rules, and the webhook's alerts)."""
        self.alert_state.note(ev)
        alert = Alert.of(ev)
        if alert is not None:
            self.driver.on_alert(alert, self.clock())

    def active(self, name: str) -> bool:
        return self.driver.active(name)

    def _hold_released(self, now: float, floor: int) -> None:
        self.replicas.desired = floor
        self.persist.touch()
        self.audit.append(FleetRecord(ts=now, event="hold_released", min_replicas=floor))

    def _breaker_opened(self, scope: str, run: Run) -> None:
        what = "all actions" if scope == "*" else f"action {scope}"
        self.pager.page(
            f"remediation circuit breaker open for {what}: hourly budget spent",
            scope=scope,
            action=run.action,
        )

    # -- tick -------------------------------------------------------------------

    async def tick(self, now: float) -> None:
        self.engine.identify_soon(now)
        self.driver.tick(now)
        self.restorer.tick(now, self.active)
        self.holds.poll(now)
        self.audit.tick(now)
        self.publish(now)
        if self.persist.dirty and (self._saving is None or self._saving.done()):
            self._saving = asyncio.get_running_loop().create_task(self._save_dirty())

    def publish(self, now: float) -> None:
        self.ctx.store.add(
            samples(
                self.runner.counts,
                self.pager.sent,
                self.replicas.desired,
                self.driver.instances_refused,
                self.persist.file.set_aside_count,
                self.audit,
            )
            + dropped_samples(self.webhook_dropped),
            now,
        )

    # -- status and routes --------------------------------------------------------

    def status(self) -> JSONObject:
        return RemediationStatus.of(
            mode=self.config.actions.mode,
            guards=self.guards.summary(self.clock()),
            state=self._state(),
            pages=self.pager.pages,
            instances_refused=self.driver.instances_refused,
            set_aside=self.persist.file.set_aside_count,
            audit=self.audit,
        )

    def routes(self) -> list[web.RouteDef]:
        return build_routes(self, self.ctx.auth)

    # -- what the control API asks (routes.RemediationAPI) -------------------------

    def describe(self) -> dict[str, object]:
        return {
            "mode": self.config.actions.mode,
            "actions": [s.describe() for s in self.registry.specs()],
            "guards": self.guards.summary(self.clock()),
        }

    def knows(self, action: str) -> bool:
        return action in self.registry

    def action_names(self) -> list[str]:
        return self.registry.names()

    async def run_asked(
        self, action: ActionName, body: RunActionBody, remote: str | None
    ) -> Answer:
        run = self.runner.submit(
            action,
            body.params or {},
            trigger=Trigger(source="api", remote=remote),
            force=body.force,
            reason=body.reason,
            dry_run=body.dry_run,
        )
        if run.task is not None:
            await asyncio.wait([run.task], timeout=self.config.actions.guards.action_timeout_s + 5)
        rec = run.record().as_json()
        if not await self.audit.sync():  # never acknowledge a record that is not on disk
            return Answer(503, self.audit.not_durable(rec))
        if run.outcome is Outcome.SKIPPED_NOT_DURABLE:
            return Answer(503, {"error": f"not durable: {run.error}", "record": rec})
        return Answer(STATUS_OF.get(run.outcome or Outcome.REFUSED, 409), rec)

    async def history(self, since: float | None, limit: int) -> list[JSONObject]:
        def tail() -> list[JSONObject]:
            return list(deque(read_audit(self.audit.path, since), maxlen=limit))

        return await asyncio.to_thread(tail)  # the log grows without bound: off the loop

    def readiness(self) -> tuple[bool, JSONObject]:
        eng = self.engine
        serving = eng.serving()
        body: JSONObject = {
            "serving": serving, "state": eng.state.value, "draining": eng.draining,
        }  # fmt: skip
        if not serving:
            why = f"draining: {eng.draining}" if eng.draining else f"engine {eng.state.value}"
            body["error"] = f"not serving ({why})"
        return serving, body

    async def alertmanager(self, payload: object) -> Answer:
        """Alertmanager's notifications as alert transitions (:mod:`.alertmanager`); over
        the cap, what fits is taken and the rest counted, answered 200 so Alertmanager
        neither retries it nor loses what was taken (a 4xx is not retried)."""
        try:
            delivery = parse_webhook(payload, self.clock())
        except BadPayload as exc:
            return Answer(exc.status, {"error": str(exc)})
        for ev in delivery.events:
            self.ctx.bus.publish(ev)
        counts = self.webhook_dropped
        counts[OVER_CAP] = counts.get(OVER_CAP, 0) + delivery.dropped_total
        counts[TRUNCATED] = counts.get(TRUNCATED, 0) + delivery.truncated
        if delivery.dropped:
            log.warning("alertmanager webhook: %s", delivery.answer()["warning"])
        # The decisions are on disk before Alertmanager hears "ok"; else it sends again.
        if not await self.audit.sync():
            return Answer(503, self.audit.not_durable(None))
        return Answer(200, delivery.answer())
