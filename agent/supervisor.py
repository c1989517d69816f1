"""Engine supervision: ``kcops agent run -- ENGINE CMD…`` launches and owns the engine.

The child runs in its own session (process group) so signals reach every
process it forks. A requested restart is graceful — stop admitting (the kcops
worker's drain, vLLM's ``/pause`` in dev mode), wait until nothing runs or the
drain deadline, SIGTERM to the whole group, SIGKILL after the grace period —
removes the POSIX shared memory the dead tree left (:mod:`kcops.agent.engine.shm`)
and respawns at once; a restart abandoned before the kill resumes admitting.
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
from typing import Any

from aiohttp import web

from kcops.agent.config.actions import RestartSection
from kcops.agent.engine import Engine, series, shm
from kcops.agent.engine import lifecycle as lc
from kcops.agent.samples import Sample, SeriesKey

log = logging.getLogger("kcops.agent.supervisor")

PR_SET_PDEATHSIG = 1


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
        self._shm_before: set[str] = set()
        self.shm_removed_total = 0

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
        self._shm_before = shm.snapshot()
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

    def _signal(self, sig: int) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def _group_alive(self, pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    async def _terminate(self, grace_s: float) -> bool:
        """SIGTERM the group, SIGKILL after ``grace_s``. True when SIGKILL was needed.

        Waits for the whole group, not only the child: a worker process that
        outlives its parent still holds memory and shared segments.
        """
        if self.proc is None or self._waiter is None or self.proc.returncode is not None:
            return False
        pgid = self.proc.pid
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        await asyncio.wait([self._waiter], timeout=grace_s)
        while self._group_alive(pgid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._waiter.done() and not self._group_alive(pgid):
            return False
        self._killing_pid = pgid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        await asyncio.wait([self._waiter], timeout=5.0)
        return True

    def _reap_shm(self) -> list[str]:
        """Remove the shared memory the dead tree left (only entries new since its spawn)."""
        removed = shm.cleanup(self._shm_before)
        self.shm_removed_total += len(removed)
        return removed

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

    async def _drain(self) -> dict[str, Any] | None:
        """Stop admitting, then wait until nothing runs or the drain deadline."""
        if self.engine is None:
            return None
        deadline_s = self.cfg.drain_deadline_s
        t0 = time.monotonic()
        try:
            how = await self.engine.stop_admitting(deadline_s)
        except Exception as exc:
            log.warning("drain request failed: %s", exc)
            return None
        if how is None:
            return None
        running = await self._running_requests()
        while running and time.monotonic() - t0 < deadline_s:
            await asyncio.sleep(0.2)
            running = await self._running_requests()
        return {"how": how, "drained": not running, "in_flight_left": running}

    async def _resume(self, drain: dict[str, Any] | None) -> None:
        if self.engine is None or not drain:
            return
        try:
            await self.engine.resume_admitting(drain.get("how"))
        except Exception as exc:
            log.warning("resume after an abandoned restart failed: %s", exc)

    # -- the restart ---------------------------------------------------------------

    async def restart(self, reason: str = "requested") -> dict[str, Any]:
        """Graceful restart; returns before/after pids. Raises RuntimeError after a crash loop."""
        async with self._lock:
            why = self.backing_off()
            if why is not None:
                raise RuntimeError(why)
            old = self.pid()
            t0 = time.monotonic()
            drain = None
            try:
                drain = await self._drain() if old is not None else None
                killed = await self._terminate(self.cfg.grace_s)
            except BaseException:
                await self._resume(drain)  # abandoned before the kill: admit again
                raise
            removed = self._reap_shm()
            await self._spawn()
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
                "drain": drain,
                "killed": killed,
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
        if (
            self.respawn_at is not None
            and now >= self.respawn_at
            and not self.gave_up
            and self.pid() is None
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
        with contextlib.suppress(OSError):
            if self.proc is not None and self._group_alive(self.proc.pid):
                os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers of a dead root
        self._reap_shm()
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
        self._stopping = True
        await self._terminate(min(self.cfg.grace_s, 3.0))
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
