"""The incident component: one record per incident, its evidence taken before a restart.

A page-severity alert that fires opens an incident; every alert that fires while it is
open joins it (the agent's own restart and what it inhibits), and it closes once they
have all resolved, the engine serves again and nothing moved for ``SETTLE_S``. At the
opening, the engine's tree is captured off the loop within ``capture_budget_s``; a
restart waits for that capture (never longer than the budget), so the stacks are taken
before any signal. Records go to disk on the component's own writer thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from pydantic import JsonValue

from kcops.agent.atomicfile import Writer
from kcops.agent.config.agent import IncidentsSection
from kcops.agent.engine import Engine, EngineState
from kcops.agent.events import AlertTransition, EventBus
from kcops.agent.incidents import capture, series
from kcops.agent.incidents.book import MANIFEST, Book, Manifest
from kcops.agent.incidents.timeline import actions_of
from kcops.agent.samples import Sample
from kcops.agent.store import Store
from kcops.auth import TokenCheck

log = logging.getLogger("kcops.agent.incidents")

SETTLE_S = 5.0  # quiet time after the last alert resolved before the record closes
SERIES_BYTES = 2 << 20
MAX_ALERTS = 200  # alert instances one record keeps (an Alertmanager storm is counted past it)
MAX_TIMELINE = 1000
Output = Callable[[float], Awaitable[list[str]]]


class Incidents:
    name = "incidents"

    def __init__(
        self,
        cfg: IncidentsSection,
        folder: Path,
        store: Store,
        bus: EventBus,
        engine: Engine,
        root_pid: Callable[[], int | None],
        output: Output,
        audit_path: Path,
        auth: TokenCheck,
    ) -> None:
        self.cfg = cfg
        self.book = Book(folder, cfg.max_count, cfg.max_bytes)
        self.store = store
        self.bus = bus
        self.engine = engine
        self.root_pid = root_pid
        self.output = output
        self.audit_path = audit_path
        self.auth = auth
        self.writer = Writer("incidents")
        self.open: Manifest | None = None
        self.quiet_since: float | None = None
        self.capturing: asyncio.Task[None] | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.opened = 0
        self.alerts: dict[tuple[str, tuple[tuple[str, str], ...]], Manifest] = {}
        self.active: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        self.unsaved = False
        engine.incidents = self

    # -- the component ----------------------------------------------------------------

    async def start(self) -> None:
        marked = await self.writer.run(self.book.recover)
        if marked:
            log.warning("%d incident record(s) left open by the last agent: incomplete", marked)
        self.bus.subscribe(self.on_transition)

    async def tick(self, now: float) -> None:
        self.store.add(self.samples(), now)
        m = self.open
        if m is not None and self.unsaved:
            self.unsaved = False
            self._save(m)
        if m is None or self.quiet_since is None or now - self.quiet_since < SETTLE_S:
            return
        if self.engine.tracked and self.engine.state is not EngineState.READY:
            return  # the engine is not serving yet: the incident goes on
        if self.capturing is not None and not self.capturing.done():
            return
        self.open = None
        m["status"], m["closed_at"] = "closed", now
        self._spawn(self._close(m))

    async def stop(self) -> None:
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=2.0)
        self.writer.close()

    def status(self) -> dict[str, object]:
        return {
            "healthy": True,
            "open": None if self.open is None else self.open["id"],
            "opened": self.opened,
            "dropped": self.book.dropped,
            "capture_budget_s": self.cfg.capture_budget_s,
        }

    def samples(self) -> list[Sample]:
        return [
            Sample("kcops_incidents_open", (), float(self.open is not None)),
            Sample("kcops_incidents_opened_total", (), float(self.opened)),
            Sample("kcops_incidents_dropped_total", (), float(self.book.dropped)),
        ]

    def routes(self) -> list[web.RouteDef]:
        from kcops.agent.incidents.routes import build_routes

        return build_routes(self.book, self.writer, self.auth)

    # -- alerts in ------------------------------------------------------------------

    def on_transition(self, ev: AlertTransition) -> None:
        m = self.open
        firing = ev.state == "firing"
        if m is None:
            if not firing or ev.inhibited_by or ev.labels.get("severity", "page") != "page":
                return
            m = self._new(ev.alertname, ev.t)
        state: str = "resolved" if ev.state == "inactive" else ev.state
        if firing and ev.inhibited_by:
            state = "inhibited"
        key = (ev.alertname, tuple(sorted(ev.labels.items())))
        known = self.alerts.get(key)
        if known is None:
            alerts = m["alerts"]
            assert isinstance(alerts, list)
            if state == "resolved":
                return
            if len(alerts) >= MAX_ALERTS:  # a storm: counted, the record stays small
                m["alerts_over_cap"] = int(str(m.get("alerts_over_cap") or 0)) + 1
                return
            known = {"alertname": ev.alertname, "labels": dict(ev.labels), "first_t": ev.t,
                     "inhibited_by": ev.inhibited_by}  # fmt: skip
            alerts.append(known)
            self.alerts[key] = known
        known["state"] = state
        if state == "resolved":
            self.active.discard(key)
        else:
            self.active.add(key)
        self._event(m, ev.t, "alert", f"{ev.alertname} {state}", alertname=ev.alertname,
                    state=state)  # fmt: skip
        self.quiet_since = None if self.active else ev.t
        self.unsaved = True  # written at the next tick: a storm is one write per tick

    # -- what a restart asks (restart_worker, before any signal) -------------------------

    def current(self) -> str | None:
        return None if self.open is None else str(self.open["id"])

    async def keep(self, reason: str, now: float) -> str:
        """The evidence of the open incident (one opened for ``reason`` if none), captured
        before the caller signals the engine; waits at most the capture budget."""
        m = self.open or self._new(reason, now)
        t0, task = time.monotonic(), self.capturing
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), self.cfg.capture_budget_s + 1.0)
            except TimeoutError:
                log.warning("incident %s: capture still running; the restart goes on", m["id"])
        waited = time.monotonic() - t0
        self._event(m, now + waited, "capture", f"evidence kept before {reason} ({waited:.2f}s)")
        return str(m["id"])

    # -- inside ---------------------------------------------------------------------

    def _new(self, trigger: str, now: float) -> Manifest:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        m: Manifest = {
            "id": f"{stamp}-{secrets.token_hex(2)}",
            "opened_at": now,
            "closed_at": None,
            "status": "open",
            "why_incomplete": None,
            "trigger": trigger,
            "alerts": [],
            "timeline": [],
            "capture": None,
            "parts": {},
        }
        self.open, self.quiet_since = m, None
        self.alerts, self.active = {}, set()
        self.opened += 1
        self._event(m, now, "alert" if trigger[:1].isupper() else "action", f"opened: {trigger}")
        log.error("incident %s opened (%s): kcops incident show %s", m["id"], trigger, m["id"])
        self._spawn(self.writer.run(lambda: self.book.create(dict(m))))
        self.capturing = asyncio.get_running_loop().create_task(self._capture(m, now))
        return m

    async def _capture(self, m: Manifest, now: float) -> None:
        budget = self.cfg.capture_budget_s
        if budget <= 0:
            m["capture"] = {
                "started_at": now,
                "seconds": 0.0,
                "budget_s": 0.0,
                "complete": False,
                "missing": ["everything: capture is off (capture_budget_s: 0)"],
            }
            self._save(m)
            return
        t0 = time.monotonic()
        window = series.snapshot(self.store, now - self.cfg.series_window_s, now)
        found, output = await asyncio.gather(
            asyncio.to_thread(capture.processes, self.root_pid(), budget),
            self.output(budget),
        )
        procs, missing = found
        seconds = round(time.monotonic() - t0, 3)
        m["capture"] = {
            "started_at": now,
            "seconds": seconds,
            "budget_s": budget,
            "complete": not missing,
            "missing": list[JsonValue](missing),
        }
        self._spawn(self._write_parts(m, procs, output, window))

    async def _write_parts(
        self, m: Manifest, procs: list[dict[str, object]], output: list[str], window: series.Window
    ) -> None:
        text, cut = await asyncio.to_thread(series.render, window, SERIES_BYTES)
        cap = m["capture"]
        if cut and isinstance(cap, dict) and isinstance(cap["missing"], list):
            cap["missing"].append(f"series: cut at {SERIES_BYTES} bytes")
            cap["complete"] = False
        parts = {
            "processes.json": json.dumps(procs, indent=1, default=str).encode(),
            "output.txt": ("\n".join(output) + "\n").encode(errors="replace"),
            "series.om": text.encode(),
        }
        m["parts"] = {k: len(v) for k, v in parts.items()}
        id_, manifest = str(m["id"]), json.dumps(m, indent=1, default=str).encode()

        def write() -> None:  # the parts, then the manifest naming them, in one job: a read
            for name, data in parts.items():  # (on this thread too) sees both or neither
                self.book.write(id_, name, data)
            self.book.write(id_, MANIFEST, manifest)
            self.book.prune(keep=id_)

        await self.writer.run(write)

    async def _close(self, m: Manifest) -> None:
        t0, t1 = float(str(m["opened_at"])), float(str(m["closed_at"]))
        alerts, timeline = m["alerts"], m["timeline"]
        assert isinstance(alerts, list) and isinstance(timeline, list)
        names = {str(a["alertname"]) for a in alerts if isinstance(a, dict)}
        timeline += await asyncio.to_thread(actions_of, self.audit_path, t0 - 1.0, t1, names)
        timeline.sort(key=lambda e: float(str(e["t"])) if isinstance(e, dict) else 0.0)
        self._event(m, t1, "alert", "closed: every alert resolved and the engine serves")
        self._save(m)
        log.warning("incident %s closed", m["id"])

    def _event(self, m: Manifest, t: float, kind: str, what: str, **kw: JsonValue) -> None:
        timeline = m["timeline"]
        assert isinstance(timeline, list)
        if len(timeline) < MAX_TIMELINE:
            timeline.append({"t": t, "kind": kind, "what": what, **kw})
        else:
            m["timeline_over_cap"] = int(str(m.get("timeline_over_cap") or 0)) + 1

    def _save(self, m: Manifest) -> None:
        data, id_ = json.dumps(m, indent=1, default=str).encode(), str(m["id"])
        self._spawn(self.writer.run(lambda: self.book.write(id_, MANIFEST, data)))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
