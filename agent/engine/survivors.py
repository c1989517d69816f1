"""An old engine's processes that outlive SIGKILL, and whether a new one may start beside.

A process stuck in the kernel (``D`` state, a hung GPU driver) or in a frozen cgroup takes
no signal, SIGKILL included. After the kill the supervisor asks :meth:`Survivors.blocked`:
the members still alive are reported (pid, ``/proc`` state, command), logged and counted
(``kcops_engine_stuck_processes``, until they are gone at last). A new engine starts
beside them on a CPU engine, where memory allows; not where the agent sees a GPU, whose
memory they still hold (``actions.restart.beside_survivors``): the supervisor then stops
and escalates.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from kcops.agent.config.actions import RestartSection
from kcops.agent.engine import proctree

if TYPE_CHECKING:
    from kcops.agent.store import Store

log = logging.getLogger("kcops.agent.engine.supervisor")


class Survivors:
    def __init__(self, cfg: RestartSection, store: Store | None, proc_root: Path) -> None:
        self.cfg = cfg
        self.store = store
        self.proc_root = proc_root
        self.stuck: dict[int, list[int]] = {}  # pgid -> its members that outlived SIGKILL
        self.refusal: str | None = None  # why no engine starts beside them (None: one may)

    def blocked(self, pgid: int) -> bool:
        """After the kill of group ``pgid``: True when members survive and no new engine may
        start beside them (:attr:`refusal` says why, naming them)."""
        pids = proctree.group_pids(pgid, self.proc_root)
        if not pids:
            return False
        self.stuck[pgid] = pids
        named = ", ".join(proctree.describe(p, self.proc_root) for p in pids[:8])
        log.error("engine process group %d outlived SIGKILL: %s", pgid, named)
        if self._beside_allowed():
            return False
        self.refusal = (
            f"the old engine's processes outlive SIGKILL: {named}; no second engine is "
            "started beside them on the device (actions.restart.beside_survivors)"
        )
        return True

    def count(self) -> int:
        """Stuck processes still alive (a group whose members are all gone is forgotten)."""
        for pgid in list(self.stuck):
            self.stuck[pgid] = proctree.group_pids(pgid, self.proc_root)
            if not self.stuck[pgid]:
                del self.stuck[pgid]
                log.info("the stuck processes of engine group %d are gone at last", pgid)
        return sum(len(p) for p in self.stuck.values())

    def _beside_allowed(self) -> bool:
        choice = self.cfg.beside_survivors
        if choice != "auto":
            return choice == "allow"
        return not self._sees_gpu()

    def _sees_gpu(self) -> bool:
        """True when the agent reads a GPU's memory (NVML: a device other than "cpu")."""
        if self.store is None:
            return False
        keys = self.store.keys("kcops_device_memory_total_bytes")
        return any(k.label_dict().get("device", "cpu") != "cpu" for k in keys)
