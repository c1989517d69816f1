"""The ladder driver: alerts in, one ladder per alert name, its decisions carried out.

:func:`~kcops.agent.remediation.ladder.step` decides; this carries out what it
decided (submit a run, audit, escalate, hold a restore) and feeds each run's
outcome straight back as a :class:`~.ladder.Decided`: a refusal within the tick
that fired, so a ladder climbs past a step that cannot apply at once; a run the
moment its task ends. An alert name has one ladder, whichever source tells of its
instances, so an incident never runs twice; this keeps the newest ladder in
:attr:`LadderDriver.ladders`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kcops.agent.actions.base import Registry
from kcops.agent.actions.fallback_to_base import hold_of
from kcops.agent.clock import Clock
from kcops.agent.config import Config
from kcops.agent.events import AlertSource
from kcops.agent.outcome import ActionRejected, Refusal
from kcops.agent.remediation import ladder as L
from kcops.agent.remediation.alertmanager import HERE, MAX_LADDER_INSTANCES, Addressed
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.intake import Alert, AlertState
from kcops.agent.remediation.paging import Pager
from kcops.agent.remediation.records import AlertRecord, LadderRecord, Trigger
from kcops.agent.remediation.restore import Restores
from kcops.agent.remediation.runner import Run, Runner


class LadderDriver:
    def __init__(
        self,
        config: Config,
        registry: Registry,
        runner: Runner,
        audit: AuditLog,
        alerts: AlertState,
        addressed: Addressed,
        pager: Pager,
        restores: Restores,
        on_change: Callable[[], None],
        clock: Clock,
    ) -> None:
        self.config = config
        self.registry = registry
        self.runner = runner
        self.audit = audit
        self.alerts = alerts
        self.addressed = addressed
        self.pager = pager
        self.restores = restores
        self.on_change = on_change
        self.clock = clock
        self.ladders: dict[str, L.Ladder] = {}
        self.ended: dict[str, float] = {}  # alertname -> when its last ladder ended
        self.instances_refused = 0  # firing instances past MAX_LADDER_INSTANCES of a ladder
        self._capped: set[str] = set()  # ids of ladders that refused one (audited once)

    def active(self, name: str) -> bool:
        lad = self.ladders.get(name)
        return self.alerts.active(name, lad.instances if lad else {})

    # -- alerts in --------------------------------------------------------------

    def on_alert(self, alert: Alert, now: float) -> None:
        if alert.firing and alert.inhibited_by is not None and alert.name not in self.ladders:
            # Caused by what inhibits it (the agent's own restart): on record, no ladder,
            # no page. Published again, not inhibited, if it still fires once that ends.
            why = f"inhibited by {alert.inhibited_by} while it fires (rule file inhibit_rules)"
            self._decision(alert, now, "inhibited", why)
            return
        if alert.firing:
            self._firing(alert, now)
            return
        self.addressed.drop(alert.name, alert.fp)
        lad = self.ladders.get(alert.name)
        if lad is not None:
            lad = self._feed(lad, L.InstanceSeen(now, alert.fp, None))
            if not lad.instances and not self.active(alert.name):
                self._close(lad, now, "resolved")

    def _firing(self, alert: Alert, now: float) -> None:
        name = alert.name
        here = alert.source == "local"
        if alert.source == "alertmanager":
            here = self.addressed.note(name, alert.fp, dict(alert.labels)) == HERE
        mode_off = self.config.actions.mode == "off"
        lad = self.ladders.get(name)
        if lad is not None and here and self._superseded(lad) and not mode_off:
            carried = dict(lad.instances)
            self._close(lad, now, "superseded", by=alert.trigger)
            self._start(alert, now, carried)
            return
        if lad is not None:
            if lad.unconfirmed_until is not None:
                lad = self._feed(lad, L.Confirmed(now))
            if alert.fp not in lad.instances:
                if len(lad.instances) >= MAX_LADDER_INSTANCES:
                    self._refuse_instance(lad, alert, now)
                    return
                self._feed(lad, L.InstanceSeen(now, alert.fp, alert.source))
                if alert.source == "alertmanager":
                    self._decision(alert, now, "joined", f"joins the running ladder of {name}")
            return
        if mode_off:
            return
        if alert.source == "alertmanager":
            ended = self.ended.get(name)
            starts = alert.starts_at
            window = self.config.actions.guards.dedup_window_s
            if ended is not None and now - ended <= window and (starts is None or starts <= ended):
                self._decision(
                    alert, now, "deduplicated", f"same incident as the ladder that ended at {ended}"
                )
                return
            if name not in self.alerts.local_rule_names():
                self._decision(alert, now, "ignored", "no local rule of that name")
                return
        self._start(alert, now, {})

    def _superseded(self, lad: L.Ladder) -> bool:
        """A ladder that only Alertmanager alerts about other pods (or none) started
        refuses its pod steps; once this pod's own alert fires it starts over here."""
        if self.addressed.here(lad.alertname, lad.instances):
            return False
        return any(self._scope(s.action) == "pod" for s in lad.steps)

    def _scope(self, action: str) -> str:
        return self.registry.get(action).scope if action in self.registry else "pod"

    def _refusal(self, lad_name: str, instances: Mapping[str, str], action: str) -> str | None:
        lease = self.config.actions.scale.lease.backend
        return self.addressed.refusal(lad_name, instances, self._scope(action), lease)

    def _start(self, alert: Alert, now: float, carried: dict[str, AlertSource]) -> None:
        steps = self.alerts.steps_for(alert)
        if not steps:
            if alert.source == "alertmanager":
                self._decision(alert, now, "ignored", "the rule has no remediation ladder")
            return
        instances: dict[str, AlertSource] = {**carried, alert.fp: alert.source}
        why = [self._refusal(alert.name, instances, s.action) for s in steps]
        if all(why):
            # nothing of the ladder may run here: record why, start nothing
            self._decision(alert, now, "refused", str(why[0]))
            return
        lad = L.Ladder.new(alert.name, steps, now, alert.trigger, instances)
        self.ladders[alert.name] = lad
        self.on_change()
        self.record(lad, "started", now)
        # Run the first step right away: reaction within the tick that fired.
        self._feed(lad, L.Tick(now))

    def _refuse_instance(self, lad: L.Ladder, alert: Alert, now: float) -> None:
        """One more firing instance than a ladder tracks: counted; audited once per ladder."""
        self.instances_refused += 1
        if lad.id not in self._capped:
            self._capped.add(lad.id)
            self._decision(
                alert,
                now,
                "capped",
                f"the ladder of {lad.alertname} tracks {MAX_LADDER_INSTANCES} instances at "
                "most; further ones are counted (kcops_ladder_instances_refused_total), "
                "not tracked",
            )

    def _decision(self, alert: Alert, now: float, what: str, why: str) -> None:
        self.audit.append(AlertRecord(ts=now, event=what, detail=why, trigger=alert.trigger))

    # -- ladders ------------------------------------------------------------------

    def record(
        self,
        lad: L.Ladder,
        event: str,
        now: float,
        d: L.Audit | None = None,
        by: Trigger | None = None,
    ) -> None:
        """A ``kind: ladder`` record; ``d``'s fields and ``by`` only when set."""
        extra: dict[str, str | list[str] | Trigger] = {}
        if d is not None:
            if d.why is not None:
                extra["why"] = d.why
            if d.ran is not None:
                extra["ran"] = list(d.ran)
            if d.refused is not None:
                extra["refused"] = list(d.refused)
            if d.skipped:
                extra["skipped"] = list(d.skipped)
        if by is not None:
            extra["by"] = by
        rec = LadderRecord(
            ts=now,
            event=event,
            alertname=lad.alertname,
            step=lad.step,
            steps=[s.action for s in lad.steps],
            phase=lad.phase,
            mode=self.config.actions.mode,
            trigger=lad.trigger,
            **extra,
        )
        self.audit.append(rec)

    def _close(self, lad: L.Ladder, now: float, why: str, by: Trigger | None = None) -> None:
        self.ladders.pop(lad.alertname, None)
        if why != "superseded":
            self.addressed.forget(lad.alertname)
        self._capped.discard(lad.id)
        self.ended[lad.alertname] = now
        self.on_change()
        self.record(lad, why, now, by=by)

    def tick(self, now: float) -> None:
        for name, lad in list(self.ladders.items()):
            until = lad.unconfirmed_until
            if until is not None:
                if self.active(name):
                    lad = self._feed(lad, L.Confirmed(now))
                elif now < until:
                    continue  # hold: neither climb nor resolve before the rules catch up
                else:
                    self._close(lad, now, "resolved")
                    continue
            if lad.phase is not L.Phase.RUNNING and not self.active(name):
                self._close(lad, now, "resolved")
                continue
            if lad.phase is L.Phase.RUNNING and lad.run_id is None:
                # Running when the last agent stopped: its run is lost; verify as if it ran.
                self._feed(lad, L.Decided(now, None))
            elif lad.phase is not L.Phase.RUNNING:
                self._feed(lad, L.Tick(now))

    def _run_ended(self, name: str, run: Run) -> None:
        """A run that acted has ended (its task's done callback): its ladder steps now."""
        lad = self.ladders.get(name)
        if lad is None or lad.phase is not L.Phase.RUNNING or lad.run_id != run.id:
            return  # the ladder closed (resolved, superseded) while its run went on
        self._feed(lad, self._decided(run, self.clock()))

    @staticmethod
    def _decided(run: Run, now: float) -> L.Decided:
        return L.Decided(now, run.outcome, run.id, run.error, dict(run.params))

    def _feed(self, lad: L.Ladder, ev: L.Event) -> L.Ladder:
        """Step the ladder and carry out its decisions; bounded, each pass moves forward.
        Returns the ladder kept (the last step's)."""
        retry_s = self.config.actions.guards.retry_s
        for _ in range(2 * len(lad.steps) + 4):
            new, decisions = L.step(lad, ev, retry_s=retry_s)
            if new != lad or decisions:
                self.on_change()
            lad = self.ladders[new.alertname] = new
            nxt: L.Event | None = None
            for d in decisions:
                nxt = self._carry_out(lad, d, ev.now) or nxt
            if nxt is None:
                break
            ev = nxt
        return lad

    def _carry_out(self, lad: L.Ladder, d: L.Decision, now: float) -> L.Event | None:
        if isinstance(d, L.Submit):
            why = self._refusal(lad.alertname, lad.instances, d.step.action)
            run = self.runner.submit(
                d.step.action,
                d.step.params,
                now=now,
                trigger=lad.trigger,
                ladder=lad.ref(),
                refuse=ActionRejected(why, Refusal.NOT_THIS_POD) if why else None,
            )
            if not run.done:
                assert run.task is not None
                name = lad.alertname
                run.task.add_done_callback(lambda _: self._run_ended(name, run))
                return L.Submitted(now, run.id)
            return self._decided(run, now)
        if isinstance(d, L.Audit):
            self.record(lad, d.event, now, d)
        elif isinstance(d, L.Escalate):
            if d.page:
                self.pager.page(d.message, alertname=lad.alertname)
            else:
                self.pager.ticket(d.message, d.severity, lad.alertname, now)
        elif isinstance(d, L.HoldRestore):
            hold = hold_of(d.params, self.config.actions.fallback.hold_s)
            self.restores.hold(lad.alertname, d.run_id, hold)
        return None
