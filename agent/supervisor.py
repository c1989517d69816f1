"""Engine supervision: ``kcops agent run -- ENGINE CMD…`` launches and owns the engine.

The child runs in its own session (process group) so signals reach every
process it forks. A requested restart is graceful:

1. drain (:meth:`Supervisor._drain`): stop admitting where the engine can (the
   kcops worker's ``/admin/drain``, vLLM's ``/pause`` in dev mode) and wait
   until nothing runs or the drain deadline; an engine that drains by itself on
   SIGTERM (vLLM ``--shutdown-timeout N``, N > 0) is left to do so; any other
   engine is given until it is idle or the deadline, while it still admits;
2. SIGTERM to the whole group, SIGKILL after the grace period:
   ``actions.restart.grace_s`` plus the engine's own drain time ``N``
   (:mod:`kcops.agent.engine.shutdown`), so kcops never cuts vLLM's drain short;
3. once every member of the group is gone, remove the POSIX shared memory that
   tree held and left (:mod:`kcops.agent.engine.shm`), then respawn at once.

A restart abandoned before the kill resumes admitting.
A crash respawns after an exponential backoff; too many crashes within the
window is a crash loop: the supervisor stops and pages. The supervisor is the
one owner of restarts: while it backs off, ``restart_worker`` is refused.

How the child died is recorded as what is known (exit code, signal, whether
the supervisor sent it); an out-of-memory verdict needs evidence and is the
process watcher's (:mod:`kcops.agent.collectors.procwatch`), never a guess
from SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from kcops.agent.config.actions import RestartSection
from kcops.agent.engine import Engine, proctree, series, shm
from kcops.agent.engine import lifecycle as lc
from kcops.agent.engine.shutdown import engine_drain_s
from kcops.agent.samples import Sample, SeriesKey

log = logging.getLogger("kcops.agent.supervisor")

PR_SET_PDEATHSIG = 1
# After SIGKILL (or a crash), how long to wait for every member of the group to be
# gone before the shared memory is reaped: a dying process still maps its segments.
GONE_WAIT_S = 10.0


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the agent dies, even by SIGKILL.

    The engine runs in its own session (so restarts can signal its whole
    group); without this an agent killed hard would leave it orphaned.
    """
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    name = "supervisor"

    def __init__(
        self,
        command: list[str],
        cfg: RestartSection,
        *,
        clock: Callable[[], float],
        store: Any = None,
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
        self.page = page or (lambda message, **kw: log.error("PAGE: %s", message))
        self.env = env
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
        self.last_exit_info: dict[str, Any] | None = None
        self.proc_root = proc_root
        self.shm_root = shm_root
        self.shm_scan_s = shm_scan_s
        # What the current engine generation holds in shared memory (one per spawn).
        self.shm = shm.Ledger(shm_root, proc_root, shm_scan_s)
        self.shm_removed_total = 0
        # Reaps a crashed tree's shared memory once the group is gone; respawn waits on it.
        self._reaper: asyncio.Task[None] | None = None

    # -- process handling ----------------------------------------------------------

    def backing_off(self) -> str | None:
        """Why the supervisor owns the engine's next start now, or None."""
        if self.gave_up:
            return "the engine is in a crash loop; supervision stopped"
        if self.respawn_at is not None:
            return (
                "the supervisor is backing off after the engine exited "
                f"({self.last_exit}) and respawns it at {self.respawn_at:.0f}"
            )
        return None

    def pid(self) -> int | None:
        if self.proc is None or self.proc.returncode is not None:
            return None
        return self.proc.pid

    async def _spawn(self) -> None:
        self.shm = shm.Ledger(self.shm_root, self.proc_root, self.shm_scan_s)
        self.shm.spawning()
        self.proc = await asyncio.create_subprocess_exec(
            *self.command,
            start_new_session=True,
            env={**os.environ, **(self.env or {})},
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self._waiter = asyncio.get_running_loop().create_task(self.proc.wait())
        self.started_at = self.clock()
        self.ready = False
        self.respawn_at = None
        if self.engine is not None:
            self.engine.observe(lc.Spawned(self.started_at))
        log.info("engine started: pid %d: %s", self.proc.pid, " ".join(self.command))

    def _group_alive(self, pgid: int) -> bool:
        """True while a member of the group is alive (zombies do not count)."""
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return bool(proctree.group_pids(pgid, self.proc_root))

    async def _wait_gone(self, pgid: int, timeout_s: float) -> bool:
        """Wait until no member of the group is alive; False at the deadline."""
        deadline = time.monotonic() + timeout_s
        while self._group_alive(pgid):
            if time.monotonic() >= deadline:
                log.warning("engine process group %d still alive after %.0fs", pgid, timeout_s)
                return False
            await asyncio.sleep(0.05)
        return True

    def _scan_shm(self, pgid: int, force: bool = False) -> None:
        """Note the shared memory the group holds now (every few seconds unless ``force``)."""
        now_s = time.monotonic()
        if force or self.shm.due(now_s):
            self.shm.scan(proctree.group_pids(pgid, self.proc_root), now_s)

    def engine_drain_s(self) -> int:
        """Seconds the engine drains by itself after SIGTERM (vLLM --shutdown-timeout)."""
        return engine_drain_s(self.command, self.pid(), self.proc_root)

    async def _terminate(self, grace_s: float) -> bool:
        """SIGTERM the engine's main process, SIGKILL its whole group after ``grace_s``.
        True when SIGKILL was needed.

        SIGTERM goes to the root only, as a container runtime sends it: vLLM's API
        server then stops its engine core, which stops its workers, in order (a
        worker that gets SIGTERM itself exits at once, and the engine core could no
        longer finish the requests it drains). Members still alive once the root is
        gone get SIGTERM then (nobody else will tell them). Waits for the whole
        group, not only the root: a worker that outlives its parent still holds
        memory and shared segments.
        """
        if self.proc is None or self._waiter is None or self.proc.returncode is not None:
            return False
        pgid = self.proc.pid
        self._scan_shm(pgid, force=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        await asyncio.wait([self._waiter], timeout=grace_s)
        if self._waiter.done() and self._group_alive(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
        while self._group_alive(pgid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if not self._group_alive(pgid):
            await asyncio.wait([self._waiter], timeout=GONE_WAIT_S)
            return False
        self._scan_shm(pgid, force=True)
        self._killing_pid = pgid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        await asyncio.wait([self._waiter], timeout=GONE_WAIT_S)
        await self._wait_gone(pgid, GONE_WAIT_S)
        return True

    def _reap_shm(self, ledger: shm.Ledger | None = None) -> list[str]:
        """Remove the shared memory a dead tree held and left (call once it is gone)."""
        removed = (ledger or self.shm).reap()
        self.shm_removed_total += len(removed)
        return removed

    async def _reap_when_gone(self, pgid: int, ledger: shm.Ledger) -> None:
        await self._wait_gone(pgid, GONE_WAIT_S)
        self._reap_shm(ledger)

    async def _running_requests(self) -> int | None:
        if self.engine is None:
            return None
        try:
            got = await self.engine.in_flight()
        except Exception:
            got = None
        if got is None and self.store is not None:
            value = series.read(self.store, self.engine.adapter, {"kcops_requests_running": sum})
            running = value.get("requests_running")
            got = int(running) if running is not None else None
        return got

    async def _drain(self, drain: dict[str, Any]) -> None:
        """Stop admitting where the engine can, then wait until nothing runs or the
        drain deadline. Fills ``drain`` as it goes, so an abandoned restart knows
        what to undo; ``how`` says what was done:

        - ``drain`` / ``pause``: the engine stopped admitting (kcops worker, vLLM dev mode);
        - ``sigterm``: it cannot stop admitting but drains by itself on SIGTERM (vLLM
          ``--shutdown-timeout N``, N > 0): nothing to wait for here;
        - ``wait_idle``: neither: wait for an idle moment, while it still admits.
        """
        deadline_s = self.cfg.drain_deadline_s
        t0 = time.monotonic()
        n = drain["engine_drain_s"]
        how = None
        if self.engine is not None:
            # Noted before it is asked: an abandoned restart resumes even when it was
            # cancelled while the engine was still answering.
            how = drain["how"] = await self.engine.admission_control()
            try:
                await self.engine.stop_admitting(deadline_s)
            except Exception as exc:
                log.warning("stop admitting failed: %s", exc)
                drain["error"] = f"{type(exc).__name__}: {exc}"[:300]
        if how is None and n > 0:
            drain.update(how="sigterm", in_flight_left=await self._running_requests())
            return
        drain["how"] = how or "wait_idle"
        running = await self._running_requests()
        while running and time.monotonic() - t0 < deadline_s:
            await asyncio.sleep(0.2)
            running = await self._running_requests()
        drain.update(drained=None if running is None else running == 0, in_flight_left=running)

    async def _resume(self, drain: dict[str, Any]) -> bool:
        """Admit again (after a pause or drain); True when the engine was asked to."""
        how = drain.get("how")
        if self.engine is None or how not in ("drain", "pause"):
            return False
        try:
            await self.engine.resume_admitting(how)
        except Exception as exc:
            log.warning("resume admitting failed: %s", exc)
            return False
        return True

    def _serving_again(self) -> None:
        if self.engine is not None:
            self.engine.draining = None

    # -- the restart ---------------------------------------------------------------

    async def restart(self, reason: str = "requested") -> dict[str, Any]:
        """Graceful restart; returns before/after pids. Raises RuntimeError after a crash loop."""
        async with self._lock:
            why = self.backing_off()
            if why is not None:
                raise RuntimeError(why)
            old = self.pid()
            t0 = time.monotonic()
            n = self.engine_drain_s()
            drain: dict[str, Any] = {"how": None, "engine_drain_s": n}
            if self.engine is not None:
                self.engine.draining = f"restart ({reason})"
            try:
                if old is not None:
                    await self._drain(drain)
                    # vLLM holds requests that came during a pause and aborts them at
                    # SIGTERM; when it drains by itself, let them in first: SIGTERM stops
                    # admitting, and they get its N seconds to finish.
                    if n > 0 and drain["how"] == "pause":
                        drain["resumed_before_sigterm"] = await self._resume(drain)
            except BaseException:
                await self._resume(drain)  # abandoned before the kill: admit again
                self._serving_again()
                raise
            try:
                killed = await self._terminate(self.cfg.grace_s + n)
                removed = self._reap_shm()
                await self._spawn()  # starting: not serving until its health check passes
            finally:
                self._serving_again()
            self.restarts += 1
            self.publish(self.clock())
            detail = f"engine restarted ({reason}): pid {old} -> {self.pid()}"
            if killed:
                detail += " (SIGKILL after grace)"
            log.warning(detail)
            return {
                "detail": detail,
                "before": {"pid": old},
                "after": {"pid": self.pid()},
                "drain": drain if old is not None else None,
                "killed": killed,
                "grace_s": self.cfg.grace_s + n,
                "shm_removed": removed,
                "seconds": round(time.monotonic() - t0, 3),
            }

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

    # -- component ----------------------------------------------------------------

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
        # What is known, nothing guessed: a SIGKILL is a kill; OOM needs evidence
        # (cgroup oom_kill, kernel log, engine log), which the process watcher reads.
        sig = -returncode if returncode < 0 else None
        self.last_exit_info = {
            "pid": pid,
            "returncode": returncode,
            "signal": signal.Signals(sig).name if sig else None,
            "by_supervisor": pid is not None and pid == self._killing_pid,
            "t": now,
        }
        if self.engine is not None:
            self.engine.observe(lc.Exited(now))
        if self.proc is not None:
            pgid = self.proc.pid
            if self._group_alive(pgid):
                self._scan_shm(pgid, force=True)
                with contextlib.suppress(OSError):
                    os.killpg(pgid, signal.SIGKILL)  # leftovers of a dead root
            # Reap once every member is gone (a dying process still maps its
            # segments); the respawn waits for it.
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

    def publish(self, now: float) -> None:
        if self.store is not None:
            self.store.add([Sample.of("kcops_engine_restarts_total", self.restarts)], now)

    async def stop(self) -> None:
        """Stop the engine with the agent: a short teardown grace, plus the engine's own
        drain time (vLLM --shutdown-timeout) so requests in flight still finish."""
        self._stopping = True
        await self._terminate(min(self.cfg.grace_s, 3.0) + self.engine_drain_s())
        if self._reaper is not None:
            await asyncio.wait([self._reaper], timeout=GONE_WAIT_S + 1)
        if self.proc is not None:
            await self._wait_gone(self.proc.pid, GONE_WAIT_S)
        self._reap_shm()

    def status(self) -> dict[str, Any]:
        pid = self.pid()
        healthy = pid is not None and not self.gave_up
        summary = (
            "crash loop: supervision stopped"
            if self.gave_up
            else f"engine pid {pid}, {self.restarts} restart(s)"
            if pid
            else f"engine down (last exit {self.last_exit}), respawn pending"
        )
        return {
            "healthy": healthy,
            "summary": summary,
            "pid": pid,
            "restarts": self.restarts,
            "command": self.command,
            "last_exit": self.last_exit,
            "crash_loop": self.gave_up,
            "ready": self.ready,
            "last_exit_info": self.last_exit_info,
            "shm_removed_total": self.shm_removed_total,
        }

    def routes(self) -> list[web.RouteDef]:
        return []
