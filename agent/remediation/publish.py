"""Remediation's metrics: the samples it adds to the store each tick."""

from __future__ import annotations

from collections.abc import Mapping

from kcops.agent.outcome import PAGE, ActionName, Outcome
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.paging import Paged
from kcops.agent.samples import Sample


def samples(
    runs: Mapping[tuple[ActionName, Outcome], int],
    pages: Mapping[Paged, int],
    desired_replicas: int | None,
    instances_refused: int,
    state_files_set_aside: int,
    audit: AuditLog,
) -> list[Sample]:
    """``runs``: (action, outcome) -> count; ``pages``: outcome -> count (action "page")."""
    runs_total: list[tuple[dict[str, str], int]]
    runs_total = [({"action": a, "outcome": o}, n) for (a, o), n in runs.items()]
    runs_total += [({"action": PAGE, "outcome": o}, n) for o, n in pages.items()]
    out = [Sample.of("kcops_action_runs_total", n, labels) for labels, n in runs_total]
    if desired_replicas is not None:
        out.append(Sample.of("kcops_desired_replicas", desired_replicas))
    out += [
        Sample.of("kcops_ladder_instances_refused_total", instances_refused),
        Sample.of("kcops_state_files_set_aside_total", state_files_set_aside),
        Sample.of("kcops_audit_torn_repairs_total", audit.torn_repairs),
        Sample.of("kcops_audit_write_errors_total", audit.write_errors),
        Sample.of("kcops_audit_records_held", audit.held),
        Sample.of("kcops_audit_records_dropped_total", audit.dropped),
        Sample.of("kcops_audit_repeats_suppressed_total", audit.repeats.suppressed),
    ]
    return out
