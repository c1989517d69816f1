"""A rule group at runtime: its rules, its interval, its limit, its evaluation grid.

As Prometheus's rules/group.go runs a group: each group is evaluated on its
own grid of slots ``offset + k * interval`` (``offset``: a stable hash of the
group's file and name, so groups of one interval do not all run at once), and
an evaluation is stamped with its slot, not with the moment it ran. On each
agent tick a group whose newest slot it has not evaluated yet is evaluated at
that slot; slots skipped by a slow tick are counted as missed. A group without
an ``interval`` (or ``0s``) is evaluated at each agent tick; one with an interval
first at the first slot after the agent started, as Prometheus waits for it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from kcops.agent.rules.loader import AlertRule, GroupSpec, Rule


def grid_offset_ms(file: str, name: str, interval_ms: int) -> int:
    """The group's phase on its grid: a stable hash of (file, name) modulo the interval.

    Prometheus hashes the labels ``{name, file}`` with xxhash; any stable hash
    gives the same property (spread, and the same slot after a restart)."""
    digest = hashlib.sha256(f"{file}\xff{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % interval_ms


def eval_slot_ms(now_ms: int, interval_ms: int, offset_ms: int) -> int:
    """The newest slot at or before ``now_ms`` (Prometheus's ``Group.EvalTimestamp``)."""
    adj = now_ms - offset_ms
    return adj - adj % interval_ms + offset_ms


@dataclass
class Group:
    """One group at runtime. :meth:`due` says when to evaluate; the engine evaluates."""

    spec: GroupSpec
    file: str
    default_interval_s: float
    iterations: int = 0
    missed: int = 0
    last_slot: float | None = None
    restored: bool = False
    _offset_ms: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.on_tick:
            return
        self._offset_ms = grid_offset_ms(self.file, self.name, self.interval_ms)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.spec.rules

    @property
    def alerts(self) -> list[AlertRule]:
        return [r for r in self.spec.rules if isinstance(r, AlertRule)]

    @property
    def limit(self) -> int:
        """Series (or alerts) one rule may produce per evaluation; 0: no limit."""
        return self.spec.limit or 0

    @property
    def on_tick(self) -> bool:
        """True when the group has no interval of its own: it runs on every agent tick."""
        return self.spec.interval_s is None

    @property
    def interval_s(self) -> float:
        s = self.spec.interval_s
        return self.default_interval_s if s is None else s

    @property
    def interval_ms(self) -> int:
        return max(1, round(self.interval_s * 1000))

    @property
    def offset_s(self) -> float:
        return self._offset_ms / 1000

    def slot(self, now: float) -> float:
        """The evaluation timestamp of the newest slot at or before ``now``."""
        if self.on_tick:
            return now
        now_ms = math.floor(now * 1000 + 1e-6)
        return eval_slot_ms(now_ms, self.interval_ms, self._offset_ms) / 1000

    def due(self, now: float) -> float | None:
        """The slot to evaluate at on the tick at ``now``, or None when it is done already.

        Counts the evaluation as an iteration, and the slots between the last
        one evaluated and this one as missed iterations."""
        slot = self.slot(now)
        last = self.last_slot
        if last is None and not self.on_tick:
            # Prometheus waits for the first slot after the start; this one has passed.
            self.last_slot = slot
            return None
        if last is not None and slot <= last:
            return None
        if last is not None and not self.on_tick:
            skipped = round((slot - last) * 1000) // self.interval_ms - 1
            if skipped > 0:
                self.missed += skipped
                self.iterations += skipped
        self.iterations += 1
        self.last_slot = slot
        return slot


def build_groups(specs: tuple[GroupSpec, ...], file: str, default_interval_s: float) -> list[Group]:
    return [Group(spec, file, default_interval_s) for spec in specs]
