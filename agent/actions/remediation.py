"""The remediation component: wires alert intake, the ladder driver, restores,
paging, metrics and persistence, and runs them each tick.

Alerts come from the event bus (the local rule engine, and the Alertmanager
webhook, which publishes there too) as :class:`~.intake.Alert`; the
:class:`~.driver.LadderDriver` keeps one ladder per alert name, so one incident
never runs twice. Each tick it steps the ladders, restores a fallback whose
alert stayed resolved for the hold time (:mod:`.restore`), publishes its
metrics (:mod:`.publish`) and saves its state (atomically) when something
changed. Each job is its own module; this one only builds and orders them.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from kcops.agent.actions.alertmanager import Addressed, dropped_samples, identity_of
from kcops.agent.actions.audit import AuditLog, unfinished
from kcops.agent.actions.base import Registry, SupervisorHandle
from kcops.agent.actions.driver import LadderDriver
from kcops.agent.actions.guards import Guards
from kcops.agent.actions.intake import (
    Alert,
    AlertState,
    AlertsView,
    fingerprint,
    parse_time,
    ruleset_for_ladders,
)
from kcops.agent.actions.ladder import Ladder
from kcops.agent.actions.outcome import Outcome
from kcops.agent.actions.paging import Pager
from kcops.agent.actions.persist import Persist, RemediationStatus
from kcops.agent.actions.publish import samples
from kcops.agent.actions.records import ActionRecord, FleetRecord, JSONObject, StartedRecord
from kcops.agent.actions.registry import builtin_actions
from kcops.agent.actions.remediation_state import RemediationState, RestoreState
from kcops.agent.actions.restore import Restores
from kcops.agent.actions.runner import Run, Runner
from kcops.agent.actions.scale_out import HoldKeeper, Replicas
from kcops.agent.component import AgentContext
from kcops.agent.engine import Engine
from kcops.agent.events import AlertTransition

if TYPE_CHECKING:
    from kcops.agent.rules.loader import RuleSet

__all__ = ["AlertsView", "Remediation", "fingerprint", "parse_time"]

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
        engine: Engine | None = None,
        supervisor: SupervisorHandle | None = None,
        alerts: AlertsView | None = None,
        ruleset: RuleSet | None = None,
    ) -> None:
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
        self._own_engine = engine is None
        self.engine = engine or Engine(
            cfg.engine.url,
            cfg.engine.adapter,
            token=ctx.auth.token,
            timeout_s=max(5.0, cfg.engine.timeout_s),
            now=ctx.clock(),
            startup_timeout_s=cfg.engine.startup_timeout_s,
        )
        self.supervisor = supervisor
        self.runner = Runner(
            cfg,
            self.registry,
            self.guards,
            self.audit,
            self.engine,
            ctx.tracer,
            ctx.clock,
            replicas=self.replicas,
            supervisor=supervisor,
            store=ctx.store,
            on_change=self._mark_dirty,
            on_breaker=self._breaker_opened,
        )
        self.pager = Pager(cfg.actions.notify, self.audit, ctx.clock, self._count)
        if ruleset is None:
            ruleset = ruleset_for_ladders(cfg, self.registry)
        self.alert_state = AlertState(alerts, ruleset)
        self.restorer = Restores(self.runner, self.persist.touch)
        # Which pod each Alertmanager alert is about: a ladder it started runs its
        # pod steps only here if it names this pod (alertmanager.step_refusal).
        self.addressed = Addressed(identity_of(cfg))
        self.driver = LadderDriver(
            cfg,
            self.registry,
            self.runner,
            self.audit,
            self.alert_state,
            self.addressed,
            self.pager,
            self.restorer,
            self.persist.touch,
        )
        self._identify_at = 0.0
        self._subscribed = False
        # Webhook alerts not taken, by reason (kcops_webhook_alerts_dropped_total).
        self.webhook_dropped: dict[str, int] = {}

    # What tests and routes read of the parts.
    @property
    def ladders(self) -> dict[str, Ladder]:
        return self.driver.ladders

    @property
    def ended(self) -> dict[str, float]:
        return self.driver.ended

    @property
    def restores(self) -> dict[str, RestoreState]:
        return self.restorer.pending

    @property
    def pages(self) -> int:
        return self.pager.pages

    @property
    def instances_refused(self) -> int:
        return self.driver.instances_refused

    @property
    def _page_tasks(self) -> set[asyncio.Task[None]]:
        return self.pager.tasks

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
        for lad in self.ladders.values():
            self.driver.record(lad, "resumed", now)
        if not self._subscribed:
            self.ctx.bus.subscribe(self.on_transition)
            self._subscribed = True
        self.persist.dirty = bool(self.ladders)

    async def _interrupted(self, now: float) -> None:
        """An ``interrupted`` outcome for each run the last agent started and never
        finished (killed while it ran): the run is on record, its cooldown explained."""
        for raw in await asyncio.to_thread(unfinished, self.audit.path):
            try:
                st = StartedRecord.model_validate({k: v for k, v in raw.items() if k != "kind"})
            except ValueError:
                continue
            rec = ActionRecord(
                ts=now,
                run_id=st.run_id,
                action=st.action,
                params=st.params,
                target=st.target,
                mode=st.mode,
                outcome=Outcome.INTERRUPTED,
                error=f"the agent stopped while it ran (started at {st.ts:.3f}, no outcome "
                "recorded): it may have acted; its cooldown and budget stay spent",
                trigger=st.trigger,
                ladder=st.ladder,
                forced=st.forced,
                reason=st.reason,
            )
            self.audit.append(rec)
            self._count(st.action, Outcome.INTERRUPTED)
            log.warning("action %s (run %s) was interrupted by an agent stop", st.action, st.run_id)

    def _load(self, st: RemediationState, now: float) -> None:
        """Guards, ladders, restores and replicas from a validated state (empty: defaults)."""
        self.guards.load(st.guards)
        grace = self.config.actions.guards.resume_grace_s
        self.driver.ladders = {n: s.ladder().resumed(now, grace) for n, s in st.ladders.items()}
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
        self.save()
        if self._own_engine:
            await self.engine.aclose()
        self.audit.close()

    def _state(self) -> RemediationState:
        return Persist.snapshot(
            self.guards,
            self.ladders,
            self.ended,
            self.restores,
            self.addressed,
            self.replicas.desired,
        )

    def _mark_dirty(self) -> None:
        # Guard state must be on disk before an action acts, so that a crash
        # during the action never lets a restarted agent repeat it. A disk that
        # refuses it (full) does not stop remediation: saved again each tick.
        try:
            self.save()
        except OSError as exc:
            self.persist.touch()
            log.warning("cannot save %s: %s", self.persist.file.path, exc.strerror or exc)

    def save(self) -> None:
        """Write the state now, on the loop (before an action acts; at stop)."""
        self.persist.save(self._state())

    async def save_async(self) -> None:
        """Write the state from a snapshot taken now; the fsyncs run in a thread (each tick)."""
        await self.persist.save_async(self._state())

    # -- alerts, pages ----------------------------------------------------------

    def on_transition(self, ev: AlertTransition) -> None:
        """Bus subscriber (local rules, and the webhook's alerts)."""
        self.alert_state.note(ev)
        alert = Alert.of(ev)
        if alert is not None:
            self.driver.on_alert(alert, self.clock())

    def active(self, name: str) -> bool:
        return self.driver.active(name)

    def page(
        self,
        message: str,
        *,
        alertname: str | None = None,
        scope: str | None = None,
        action: str | None = None,
        last_exit: int | None = None,
    ) -> None:
        """Tell a human (:meth:`Pager.page`)."""
        self.pager.page(
            message, alertname=alertname, scope=scope, action=action, last_exit=last_exit
        )

    def _breaker_opened(self, scope: str, run: Run) -> None:
        what = "all actions" if scope == "*" else f"action {scope}"
        self.page(
            f"remediation circuit breaker open for {what}: hourly budget spent",
            scope=scope,
            action=run.action,
        )

    def _count(self, action: str, outcome: str) -> None:
        key = (action, outcome)
        self.runner.counts[key] = self.runner.counts.get(key, 0) + 1

    def _hold_released(self, floor: int, now: float) -> None:
        self.replicas.desired = floor
        self.persist.touch()
        self.audit.append(FleetRecord(ts=now, event="hold_released", min_replicas=floor))
        log.info("fleet hold over: replica floor back to %d", floor)

    # -- tick -------------------------------------------------------------------

    def _identify_engine(self, now: float) -> None:
        """Resolve an auto-detected engine once (capabilities), tried at most every 10 s."""
        eng = self.engine
        if eng.url is None or eng.identified:
            return
        if now < self._identify_at:
            return
        self._identify_at = now + 10.0

        async def _resolve() -> None:
            try:
                await eng.resolve()
            except Exception as exc:  # not answering yet: tried again later
                log.debug("engine not identified yet: %s", exc)

        # Off the tick: an engine that does not answer must not hold the loop.
        self.pager.spawn(_resolve())

    async def tick(self, now: float) -> None:
        self._identify_engine(now)
        self.driver.tick(now)
        self.restorer.tick(now, self.active)
        self.holds.poll(now)
        self.audit.tick(now)
        self.publish(now)
        if self.persist.dirty:
            await self.save_async()

    def publish(self, now: float) -> None:
        self.ctx.store.add(
            samples(
                self.runner.counts,
                self.replicas.desired,
                self.instances_refused,
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
            pages=self.pages,
            instances_refused=self.instances_refused,
            set_aside=self.persist.file.set_aside_count,
            audit=self.audit,
        )

    def routes(self) -> list[web.RouteDef]:
        from kcops.agent.actions.routes import build_routes

        return build_routes(self)
