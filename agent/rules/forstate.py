"""Alert ``for`` state kept across agent restarts, as Prometheus keeps ``ALERTS_FOR_STATE``.

Prometheus restores each active alert's ``ActiveAt`` after a restart from the newest
``ALERTS_FOR_STATE`` sample (rules/group.go ``RestoreForState``). kcops's store lives in
memory, so the same record (per alert instance: ``active_at`` and ``seen_at``, the time of
the newest sample) is kept in ``<state_dir>/alerts_for_state.json`` and restored by
Prometheus's rule (:func:`restored_active_at`): not for a rule whose ``for`` is shorter
than the grace period, nor for an alert last seen before ``ts - outage_tolerance``.

The file is written atomically, bounded (:data:`MAX_ENTRIES` alerts, :data:`MAX_FILE_BYTES`
read), and one that cannot be read back is moved aside (``.corrupt``) with a warning: the
agent starts with no ``for`` state, never fails to start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kcops.agent.atomicfile import remove_stale_temps, write_bytes_atomic
from kcops.agent.promql.model import Labels, labels_of
from kcops.agent.rules.engine import RuleEngine
from kcops.agent.rules.group import Group

log = logging.getLogger("kcops.agent.rules")

FILE_NAME = "alerts_for_state.json"
MAX_ENTRIES = 10_000
MAX_FILE_BYTES = 8 << 20


@dataclass(frozen=True)
class ForState:
    """One alert's ``ALERTS_FOR_STATE``: its ``active_at`` and when it was last seen."""

    active_at: float
    seen_at: float


Saved = dict[str, dict[Labels, ForState]]


def restored_active_at(
    active_at: float, down_at: float, ts: float, hold_s: float, grace_s: float
) -> float:
    """The ``active_at`` an alert gets back at ``ts`` (Prometheus's ``RestoreForState``)."""
    remaining = hold_s - (down_at - active_at)
    if remaining <= 0:
        return active_at  # it was firing: it fires again at the next evaluation
    if remaining < grace_s:
        return ts + grace_s - hold_s  # at least the grace period is left
    return active_at + (ts - down_at)  # the time it was down does not count


Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    rule: Annotated[str, Field(max_length=256)]
    labels: Annotated[dict[str, Annotated[str, Field(max_length=2048)]], Field(max_length=65)]
    active_at: Finite
    seen_at: Finite


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    version: Literal[1]
    alerts: Annotated[list[_Entry], Field(max_length=MAX_ENTRIES)]


def read_saved(path: Path) -> Saved:
    """The saved state; {} when there is none, and (with a warning) when it is corrupt."""
    remove_stale_temps(path)  # left by a process killed between write and rename
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("alert for-state %s cannot be read (%s); not restored", path, exc.strerror)
        return {}
    try:
        if len(raw) > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
        doc = _File.model_validate_json(raw)
    except (ValueError, ValidationError) as exc:
        aside = path.with_suffix(path.suffix + ".corrupt")
        with contextlib.suppress(OSError):
            os.replace(path, aside)
        why = " ".join(str(exc).split())[:200]
        log.warning(
            "alert for-state %s is corrupt (%s); moved to %s, not restored", path, why, aside
        )
        return {}
    out: Saved = {}
    for e in doc.alerts:
        out.setdefault(e.rule, {})[labels_of(e.labels)] = ForState(e.active_at, e.seen_at)
    return out


def encode_saved(saved: Saved) -> bytes:
    # Strict JSON (issue 24): an entry whose times are not finite is not saved (the
    # loader would refuse it, and a bare NaN is not JSON).
    alerts = [
        {"rule": rule, "labels": dict(labels), "active_at": st.active_at, "seen_at": st.seen_at}
        for rule, insts in sorted(saved.items())
        for labels, st in sorted(insts.items())
        if math.isfinite(st.active_at) and math.isfinite(st.seen_at)
    ][:MAX_ENTRIES]
    doc = {"version": 1, "alerts": alerts}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


class ForStateKeeper:
    """Keeps the ``for`` state of the rule set's alerts, restores it once per group.

    Until a group is restored its rules' saved entries stay as loaded (as
    Prometheus writes no ``ALERTS_FOR_STATE`` before the restore)."""

    def __init__(
        self, path: Path, engine: RuleEngine, grace_s: float, outage_tolerance_s: float
    ) -> None:
        self.path = path
        self.engine = engine
        self.grace_s = grace_s
        self.outage_tolerance_s = outage_tolerance_s
        names = {r.name for r in engine.ruleset.alerts()}
        self.saved: Saved = {k: v for k, v in read_saved(path).items() if k in names}
        self._written: bytes | None = None
        self.restored_total = 0

    def restore(self, group: Group, ts: float) -> int:
        """Restore ``active_at`` of the group's active alerts at ``ts``; how many were."""
        n = 0
        for rule in group.alerts:
            if rule.for_s < self.grace_s:
                continue
            saved = self.saved.get(rule.name, {})
            state = self.engine.states[rule.name]
            for labels, inst in list(state.items()):
                st = saved.get(labels)
                if st is None or st.seen_at < ts - self.outage_tolerance_s:
                    continue
                at = restored_active_at(st.active_at, st.seen_at, ts, rule.for_s, self.grace_s)
                if math.isfinite(at):
                    state[labels] = replace(inst, active_at=at)
                    n += 1
        group.restored = True
        self.restored_total += n
        if n:
            log.info("restored the 'for' state of %d alert(s) of group %s", n, group.name)
        return n

    def record(self, group: Group, now: float) -> None:
        """Take the group's active alerts as they are after its evaluation at ``now``."""
        if not group.restored:
            return
        for rule in group.alerts:
            if self.engine.health[rule.name].error:
                continue  # a failed evaluation writes nothing (Prometheus: no sample)
            insts = self.engine.states[rule.name]
            if insts:
                self.saved[rule.name] = {
                    labels: ForState(inst.active_at, now) for labels, inst in insts.items()
                }
            else:
                self.saved.pop(rule.name, None)

    def payload(self) -> bytes | None:
        """The file's new content, or None when it has not changed since the last write."""
        data = encode_saved(self.saved)
        return None if data == self._written else data

    def write(self, payload: bytes) -> None:
        try:
            write_bytes_atomic(self.path, payload)
        except OSError as exc:
            log.warning("cannot save alert for-state %s: %s", self.path, exc.strerror or exc)
            return
        self._written = payload
