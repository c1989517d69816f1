"""Engine supervision: ``kcops agent run -- ENGINE CMD…`` launches and owns the engine.

The child runs in its own session (process group) so signals reach every
process it forks. A requested restart is graceful — stop admitting (the
engine's drain endpoint, where it has one), wait for in-flight requests up
to the drain deadline, SIGTERM, SIGKILL after the grace period — and
respawns at once. A crash respawns after an exponential backoff; too many
crashes within the window is a crash loop: the supervisor stops and pages.
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

from kcops.agent.actions.engine import EngineAdmin
from kcops.agent.config.actions import RestartSection
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
        engine: EngineAdmin | None = None,
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

    # -- process handling ----------------------------------------------------------

    def engine_last_exit(self) -> dict[str, Any] | None:
        """How the last child exited: pid, returncode, and whether it looks like OOM.

        A SIGKILL the supervisor did not send is most likely the kernel's OOM killer.
        """
        return self.last_exit_info

    def pid(self) -> int | None:
        if self.proc is None or self.proc.returncode is not None:
            return None
        return self.proc.pid

    async def _spawn(self) -> None:
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

    async def _terminate(self, grace_s: float) -> bool:
        """SIGTERM, then SIGKILL after ``grace_s``. Returns True when SIGKILL was needed."""
        if self.proc is None or self._waiter is None or self.proc.returncode is not None:
            return False
        self._signal(signal.SIGTERM)
        done, _ = await asyncio.wait([self._waiter], timeout=grace_s)
        if done:
            return False
        self._killing_pid = self.proc.pid
        self._signal(signal.SIGKILL)
        await asyncio.wait([self._waiter], timeout=5.0)
        return True

    async def _drain(self) -> dict[str, Any] | None:
        if self.engine is None:
            return None
        try:
            out = await self.engine.drain(admit=False)
        except Exception as exc:
            log.warning("drain request failed: %s", exc)
            return None
        if out is None:
            return None
        deadline = time.monotonic() + self.cfg.drain_deadline_s
        in_flight = out.get("in_flight", 0)
        while in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            try:
                in_flight = (await self.engine.state()).get("in_flight", 0)
            except Exception:
                break
        return {"drained": not in_flight, "in_flight_left": in_flight}

    # -- the restart ---------------------------------------------------------------

    async def restart(self, reason: str = "requested") -> dict[str, Any]:
        """Graceful restart; returns before/after pids. Raises RuntimeError after a crash loop."""
        async with self._lock:
            if self.gave_up:
                raise RuntimeError("engine is in a crash loop; supervision stopped")
            old = self.pid()
            t0 = time.monotonic()
            drain = await self._drain() if old is not None else None
            killed = await self._terminate(self.cfg.grace_s)
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
        self.last_exit_info = {
            "pid": pid,
            "returncode": returncode,
            "t": now,
            "oom": returncode == -signal.SIGKILL and pid != self._killing_pid,
        }
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
        if self.engine is not None:
            await self.engine.aclose()

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
        }

    def routes(self) -> list[web.RouteDef]:
        return []
