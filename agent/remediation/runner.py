"""The runner: every action goes through it, and it owns every guard.

``submit`` checks mode, parameters, prechecks, one-in-flight, cooldown and
budget; then either records a dry run or starts the action as an asyncio task
(the loop never waits on an action). An action's read-only ``look`` runs before
it acts in both modes, so a dry run refuses exactly where an enforcing run
would. The task audits, counts and traces the outcome, so a run from a ladder,
the control API or the Alertmanager webhook is accounted for the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING

from opentelemetry.trace import Span, Status, StatusCode, Tracer
from pydantic import JsonValue

from kcops.agent import outcome as outcome_mod
from kcops.agent.actions.base import (
    ActionContext,
    ActionResult,
    ActionSpec,
    Check,
    Params,
    Registry,
    SupervisorHandle,
)
from kcops.agent.clock import Clock
from kcops.agent.config import Config
from kcops.agent.engine import Engine
from kcops.agent.outcome import ActionName, ActionRejected, Outcome, Refusal
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.guards import BreakerOpen, Guards
from kcops.agent.remediation.records import JSONObject, LadderRef, Run, Trigger

if TYPE_CHECKING:
    from kcops.agent.actions.base import Replicas
    from kcops.agent.store import Store

log = logging.getLogger("kcops.agent.actions")


async def _always() -> bool:
    return True


class Runner:
    def __init__(
        self,
        config: Config,
        registry: Registry,
        guards: Guards,
        audit: AuditLog,
        engine: Engine,
        tracer: Tracer,
        clock: Clock,
        *,
        replicas: Replicas | None = None,
        supervisor: SupervisorHandle | None = None,
        store: Store | None = None,
        on_change: Callable[[], None] = lambda: None,
        on_breaker: Callable[[str, Run], None] = lambda scope, run: None,
        durable: Callable[[], Awaitable[bool]] = _always,
    ) -> None:
        self.config = config
        self.registry = registry
        self.guards = guards
        self.audit = audit
        self.engine = engine
        self.tracer = tracer
        self.clock = clock
        self.replicas = replicas
        self.supervisor = supervisor
        self.store = store
        self.on_change = on_change
        self.on_breaker = on_breaker
        # Waits until the guard state changed so far is on disk (remediation's state file).
        self.state_durable = durable
        self.counts: dict[tuple[ActionName, Outcome], int] = {}
        self.tasks: set[asyncio.Task[object]] = set()
        self._seq = itertools.count(1)
        self._boot = uuid.uuid4().hex[:6]

    # -- bookkeeping ----------------------------------------------------------

    def count(self, action: ActionName, outcome: Outcome) -> None:
        """One more in ``kcops_action_runs_total{action,outcome}``."""
        key = (action, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1

    def _finish(self, run: Run, outcome: Outcome, error: str | None = None) -> None:
        run.outcome = outcome
        run.error = error
        self.count(run.action, outcome)
        stream = run.stream
        rkey = run.repeat_key()
        what: JSONObject = {
            "action": run.action, "target": run.target, "outcome": outcome,
            "refusal": run.refusal, "alertname": stream[3] or None,
        }  # fmt: skip
        self.audit.append(run.record(), stream=stream, key=rkey, of=what)
        level = logging.INFO if outcome in (Outcome.OK, Outcome.DRY_RUN) else logging.WARNING
        log.log(
            level,
            "action %s on %s: %s%s%s",
            run.action,
            run.target,
            outcome,
            f" ({error})" if error else "",
            f" [{run.result.detail}]" if run.result and run.result.detail else "",
        )

    def _span(self, run: Run, outcome: Outcome, error: str | None) -> None:
        """A zero-length span for a run decided without executing (dry run, refusal)."""
        span = self.tracer.start_span(f"action {run.action}", start_time=int(run.t * 1e9))
        self._span_attrs(span, run, outcome)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=int(run.t * 1e9))

    @staticmethod
    def _span_attrs(span: Span, run: Run, outcome: Outcome) -> None:
        span.set_attribute("kcops.action", run.action)
        span.set_attribute("kcops.target", run.target)
        span.set_attribute("kcops.mode", run.mode)
        span.set_attribute("kcops.outcome", outcome)
        span.set_attribute("kcops.run_id", run.id)
        if run.ladder:
            span.set_attribute("kcops.alertname", run.ladder.alertname)
            span.set_attribute("kcops.step", run.ladder.step)

    # -- submit --------------------------------------------------------------------

    def submit(
        self,
        action: ActionName,
        params: Mapping[str, JsonValue] | None = None,
        *,
        now: float | None = None,
        trigger: Trigger | None = None,
        ladder: LadderRef | None = None,
        force: bool = False,
        reason: str | None = None,
        dry_run: bool = False,
        refuse: ActionRejected | None = None,
    ) -> Run:
        """Decide and (maybe) start one run. Never raises for a refusal: see ``run.outcome``.

        ``refuse``: the caller found the run not applicable here (a ladder step out of
        the scope of the alert that started it); it is recorded as that refusal.

        A returned run whose ``done`` is False is executing; await ``run.task``.
        """
        now = self.clock() if now is None else now
        mode = self.config.actions.mode
        if dry_run and mode == "enforce":
            mode = "dry-run"
        run = Run(
            id=f"{self._boot}-{next(self._seq)}",
            action=action,
            params=dict(params or {}),
            target=self._target(action, trigger),
            mode=mode,
            t=now,
            trigger=trigger,
            ladder=ladder,
            forced=force,
            reason=reason,
        )
        owner = ladder.id if ladder is not None and ladder.id else None
        decided = self._decide(run, owner, refuse)
        if decided is None:
            return run
        spec, parsed = decided
        if dry_run or mode == "dry-run":
            # A dry-run agent keeps its guards as if it acted, so its log shows the
            # decisions (cooldowns, budget) an enforcing agent would take. A one-off
            # dry run asked of an enforcing agent is a question: it must not spend
            # the real cooldown or budget.
            spend = not dry_run
            if spec.look is None:
                self._dry(run, owner, spend)
            else:  # the same read-only look as enforce: "would refuse" where it refuses
                self._start(run, self._dry_look(run, spec, parsed, owner, spend))
            return run
        self.guards.start(action, run.target, run.id, now, owner)
        self.on_change()
        # On record before it acts (durable: _execute awaits it), so that a kill -9
        # while it runs leaves it, and the cooldown it spent, explained.
        seq = self.audit.append(run.started(), stream=run.stream)
        self._start(run, self._execute(run, spec, parsed, seq))
        return run

    def _target(self, action: str, trigger: Trigger | None) -> str:
        spec = self.registry.find(action)
        alertname = trigger.alertname if trigger is not None else None
        return spec.target_of(alertname) if spec is not None else "engine"

    def _start(self, run: Run, coro: Coroutine[object, object, None]) -> None:
        run.task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(run.task)
        run.task.add_done_callback(self.tasks.discard)

    def _dry(self, run: Run, owner: str | None, spend: bool, note: str = "") -> None:
        if spend:
            self.guards.start(run.action, run.target, run.id, run.t, owner)
            self.guards.finish(run.target)
            self.on_change()
        run.result = ActionResult(detail=f"dry run: would run {run.action} {run.params}{note}")
        self._finish(run, Outcome.DRY_RUN)
        self._span(run, Outcome.DRY_RUN, None)

    async def _dry_look(
        self, run: Run, spec: ActionSpec, parsed: Params, owner: str | None, spend: bool
    ) -> None:
        assert spec.look is not None
        note = ""
        try:
            await asyncio.wait_for(
                spec.look(self._context(run), parsed),
                timeout=self.config.actions.guards.action_timeout_s,
            )
        except ActionRejected as exc:
            self._refuse(run, exc)  # spends nothing, as an enforcing run gives it back
            return
        except Exception as exc:  # enforce would fail or time out: it would still run
            note = f" (could not look first: {type(exc).__name__}: {str(exc)[:200]})"
        self._dry(run, owner, spend, note)

    def _context(self, run: Run) -> ActionContext:
        return ActionContext(
            config=self.config,
            engine=self.engine,
            target=run.target,
            now=run.t,
            supervisor=self.supervisor,
            store=self.store,
            replicas=self.replicas,
        )

    @staticmethod
    async def _act(spec: ActionSpec, actx: ActionContext, parsed: Params) -> ActionResult:
        if spec.look is not None:
            await spec.look(actx, parsed)
        return await spec.fn(actx, parsed)

    def _decide(
        self, run: Run, owner: str | None, refuse: ActionRejected | None = None
    ) -> tuple[ActionSpec, Params] | None:
        """Parameters, mode, applicability, then guards; None when refused (recorded)."""
        try:
            if run.forced and not (isinstance(run.reason, str) and run.reason.strip()):
                raise ActionRejected("force needs a reason", Refusal.INVALID)
            spec = self.registry.get(run.action)
            parsed = spec.parse(run.params)
            run.params = parsed.model_dump(mode="json")
            if run.mode == "off":
                raise ActionRejected("remediation mode is off", Refusal.OFF)
            if refuse is not None:
                raise refuse
            # Applicability before guards: a step that cannot act here spends nothing.
            check = Check(self.config, self.engine, self.supervisor, run.t)
            if run.target == "engine" and self.engine.tracked:
                self.engine.not_starting()
                self._not_respawning(run.action)
            if spec.precheck is not None:
                spec.precheck(check, parsed)
            self.guards.check(run.action, run.target, run.t, force=run.forced, owner=owner)
        except BreakerOpen as exc:
            self._refuse(run, exc)
            for scope in exc.opened:
                self.on_breaker(scope, run)
            return None
        except ActionRejected as exc:
            self._refuse(run, exc)
            return None
        return spec, parsed

    def _not_respawning(self, action: str) -> None:
        """Refuse (``starting``: a ladder retries) an engine action while the supervisor
        respawns the engine: the engine is gone and comes back by itself; an OOM ladder's
        lower_topn then acts on the new engine instead of failing on the dead one.
        restart_worker decides for itself (``supervisor_owns``)."""
        sup = self.supervisor
        if action != ActionName.RESTART_WORKER and sup is not None and sup.respawning():
            raise ActionRejected(f"{sup.backing_off()}: acting once it is back", Refusal.STARTING)

    def _refuse(self, run: Run, exc: ActionRejected) -> None:
        outcome = outcome_mod.of_refusal(exc.reason)
        run.refusal = exc.reason
        if run.mode == "dry-run" and outcome is Outcome.REFUSED:
            run.result = ActionResult(detail=f"dry run: would refuse: {exc}")
        self._finish(run, outcome, str(exc))
        self._span(run, outcome, str(exc))

    async def _execute(
        self, run: Run, spec: ActionSpec, parsed: Params, started: int | None = None
    ) -> None:
        why = await self._durable(started)
        if why is not None:  # it did not act: it gives back what it took
            self.guards.refund(run.action, run.target, run.t)
            self.guards.finish(run.target)
            self._refuse(run, ActionRejected(why, Refusal.NOT_DURABLE))
            self.on_change()
            return
        by = run.trigger.source if run.trigger is not None else None
        log.info("action %s on %s: started (%s)", run.action, run.target, by or "unknown")
        t0 = time.monotonic()
        outcome, error = Outcome.OK, None
        with self.tracer.start_as_current_span(
            f"action {run.action}", start_time=int(run.t * 1e9)
        ) as span:
            actx = self._context(run)
            try:
                run.result = await asyncio.wait_for(
                    self._act(spec, actx, parsed),
                    timeout=self.config.actions.guards.action_timeout_s,
                )
            except TimeoutError:
                outcome, error = Outcome.TIMEOUT, "timed out"
            except ActionRejected as exc:
                # Found out only while acting (at a bound, the engine said 400): it
                # did not act, so it gives back the cooldown and budget it took.
                outcome, error = outcome_mod.of_refusal(exc.reason), str(exc)
                run.refusal = exc.reason
                self.guards.refund(run.action, run.target, run.t)
            except asyncio.CancelledError:
                outcome, error = Outcome.FAILED, "cancelled (agent stopping)"
                raise
            except Exception as exc:
                outcome, error = Outcome.FAILED, f"{type(exc).__name__}: {exc}"
            finally:
                run.duration_s = time.monotonic() - t0
                self._span_attrs(span, run, outcome)
                if error:
                    span.set_status(Status(StatusCode.ERROR, error))
                self.guards.finish(run.target)
                self._finish(run, outcome, error)
                self.on_change()

    async def _durable(self, started: int | None) -> str | None:
        """Wait, at most ``actions.guards.durable_wait_s``, for the run's started record and
        the guard state it spent to be on disk (the disk writes on threads of its own: the
        loop goes on). None once both are; else why not, and the run must not act: a
        crash while it acted would leave no record of it, and a restarted agent free to
        repeat it."""
        bound = self.config.actions.guards.durable_wait_s
        waits = [
            asyncio.ensure_future(self.audit.sync(started)),
            asyncio.ensure_future(self.state_durable()),
        ]
        done, pending = await asyncio.wait(waits, timeout=bound)
        for w in pending:
            w.cancel()
        if pending:
            return f"its records did not reach the disk within {bound:g}s (a slow disk)"
        if not all(w.result() for w in done):
            return f"the disk refuses its records ({self.audit.last_error or 'state file'})"
        return None

    async def drain(self, timeout_s: float) -> None:
        """Wait for runs in flight, then cancel what is left."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(list(self.tasks), timeout=timeout_s)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
