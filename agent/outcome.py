"""The names of actions, outcomes of a run (``kcops_action_runs_total{action,outcome}``),
refusal codes and ladder phases: the bottom of the agent, so the engine's refusals are typed.

An :class:`Outcome` is also the ``outcome`` field of every ``kind: action``
audit record. A refusal (``refused``, ``invalid``, ``skipped_*``) never ran,
spent no cooldown and no budget; the audit record's ``refusal`` field holds
its :class:`Refusal` code. docs/remediation.md lists the same codes (a unit
test compares the two).
"""

from __future__ import annotations

from enum import StrEnum

from kcops.errors import KcopsError


class ActionName(StrEnum):
    """Every action kcops runs, by the name rules, the API and the audit use."""

    EVICT_CACHE = "evict_cache"
    FALLBACK_TO_BASE = "fallback_to_base"
    RESTORE_ROUTE = "restore_route"  # kcops's own, after a fallback's hold time
    LOWER_TOPN = "lower_topn"
    RAISE_TOPN = "raise_topn"
    RESTART_WORKER = "restart_worker"
    EVICT_POD = "evict_pod"  # kcops's own, after a crash loop
    SCALE_OUT = "scale_out"
    NOTIFY = "notify"


# Not an action: pages count in kcops_action_runs_total{action="page"} beside the runs.
PAGE = "page"


class Outcome(StrEnum):
    OK = "ok"
    FAILED = "failed"  # it ran and did not work (engine said no, error)
    TIMEOUT = "timeout"
    DRY_RUN = "dry_run"
    REFUSED = "refused"  # not applicable: unsupported, not configured, no target, at bound
    INVALID = "invalid"  # bad parameters or unknown action
    SKIPPED_COOLDOWN = "skipped_cooldown"
    SKIPPED_BUDGET = "skipped_budget"
    SKIPPED_BUSY = "skipped_busy"
    SKIPPED_OFF = "skipped_off"
    SKIPPED_STARTING = "skipped_starting"
    # Its started record or the guard state it spent did not reach the disk in time
    # (actions.guards.durable_wait_s): it did not act.
    SKIPPED_NOT_DURABLE = "skipped_not_durable"
    # Written by a restarted agent for a run that had started (``kind: started``) and
    # has no outcome: the agent was killed while it ran. It may have acted.
    INTERRUPTED = "interrupted"

    @property
    def ran(self) -> bool:
        """It acted (or, dry run, would have): the ladder waits its verify window or climbs."""
        return self in RAN

    @property
    def not_applicable(self) -> bool:
        """It cannot act here: the ladder moves to the next step without spending anything."""
        return self in (Outcome.REFUSED, Outcome.INVALID)


class Phase(StrEnum):
    """Where a ladder stands (the ``phase`` of its audit records)."""

    RUN = "run"  # the current step is due
    RUNNING = "running"  # its action is executing
    VERIFY = "verify"  # waiting for the verify window to show resolution
    EXHAUSTED = "exhausted"  # every step done or refused, escalated; waiting for resolution
    BLOCKED = "blocked"  # breaker open, paged; waiting for resolution


class Refusal(StrEnum):
    """Why a run did not act: ``ActionRejected.reason`` and the audit record's ``refusal``."""

    UNSUPPORTED = "unsupported"  # the engine or the deployment cannot do it
    NOT_CONFIGURED = "not_configured"
    NO_TARGET = "no_target"
    AT_BOUND = "at_bound"  # top-N or replicas already at their bound
    ENGINE_REFUSED = "engine_refused"  # the engine answered 400 while acting
    SUPERVISOR_OWNS = "supervisor_owns"  # the supervisor backs off after a crash
    NOT_THIS_POD = "not_this_pod"  # an Alertmanager alert about another pod
    FORBIDDEN = "forbidden"  # the Kubernetes API said 401/403
    FENCED = "fenced"  # the fleet lease expired or moved before the write
    STARTING = "starting"  # the engine is still starting
    COOLDOWN = "cooldown"
    BUDGET = "budget"  # the hourly budget is spent (breaker)
    BUSY = "busy"  # another run of the same target is in flight
    OFF = "off"  # remediation mode is off
    NOT_DURABLE = "not_durable"  # its records did not reach the disk in time
    INVALID = "invalid"  # bad parameters
    UNKNOWN = "unknown"  # no such action


class ActionRejected(KcopsError):
    """A remediation action was refused (bad parameters, guard, mode): ``reason`` says why."""

    def __init__(self, message: str, reason: Refusal) -> None:
        super().__init__(message)
        self.reason = reason


RAN = frozenset({Outcome.OK, Outcome.DRY_RUN, Outcome.FAILED, Outcome.TIMEOUT})

# Guard refusals, by ActionRejected.reason.
SKIPPED: dict[Refusal, Outcome] = {
    Refusal.COOLDOWN: Outcome.SKIPPED_COOLDOWN,
    Refusal.BUDGET: Outcome.SKIPPED_BUDGET,
    Refusal.BUSY: Outcome.SKIPPED_BUSY,
    Refusal.OFF: Outcome.SKIPPED_OFF,
    Refusal.STARTING: Outcome.SKIPPED_STARTING,
    Refusal.NOT_DURABLE: Outcome.SKIPPED_NOT_DURABLE,
}


def of_refusal(reason: Refusal) -> Outcome:
    """The outcome of an ActionRejected with this reason code."""
    if reason in SKIPPED:
        return SKIPPED[reason]
    if reason in (Refusal.INVALID, Refusal.UNKNOWN):
        return Outcome.INVALID
    return Outcome.REFUSED
