"""Engine supervision: ``kcops agent run -- ENGINE CMD…`` launches and owns the engine.

The child runs in its own session (process group) so signals reach every process
it forks. A requested restart is graceful:

1. drain (:mod:`kcops.agent.engine.drain`): stop admitting where the engine can
   (the worker's ``/admin/drain``, vLLM's ``/pause`` in dev mode) and wait until
   nothing runs or the deadline; an engine that drains by itself on SIGTERM (vLLM
   ``--shutdown-timeout N``) is left to do so; any other is given until it is idle;
2. SIGTERM to the root, then the group, SIGKILL after ``actions.restart.grace_s``
   plus the engine's own drain time N (:mod:`kcops.agent.engine.terminate`,
   :mod:`kcops.agent.engine.shutdown`), so kcops never cuts vLLM's drain short;
3. once the whole group is gone, remove the POSIX shared memory that tree held
   (:mod:`kcops.agent.engine.shm`), then respawn at once.

A restart abandoned before the kill resumes admitting. A stalled or hung engine cannot
drain: ``restart(drain=False)`` skips 1 and SIGKILLs the group at once. Processes that
outlive SIGKILL are reported, and may keep a new engine from starting beside them
(:mod:`kcops.agent.engine.survivors`). A crash respawns after an exponential backoff; too
many within the window is a crash loop: supervision stops and pages. The supervisor is
the one owner of restarts: while it backs off, ``restart_worker`` is refused. How the
child died is recorded as what is known (exit code, signal, who sent it); an OOM verdict
needs evidence and is the process watcher's (:mod:`kcops.agent.collectors.procwatch`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import JsonValue, TypeAdapter

from kcops.agent.config.actions import RestartSection
from kcops.agent.engine import Engine, proctree, shm
from kcops.agent.engine import drain as dr
from kcops.agent.engine import lifecycle as lc
from kcops.agent.engine.output import OutputRing
from kcops.agent.engine.shutdown import engine_drain_s
from kcops.agent.engine.survivors import Survivors
from kcops.agent.engine.terminate import (
    GONE_WAIT_S,
    ExitInfo,
    die_with_parent,
    exit_info,
    group_alive,
    kill_group,
    terminate,
    wait_gone,
)
from kcops.agent.samples import Sample, SeriesKey
from kcops.tenant import KEY_ENV, tenant_key

if TYPE_CHECKING:
    from kcops.agent.store import Store

# A restart report is JSON all the way down: it becomes the action's audit record.
_REPORT: TypeAdapter[dict[str, JsonValue]] = TypeAdapter(dict[str, JsonValue])

log = logging.getLogger("kcops.agent.engine.supervisor")

__all__ = ["GONE_WAIT_S", "ExitInfo", "Supervisor"]


class Supervisor:
    name = "supervisor"

    def __init__(
        self,
        command: list[str],
        cfg: RestartSection,
        *,
        clock: Callable[[], float],
        store: Store | None = None,
        engine: Engine | None = None,
        page: Callable[..., None] | None = None,
        env: dict[str, str] | None = None,
        shm_root: Path = shm.SHM_ROOT,
        proc_root: Path = proctree.PROC,
        shm_scan_s: float = 5.0,
    ) -> None:
        if not command:
            raise ValueError("empty engine command")
        self.command = list(command)
        self.cfg = cfg
        self.clock = clock
        self.store = store
        self.engine = engine
        if engine is not None and engine.kind is None:  # adapter auto: the command may say
            found = engine.registry.detect_command(self.command)
            if found is not None:
                engine.learn(found.name)
        self.page = page or (lambda message, **kw: log.error("PAGE: %s", message))
        self.env = env
        self.tenant_key = tenant_key().decode()  # the agent's, so its canary signs with it
        self.proc: asyncio.subprocess.Process | None = None
        self._waiter: asyncio.Task[int] | None = None
        self.restarts = 0
        self.crashes: list[float] = []
        self.consecutive_crashes = 0
        self.respawn_at: float | None = None
        self.started_at: float | None = None
        self.gave_up = False
        self.last_exit: int | None = None
        self._lock = asyncio.Lock()
        self._stopping = False
        self._killing_pid: int | None = None
        self.ready = False
        self.last_exit_info: ExitInfo | None = None
        self.proc_root = proc_root
        self.shm_root = shm_root
        self.shm_scan_s = shm_scan_s
        self.shm = shm.Ledger(shm_root, proc_root, shm_scan_s)  # this generation's
        self.shm_removed_total = 0
        self._reaper: asyncio.Task[None] | None = None  # reaps a crashed tree; respawn waits
        self.survivors = Survivors(self.cfg, store, proc_root)
        self.output = OutputRing()  # one across respawns: the dead engine's last words stay

    def backing_off(self) -> str | None:
        """Why the supervisor owns the engine's next start now, or None."""
        if self.survivors.refusal is not None:
            return self.survivors.refusal
        if self.gave_up:
            return "the engine is in a crash loop; supervision stopped"
        code, wait = self.proc and self.proc.returncode, (self.respawn_at or 0.0) - self.clock()
        respawn = f"engine exited ({code}); the supervisor respawns it in {max(0.0, wait):.1f}s"
        return respawn if self.respawning() else None

    def respawning(self) -> bool:
        """True from an exit (even one the next tick has yet to see) until the respawn."""
        exited = self.proc is not None and self.proc.returncode is not None
        return (self.respawn_at is not None or exited) and not self.gave_up and not self._stopping

    def pid(self) -> int | None:
        if self.proc is None or self.proc.returncode is not None:
            return None
        return self.proc.pid

    async def _spawn(self) -> None:
        self.shm = shm.Ledger(self.shm_root, self.proc_root, self.shm_scan_s)
        self.shm.spawning()
        self.proc = await self.output.spawn(
            lambda out, err: asyncio.create_subprocess_exec(
                *self.command, stdout=out, stderr=err, start_new_session=True,
                # the key of vLLM's tenant markers (kernels/integrations/vllm_tenant); ours yields
                env={KEY_ENV: self.tenant_key, **os.environ, **(self.env or {})},
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        )  # fmt: skip
        self._waiter = asyncio.get_running_loop().create_task(self.proc.wait())
        self.started_at, self.ready, self.respawn_at = self.clock(), False, None
        if self.engine is not None:
            self.engine.observe(lc.Spawned(self.started_at))
        log.info("engine started: pid %d: %s", self.proc.pid, " ".join(self.command))

    def _scan_shm(self, pgid: int, force: bool = False) -> None:
        """Note the shared memory the group holds now (every few seconds unless ``force``)."""
        now_s = time.monotonic()
        if force or self.shm.due(now_s):
            self.shm.scan(proctree.group_pids(pgid, self.proc_root), now_s)

    def engine_drain_s(self) -> int:
        """Seconds the engine drains by itself after SIGTERM (vLLM --shutdown-timeout)."""
        return engine_drain_s(self.command, self.pid(), self.proc_root)

    async def _terminate(self, grace_s: float, at_once: bool = False) -> bool:
        """Stop the running tree (:func:`~kcops.agent.engine.terminate.terminate`), noting
        the shared memory it holds before each signal. True when SIGKILL was needed."""
        if self.proc is None or self._waiter is None or self.proc.returncode is not None:
            return False
        pgid = self.proc.pid
        killed = await terminate(
            pgid,
            self._waiter,
            grace_s,
            proc_root=self.proc_root,
            before_signal=lambda g: self._scan_shm(g, force=True),
            at_once=at_once,
        )
        if killed:
            self._killing_pid = pgid
        return killed

    def _reap_shm(self, ledger: shm.Ledger | None = None) -> list[str]:
        """Remove the shared memory a dead tree held and left (call once it is gone)."""
        removed = (ledger or self.shm).reap()
        self.shm_removed_total += len(removed)
        return removed

    async def _reap_when_gone(self, pgid: int, ledger: shm.Ledger) -> None:
        await kill_group(pgid, self.proc_root)
        await wait_gone(pgid, GONE_WAIT_S, self.proc_root)
        self._reap_shm(ledger)

    def _serving_again(self) -> None:
        if self.engine is not None:  # no longer draining: taken back into rotation
            self.engine.draining = None

    async def restart(
        self, reason: str = "requested", *, drain: bool = True
    ) -> dict[str, JsonValue]:
        """Graceful restart; returns before/after pids. Raises RuntimeError after a crash loop.
        ``drain=False`` (a stalled or hung engine cannot drain): SIGKILL the tree at once."""
        async with self._lock:
            why = self.backing_off()
            if why is not None:
                raise RuntimeError(why)
            old = self.pid()
            if self.engine is not None:  # what follows is the agent's doing (inhibited)
                self.engine.observe(lc.Restarting(self.clock()))
            t0 = time.monotonic()
            n = self.engine_drain_s()
            drain_report: dr.DrainReport = {"how": None, "engine_drain_s": n}
            if self.engine is not None:
                self.engine.draining = f"restart ({reason})"
            try:
                if old is not None and drain:
                    await dr.drain(self.engine, self.store, self.cfg.drain_deadline_s, drain_report)
                    # vLLM aborts at SIGTERM what a pause held; when it drains by itself,
                    # let those in first: SIGTERM stops admitting, they get its N seconds.
                    if n > 0 and drain_report["how"] == "pause":
                        drain_report["resumed_before_sigterm"] = await dr.resume(
                            self.engine, drain_report
                        )
            except BaseException:
                await dr.resume(self.engine, drain_report)  # abandoned before the kill: admit again
                self._serving_again()
                raise
            try:
                killed = await self._terminate(self.cfg.grace_s + n, at_once=not drain)
                if old is not None and self._blocked_by_survivors(old, page=False):
                    raise RuntimeError(self.survivors.refusal)  # the ladder's page says it
                removed = self._reap_shm()
                await self._spawn()  # starting: not serving until its health check passes
            finally:
                self._serving_again()
            self.restarts += 1
            self.publish(self.clock())
            detail = f"engine restarted ({reason}): pid {old} -> {self.pid()}"
            if killed:
                detail += " (SIGKILL after grace)" if drain else " (SIGKILL at once, no drain)"
            log.warning(detail)
            return _REPORT.validate_python({
                "detail": detail, "before": {"pid": old}, "after": {"pid": self.pid()},
                "drain": drain_report if old is not None and drain else None, "killed": killed,
                "grace_s": self.cfg.grace_s + n, "shm_removed": removed,
                "seconds": round(time.monotonic() - t0, 3),
            })  # fmt: skip

    def starting(self, now: float) -> bool:
        """True while the child has not been healthy since it started, within the grace."""
        if self.ready or self.started_at is None or self.pid() is None:
            return False
        return now - self.started_at < self.cfg.startup_grace_s

    def _check_ready(self) -> None:
        if self.ready or self.store is None or self.started_at is None:
            return
        got = self.store.latest(SeriesKey.of("kcops_engine_up"))
        if got is not None and got[0] >= self.started_at and got[1] == 1.0:
            self.ready = True

    def backoff_s(self) -> float:
        n = max(0, self.consecutive_crashes - 1)
        return float(min(self.cfg.backoff_max_s, self.cfg.backoff_initial_s * (2**n)))

    async def start(self) -> None:
        await self._spawn()

    async def tick(self, now: float) -> None:
        self._check_ready()
        if self._stopping or self._lock.locked():
            self.publish(now)
            return
        proc = self.proc
        crashed = proc is not None and proc.returncode is not None and self.respawn_at is None
        if crashed and proc is not None and proc.returncode is not None and not self.gave_up:
            self._crashed(proc.returncode, now)
        elif proc is not None and self.pid() is not None:
            self._scan_shm(proc.pid)  # what the running tree holds, every few seconds
        if (
            self.respawn_at is not None
            and now >= self.respawn_at
            and not self.gave_up
            and self.pid() is None
            and await self._reaped()
            and not (proc is not None and self._blocked_by_survivors(proc.pid))
        ):
            await self._spawn()
            self.restarts += 1
        if (
            self.consecutive_crashes
            and self.started_at is not None
            and self.pid() is not None
            and now - self.started_at >= self.cfg.stable_s
        ):
            self.consecutive_crashes = 0
        self.publish(now)

    async def _reaped(self) -> bool:
        """True once the crashed tree's shared memory was reaped (waits a moment for it:
        the group is usually gone within one pass of the loop)."""
        if self._reaper is not None and not self._reaper.done():
            await asyncio.wait([self._reaper], timeout=1.0)
        return self._reaper is None or self._reaper.done()

    def _crashed(self, returncode: int, now: float) -> None:
        self.last_exit = returncode
        pid = self.proc.pid if self.proc is not None else None
        self.last_exit_info = exit_info(pid, returncode, self._killing_pid, now)
        if self.engine is not None:
            self.engine.observe(lc.Exited(now))
        if self.proc is not None:
            pgid = self.proc.pid
            if group_alive(pgid, self.proc_root):
                self._scan_shm(pgid, force=True)
            # Kill the leftovers of a dead root (resource trackers last) and reap once
            # every member is gone (a dying process still maps its segments); the
            # respawn waits for it.
            self._reaper = asyncio.get_running_loop().create_task(
                self._reap_when_gone(pgid, self.shm)
            )
        self.crashes = [t for t in self.crashes if now - t < self.cfg.crash_loop_window_s]
        self.crashes.append(now)
        self.consecutive_crashes += 1
        if len(self.crashes) >= self.cfg.crash_loop_max:
            self.gave_up = True
            self.respawn_at = None
            self.page(
                f"engine crash loop: {len(self.crashes)} exits within "
                f"{self.cfg.crash_loop_window_s:g}s (last exit {returncode}); supervision stopped",
                last_exit=returncode,
            )
            return
        self.respawn_at = now + self.backoff_s()
        log.error("engine exited with %s; respawning in %.1fs", returncode, self.respawn_at - now)

    def _blocked_by_survivors(self, pgid: int, *, page: bool = True) -> bool:
        """True when the old group's survivors keep a new engine from starting (supervision
        stops; the page, and the pod's eviction with crash_loop: evict_pod, names them: the
        supervisor's, or the ladder's when an action asked for the restart)."""
        if not self.survivors.blocked(pgid):
            return False
        self.gave_up = True
        self.respawn_at = None
        if page:
            self.page(str(self.survivors.refusal), last_exit=self.last_exit)
        return True

    def publish(self, now: float) -> None:
        if self.store is not None:
            self.store.add(
                [
                    Sample.of("kcops_engine_restarts_total", self.restarts),
                    Sample.of("kcops_engine_stuck_processes", self.survivors.count()),
                ],
                now,
            )

    async def stop(self) -> None:
        """Stop the engine with the agent: a short teardown grace, plus the engine's own
        drain time (vLLM --shutdown-timeout) so requests in flight still finish."""
        self._stopping = True
        await self._terminate(min(self.cfg.grace_s, 3.0) + self.engine_drain_s())
        if self._reaper is not None:
            await asyncio.wait([self._reaper], timeout=GONE_WAIT_S + 1)
        if self.proc is not None:
            await wait_gone(self.proc.pid, GONE_WAIT_S, self.proc_root)
        self._reap_shm()
        await self.output.close()

    def status(self) -> dict[str, object]:
        pid = self.pid()
        up = f"engine pid {pid}, {self.restarts} restart(s)"
        down = f"engine down (last exit {self.last_exit}), respawn pending"
        summary = (self.backing_off() if self.gave_up else None) or (up if pid else down)
        return {
            "healthy": pid is not None and not self.gave_up,
            "summary": summary,
            "pid": pid,
            "restarts": self.restarts,
            "command": self.command,
            "last_exit": self.last_exit,
            "crash_loop": self.gave_up,
            "ready": self.ready,
            "last_exit_info": self.last_exit_info,
            "shm_removed_total": self.shm_removed_total,
            "stuck": {str(g): p for g, p in self.survivors.stuck.items()},
            "stuck_refusal": self.survivors.refusal,
        }

    def routes(self) -> list[web.RouteDef]:
        return []
