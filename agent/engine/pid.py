"""Which process is the engine: one answer shared by every collector.

Sources, first that answers wins: ``engine.pid``; ``engine.pidfile`` (read each
time, so a restarted engine that rewrites it is followed); the child the agent
supervises (``supervisor_pid``, the supervisor's ``pid`` callable, set once the
supervisor is built, after the collectors); the
pid the kcops worker reports in ``GET /admin/state`` (``observed``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("kcops.agent.engine.pid")


class EnginePid:
    def __init__(
        self,
        *,
        pid: int | None = None,
        pidfile: Path | str | None = None,
        supervisor_pid: Callable[[], int | None] | None = None,
    ) -> None:
        self.pid = pid
        self.pidfile = Path(pidfile) if pidfile is not None else None
        self.supervisor_pid = supervisor_pid
        # Set by the engine HTTP client from the kcops worker's /admin/state.
        self.observed: int | None = None
        self.source: str | None = None
        self._warned: set[str] = set()

    @property
    def configured(self) -> bool:
        """True when some source may give a pid (used to decide which collectors run)."""
        return self.pid is not None or self.pidfile is not None

    def supervised(self) -> bool:
        return self.supervisor_pid is not None

    def resolve(self) -> int | None:
        """The engine's pid now, or None when no source knows it."""
        if self.pid is not None:
            self.source = "config"
            return self.pid
        if self.pidfile is not None:
            got = self._read_pidfile(self.pidfile)
            if got is not None:
                self.source = "pidfile"
                return got
        if self.supervisor_pid is not None:
            got = self.supervisor_pid()
            if got is not None:
                self.source = "supervisor"
                return int(got)
        if self.observed is not None:
            self.source = "admin_state"
            return self.observed
        self.source = None
        return None

    def _read_pidfile(self, path: Path) -> int | None:
        try:
            text = path.read_text().strip()
        except OSError as exc:
            self._warn_once(f"read:{path}", "pidfile %s: %s", path, exc.strerror)
            return None
        if not text.isdigit() or int(text) < 1:
            self._warn_once(f"parse:{path}", "pidfile %s holds %r, not a pid", path, text[:40])
            return None
        return int(text)

    def _warn_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)
