"""Outcomes of an action run: the values of ``kcops_action_runs_total{outcome}``.

They are also the ``outcome`` field of every ``kind: action`` audit record.
A refusal (``refused``, ``invalid``, ``skipped_*``) never ran, spent no
cooldown and no budget; the audit record's ``refusal`` field holds the
reason code (``unsupported``, ``not_configured``, ``no_target``,
``at_bound``, ``engine_refused``, ``supervisor_owns``, ``cooldown``, ...).
"""

from __future__ import annotations

from enum import StrEnum


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

    @property
    def ran(self) -> bool:
        """It acted (or, dry run, would have): the ladder waits its verify window or climbs."""
        return self in RAN

    @property
    def not_applicable(self) -> bool:
        """It cannot act here: the ladder moves to the next step without spending anything."""
        return self in (Outcome.REFUSED, Outcome.INVALID)


RAN = frozenset({Outcome.OK, Outcome.DRY_RUN, Outcome.FAILED, Outcome.TIMEOUT})

# Guard refusals, by ActionRejected.reason.
SKIPPED = {
    "cooldown": Outcome.SKIPPED_COOLDOWN,
    "budget": Outcome.SKIPPED_BUDGET,
    "busy": Outcome.SKIPPED_BUSY,
    "off": Outcome.SKIPPED_OFF,
    "starting": Outcome.SKIPPED_STARTING,
}


def of_refusal(reason: str) -> Outcome:
    """The outcome of an ActionRejected with this reason code."""
    if reason in SKIPPED:
        return SKIPPED[reason]
    if reason in ("invalid", "unknown"):
        return Outcome.INVALID
    return Outcome.REFUSED
