"""The remediation component: alert transitions in, guarded ladders out.

It subscribes to the event bus (local rule engine) and takes Alertmanager
alerts from the webhook; both feed one ladder per alert name, so one
incident never runs twice. Each tick it steps the ladders, restores a
fallback whose alert stayed resolved for the hold time, publishes its
metrics and saves its state (atomically) when something changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from kcops.agent.actions import ladder as L
from kcops.agent.actions.alertmanager import (
    FINGERPRINT,
    HERE,
    MAX_LADDER_INSTANCES,
    STARTS_AT,
    Addressed,
    identity_of,
)
from kcops.agent.actions.audit import AuditLog
from kcops.agent.actions.base import Registry, SupervisorHandle
from kcops.agent.actions.fallback_to_base import hold_of
from kcops.agent.actions.guards import Guards
from kcops.agent.actions.notify import send as send_notify
from kcops.agent.actions.outcome import Outcome, Refusal
from kcops.agent.actions.registry import default_registry
from kcops.agent.actions.runner import Run, Runner
from kcops.agent.actions.scale_out import HoldKeeper, Replicas
from kcops.agent.actions.statefile import StateFile
from kcops.agent.component import AgentContext
from kcops.agent.engine import Engine
from kcops.agent.events import AlertTransition, RemediationStep
from kcops.agent.samples import Sample
from kcops.errors import ActionRejected

if TYPE_CHECKING:
    from kcops.agent.rules.loader import RuleSet

log = logging.getLogger("kcops.agent.actions")


class AlertsView(Protocol):
    """What remediation reads of the local rule engine (:class:`RulesComponent`)."""

    def is_firing(self, alertname: str, labels: Mapping[str, str] | None = None) -> bool: ...

    def active(self) -> list[dict[str, Any]]: ...

    def rule_names(self) -> list[str]: ...


def _rule_ladders(
    ruleset: RuleSet | None,
) -> tuple[set[str], dict[str, tuple[RemediationStep, ...]]]:
    """Alert names and ladders of the one loaded rule set (cluster alerts carry no ladder)."""
    if ruleset is None:
        return set(), {}
    alerts = ruleset.alerts()
    return {a.name for a in alerts}, {a.name: a.remediation for a in alerts if a.remediation}


def load_ruleset(ctx: AgentContext) -> RuleSet | None:
    """The rule set from config, for an agent whose rule engine is off (read once)."""
    from kcops.agent.rules.loader import ruleset_from_config
    from kcops.agent.rules.model import RuleError

    try:
        return ruleset_from_config(ctx.config)
    except RuleError as exc:
        log.warning("no ladders for cluster alerts: %s", exc)
        return None


STATE_FILE = "remediation-state.json"
AUDIT_FILE = "audit.jsonl"


def fingerprint(source: str, labels: Mapping[str, str]) -> str:
    return source + ":" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def parse_time(value: str | None) -> float | None:
    """RFC 3339 (Alertmanager's startsAt, nanoseconds allowed) to Unix seconds."""
    if not value or value.startswith("0001-"):
        return None
    text = value.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


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
        self.config = ctx.config
        self.clock = ctx.clock
        self.registry = registry or default_registry()
        self.state_path = Path(ctx.state_dir) / STATE_FILE
        self.state_file = StateFile(self.state_path)
        self.audit = AuditLog(Path(ctx.state_dir) / AUDIT_FILE)
        self.guards = Guards(self.config.actions.guards)
        self.replicas = Replicas()
        # Any agent of the fleet ends an expired scale_out hold (docs/deploy.md).
        self.holds = HoldKeeper(self.config, self._hold_released)
        self._own_engine = engine is None
        self.engine = engine or Engine(
            self.config.engine.url,
            self.config.engine.adapter,
            token=ctx.auth.token,
            timeout_s=max(5.0, self.config.engine.timeout_s),
            now=ctx.clock(),
            startup_timeout_s=self.config.engine.startup_timeout_s,
        )
        self.supervisor = supervisor
        self.runner = Runner(
            self.config,
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
        self.alerts: AlertsView | None = alerts
        self.rule_names_all, self.rule_ladders = _rule_ladders(
            ruleset if ruleset is not None else load_ruleset(ctx)
        )
        self.ladders: dict[str, L.Ladder] = {}
        # Which pod each Alertmanager alert is about: a ladder it started runs its
        # pod steps only here if it names this pod (alertmanager.step_refusal).
        self.addressed = Addressed(identity_of(self.config))
        self.ended: dict[str, float] = {}
        self.restores: dict[str, dict[str, Any]] = {}
        self._restore_runs: dict[str, Run] = {}
        self.known_steps: dict[str, tuple[RemediationStep, ...]] = {}
        self._running: dict[str, Run] = {}
        self._dirty = False
        self._identify_at = 0.0
        self._page_tasks: set[asyncio.Task[None]] = set()
        self.pages = 0
        self.instances_refused = 0  # firing instances past MAX_LADDER_INSTANCES of a ladder
        self._capped: set[str] = set()  # ids of ladders that refused one (audited once)
        self._subscribed = False

    # -- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        now = self.clock()
        data = self.state_file.read()
        try:
            self._restore(data, now)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            # Validated, yet not rebuildable (a model that lets through what the
            # code cannot take): the same as a corrupt file, never a failed start.
            self.state_file.set_aside(f"cannot be rebuilt ({type(exc).__name__}: {exc!s:.120})")
            self._restore({}, now)
        for lad in self.ladders.values():
            self._audit_ladder(lad, "resumed", now)
        if not self._subscribed:
            self.ctx.bus.subscribe(self.on_transition)
            self._subscribed = True
        self._dirty = bool(self.ladders)

    def _restore(self, data: dict[str, Any], now: float) -> None:
        """Guards, ladders, restores and replicas from a validated state (empty: defaults)."""
        self.guards.load(data.get("guards", {}))
        grace = self.config.actions.guards.resume_grace_s
        self.ladders = {
            name: L.Ladder.from_json(lad, now, grace)
            for name, lad in data.get("ladders", {}).items()
        }
        self.ended = {k: float(v) for k, v in data.get("ended", {}).items()}
        self.restores = dict(data.get("restores", {}))
        self.addressed.load(data.get("addressed", {}))
        desired = data.get("replicas")
        self.replicas.desired = (
            int(desired) if desired is not None else self.config.actions.scale.min_replicas
        )

    async def stop(self) -> None:
        await self.holds.stop()
        await self.runner.drain(timeout_s=max(0.5, self.config.agent.shutdown_deadline_s / 2))
        if self._page_tasks:
            await asyncio.wait(list(self._page_tasks), timeout=1.0)
        self.save()
        if self._own_engine:
            await self.engine.aclose()
        self.audit.close()

    def _mark_dirty(self) -> None:
        self._dirty = True
        # Guard state must be on disk before an action acts, so that a crash
        # during the action never lets a restarted agent repeat it.
        self.save()

    def _state(self) -> dict[str, Any]:
        return {
            "version": 1,
            "guards": self.guards.to_json(),
            "ladders": {n: lad.to_json() for n, lad in self.ladders.items()},
            "ended": self.ended,
            "restores": self.restores,
            "addressed": self.addressed.to_json(),
            "replicas": self.replicas.desired,
        }

    def save(self) -> None:
        """Write the state now, on the loop (before an action acts; at stop)."""
        self.state_file.save(self._state())
        self._dirty = False

    async def save_async(self) -> None:
        """Write the state from a snapshot taken now; the fsyncs run in a thread (each tick)."""
        self._dirty = False
        try:
            await self.state_file.save_async(self._state())
        except OSError as exc:
            self._dirty = True  # tried again next tick
            log.warning("cannot save %s: %s", self.state_path, exc.strerror or exc)

    # -- alert state --------------------------------------------------------

    def local_active(self, name: str) -> bool | None:
        """Whether the local rule engine has ``name`` pending or firing; None without one."""
        alerts = self.alerts
        if alerts is None:
            return None
        try:
            if alerts.is_firing(name):
                return True
            for a in alerts.active():
                labels = a.get("labels") or {}
                if (a.get("alertname") or labels.get("alertname")) == name and a.get(
                    "state", "firing"
                ) in ("pending", "firing"):
                    return True
            return False
        except Exception:
            log.exception("alerts service failed; using the transitions seen")
            return None

    def active(self, name: str) -> bool:
        lad = self.ladders.get(name)
        instances = lad.instances if lad else {}
        if any(src == "alertmanager" for src in instances.values()):
            return True
        local = self.local_active(name)
        if local is not None:
            return local
        return any(src == "local" for src in instances.values())

    def local_rule_names(self) -> set[str]:
        names = self.rule_names_all | set(self.known_steps)
        if self.alerts is not None:
            names |= set(self.alerts.rule_names())
        return names

    def steps_for(self, name: str) -> tuple[RemediationStep, ...]:
        return self.known_steps.get(name) or self.rule_ladders.get(name, ())

    # -- transitions --------------------------------------------------------

    def on_transition(self, ev: AlertTransition) -> None:
        """Bus subscriber (local rules) and the webhook's entry point."""
        now = self.clock()
        if ev.remediation and ev.source == "local":
            self.known_steps[ev.alertname] = ev.remediation
        src = ev.source
        fp = ev.annotations.get(FINGERPRINT) if src == "alertmanager" else None
        fp = fingerprint(src, ev.labels) if fp is None else f"alertmanager:{fp}"
        if ev.state == "firing":
            self._firing(ev, fp, now)
        elif ev.state == "inactive":
            self.addressed.drop(ev.alertname, fp)
            lad = self.ladders.get(ev.alertname)
            if lad is not None:
                lad.instances.pop(fp, None)
                self._dirty = True
                if not lad.instances and not self.active(ev.alertname):
                    self._close(lad, now, "resolved")

    def _firing(self, ev: AlertTransition, fp: str, now: float) -> None:
        name = ev.alertname
        here = ev.source == "local"
        if ev.source == "alertmanager":
            here = self.addressed.note(name, fp, dict(ev.labels)) == HERE
        lad = self.ladders.get(name)
        if lad is not None and here and self._superseded(lad) and self.config.actions.mode != "off":
            carried = dict(lad.instances)
            self._close(lad, now, "superseded", by=ev.to_json())
            self._start(ev, fp, now, carried)
            return
        if lad is not None:
            if lad.unconfirmed_until is not None:
                lad.unconfirmed_until = None
                self._dirty = True
            if fp not in lad.instances:
                if len(lad.instances) >= MAX_LADDER_INSTANCES:
                    self._refuse_instance(lad, ev, now)
                    return
                lad.instances[fp] = ev.source
                self._dirty = True
                if ev.source == "alertmanager":
                    self._decision(ev, now, "joined", f"joins the running ladder of {name}")
            return
        if self.config.actions.mode == "off":
            return
        if ev.source == "alertmanager":
            ended = self.ended.get(name)
            starts = parse_time(ev.annotations.get(STARTS_AT))
            window = self.config.actions.guards.dedup_window_s
            if ended is not None and now - ended <= window and (starts is None or starts <= ended):
                self._decision(
                    ev, now, "deduplicated", f"same incident as the ladder that ended at {ended}"
                )
                return
            if name not in self.local_rule_names():
                self._decision(ev, now, "ignored", "no local rule of that name")
                return
        self._start(ev, fp, now, {})

    def _superseded(self, lad: L.Ladder) -> bool:
        """A ladder that only Alertmanager alerts about other pods (or none) started
        refuses its pod steps; once this pod's own alert fires it starts over here."""
        if self.addressed.here(lad.alertname, lad.instances):
            return False
        return any(self._scope(s["action"]) == "pod" for s in lad.steps)

    def _scope(self, action: str) -> str:
        return self.registry.get(action).scope if action in self.registry else "pod"

    def _start(self, ev: AlertTransition, fp: str, now: float, carried: dict[str, str]) -> None:
        name = ev.alertname
        steps = ev.remediation if ev.source == "local" and ev.remediation else self.steps_for(name)
        if not steps:
            if ev.source == "alertmanager":
                self._decision(ev, now, "ignored", "the rule has no remediation ladder")
            return
        instances = {**carried, fp: ev.source}
        lease = self.config.actions.scale.lease.backend
        why = [self.addressed.refusal(name, instances, self._scope(s.action), lease) for s in steps]
        if all(why):
            # nothing of the ladder may run here: record why, start nothing
            self._decision(ev, now, "refused", str(why[0]))
            return
        lad = L.Ladder.new(name, steps, now, ev.to_json())
        lad.instances.update(instances)
        self.ladders[name] = lad
        self._dirty = True
        self._audit_ladder(lad, "started", now)
        # Run the first step right away: reaction within the tick that fired.
        self._feed(lad, L.Tick(now))

    def _refuse_instance(self, lad: L.Ladder, ev: AlertTransition, now: float) -> None:
        """One more firing instance than a ladder tracks: counted; audited once per ladder."""
        self.instances_refused += 1
        if lad.id not in self._capped:
            self._capped.add(lad.id)
            self._decision(
                ev,
                now,
                "capped",
                f"the ladder of {lad.alertname} tracks {MAX_LADDER_INSTANCES} instances at "
                "most; further ones are counted (kcops_ladder_instances_refused_total), "
                "not tracked",
            )

    def _decision(self, ev: AlertTransition, now: float, what: str, why: str) -> None:
        self.audit.append(
            {
                "kind": "alert",
                "ts": now,
                "event": what,
                "detail": why,
                "trigger": ev.to_json(),
            }
        )

    # -- ladders --------------------------------------------------------------

    def _audit_ladder(self, lad: L.Ladder, event: str, now: float, **extra: Any) -> None:
        rec = {
            "kind": "ladder",
            "ts": now,
            "event": event,
            "alertname": lad.alertname,
            "step": lad.step,
            "steps": [s["action"] for s in lad.steps],
            "phase": lad.phase,
            "mode": self.config.actions.mode,
            "trigger": lad.trigger,
            **extra,
        }
        self.audit.append(rec)

    def _close(self, lad: L.Ladder, now: float, why: str, **extra: Any) -> None:
        self.ladders.pop(lad.alertname, None)
        if why != "superseded":
            self.addressed.forget(lad.alertname)
        self._running.pop(lad.alertname, None)
        self._capped.discard(lad.id)
        self.ended[lad.alertname] = now
        self._dirty = True
        self._audit_ladder(lad, why, now, **extra)

    def _advance(self, lad: L.Ladder, now: float) -> None:
        """Feed the ladder this tick (and the outcome of a run that finished)."""
        ev: L.Event = L.Tick(now)
        if lad.phase is L.Phase.RUNNING:
            run = self._running.get(lad.alertname)
            if run is not None and not run.done:
                return
            self._running.pop(lad.alertname, None)
            ev = self._decided(run, now)
        self._feed(lad, ev)

    def _decided(self, run: Run | None, now: float) -> L.Decided:
        if run is None:  # lost across an agent restart: verify as if it ran
            return L.Decided(now, None)
        return L.Decided(now, run.outcome, run.id, run.error, dict(run.params))

    def _feed(self, lad: L.Ladder, ev: L.Event) -> None:
        """Step the ladder and carry out its decisions; bounded, each pass moves forward."""
        retry_s = self.config.actions.guards.retry_s
        for _ in range(2 * len(lad.steps) + 4):
            new, decisions = L.step(lad, ev, retry_s=retry_s)
            if new != lad or decisions:
                self._dirty = True
            # The step is pure; the component keeps one object per ladder (status, routes).
            vars(lad).update(vars(new))
            nxt: L.Event | None = None
            for d in decisions:
                nxt = self._carry_out(lad, d, ev) or nxt
            if nxt is None:
                return
            ev = nxt

    def _carry_out(self, lad: L.Ladder, d: L.Decision, ev: L.Event) -> L.Event | None:
        now = ev.now
        if isinstance(d, L.Submit):
            lease = self.config.actions.scale.lease.backend
            why = self.addressed.refusal(lad.alertname, lad.instances, self._scope(d.action), lease)
            run = self.runner.submit(
                d.action,
                d.params,
                now=now,
                trigger=lad.trigger,
                ladder=lad.ref(),
                refuse=ActionRejected(why, Refusal.NOT_THIS_POD) if why else None,
            )
            lad.run_id = run.id
            if not run.done:
                self._running[lad.alertname] = run
                return None
            return self._decided(run, now)
        if isinstance(d, L.Audit):
            self._audit_ladder(lad, d.event, now, **d.extra)
        elif isinstance(d, L.Escalate):
            if d.page:
                self.page(d.message, alertname=lad.alertname)
            else:
                self._ticket(d.message, d.severity, lad.alertname, now)
        elif isinstance(d, L.HoldRestore):
            hold = hold_of(d.params, self.config.actions.fallback.hold_s)
            self.restores[lad.alertname] = {"since": None, "run_id": d.run_id, "hold_s": hold}
        return None

    def _ticket(self, message: str, severity: str, alertname: str, now: float) -> None:
        """An alert that is not a page ends its ladder with a record, never a page."""
        self.audit.append(
            {
                "kind": "escalation",
                "ts": now,
                "severity": severity,
                "message": message,
                "alertname": alertname,
            }
        )
        log.warning("%s (%s)", message, severity)

    # -- restores -------------------------------------------------------------

    def _restores(self, now: float) -> None:
        for name, r in list(self.restores.items()):
            pending = self._restore_runs.get(name)
            if pending is not None:
                if not pending.done:
                    continue
                del self._restore_runs[name]
                if pending.outcome in (Outcome.OK, Outcome.DRY_RUN):
                    del self.restores[name]
                    self._dirty = True
                # failed or timed out: the entry stays and the restore is tried again
                continue
            hold = float(r.get("hold_s", self.config.actions.fallback.hold_s))
            if self.active(name):
                if r.get("since") is not None:
                    r["since"] = None
                    self._dirty = True
                continue
            if r.get("since") is None:
                r["since"] = now
                self._dirty = True
            if now - float(r["since"]) < hold:
                continue
            run = self.runner.submit(
                "restore_route",
                {},
                now=now,
                trigger={"alertname": name, "resolved_since": r["since"], "hold_s": hold},
                force=True,
                reason=f"automatic restore: {name} resolved for {hold:g}s",
            )
            if run.outcome in (Outcome.SKIPPED_BUSY, Outcome.SKIPPED_STARTING):
                continue
            if not run.done:
                self._restore_runs[name] = run  # decided on a later tick, by its outcome
                continue
            if run.outcome in (Outcome.OK, Outcome.DRY_RUN):
                del self.restores[name]
                self._dirty = True

    def _hold_released(self, floor: int, now: float) -> None:
        self.replicas.desired = floor
        self._dirty = True
        self.audit.append(
            {"kind": "fleet", "ts": now, "event": "hold_released", "min_replicas": floor}
        )
        log.info("fleet hold over: replica floor back to %d", floor)

    # -- paging -------------------------------------------------------------

    def _breaker_opened(self, scope: str, run: Run) -> None:
        what = "all actions" if scope == "*" else f"action {scope}"
        self.page(
            f"remediation circuit breaker open for {what}: hourly budget spent",
            scope=scope,
            action=run.action,
        )

    def page(self, message: str, **context: Any) -> None:
        """Tell a human: audit, log, and the notify webhook when configured."""
        now = self.clock()
        self.pages += 1
        self.audit.append({"kind": "page", "ts": now, "message": message, **context})
        log.error("PAGE: %s", message)
        cfg = self.config.actions.notify
        if not cfg.url:
            self._count("page", "logged")
            return

        async def _send() -> None:
            payload = {"source": "kcops", "severity": "page", "message": message, "t": now}
            payload.update({k: v for k, v in context.items() if isinstance(v, str | int | float)})
            try:
                await send_notify(cfg, payload)
                self._count("page", "sent")
            except Exception as exc:
                self._count("page", "failed")
                log.error("page webhook failed: %s", exc)

        try:
            task = asyncio.get_running_loop().create_task(_send())
        except RuntimeError:
            self._count("page", "failed")
            return
        self._page_tasks.add(task)
        task.add_done_callback(self._page_tasks.discard)

    def _count(self, action: str, outcome: str) -> None:
        key = (action, outcome)
        self.runner.counts[key] = self.runner.counts.get(key, 0) + 1

    # -- tick -------------------------------------------------------------------

    def _identify_engine(self, now: float) -> None:
        """Resolve an auto-detected engine once (capabilities), tried at most every 10 s."""
        eng = self.engine
        if eng.url is None or (eng.adapter is not None and eng.capabilities_probed):
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
        task = asyncio.get_running_loop().create_task(_resolve())
        self._page_tasks.add(task)
        task.add_done_callback(self._page_tasks.discard)

    async def tick(self, now: float) -> None:
        self._identify_engine(now)
        for name, lad in list(self.ladders.items()):
            if lad.unconfirmed_until is not None:
                if self.active(name):
                    lad.unconfirmed_until = None
                    self._dirty = True
                elif now < lad.unconfirmed_until:
                    continue  # hold: neither climb nor resolve before the rules catch up
                else:
                    self._close(lad, now, "resolved")
                    continue
            if lad.phase is not L.Phase.RUNNING and not self.active(name):
                self._close(lad, now, "resolved")
                continue
            self._advance(lad, now)
        self._restores(now)
        self.holds.poll(now)
        self.publish(now)
        if self._dirty:
            await self.save_async()

    def publish(self, now: float) -> None:
        samples = [
            Sample.of("kcops_action_runs_total", n, {"action": a, "outcome": o})
            for (a, o), n in self.runner.counts.items()
        ]
        if self.replicas.desired is not None:
            samples.append(Sample.of("kcops_desired_replicas", self.replicas.desired))
        samples += [
            Sample.of("kcops_ladder_instances_refused_total", self.instances_refused),
            Sample.of("kcops_state_files_set_aside_total", self.state_file.set_aside_count),
            Sample.of("kcops_audit_torn_repairs_total", self.audit.torn_repairs),
        ]
        self.ctx.store.add(samples, now)

    # -- status and routes --------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = self.clock()
        open_breakers = self.guards.summary(now)["breakers_open"]
        return {
            "healthy": not open_breakers,
            "summary": (
                f"mode {self.config.actions.mode}, {len(self.ladders)} ladder(s) active"
                + (f", breaker open: {', '.join(open_breakers)}" if open_breakers else "")
            ),
            "mode": self.config.actions.mode,
            "ladders": {n: lad.to_json() for n, lad in self.ladders.items()},
            "guards": self.guards.summary(now),
            "pending_restores": self.restores,
            "pages": self.pages,
            "instances_refused": self.instances_refused,
            "state_files_set_aside": self.state_file.set_aside_count,
            "audit_torn_repairs": self.audit.torn_repairs,
        }

    def routes(self) -> list[web.RouteDef]:
        from kcops.agent.actions.routes import build_routes

        return build_routes(self)
