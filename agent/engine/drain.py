"""Draining the engine before a supervised restart, and undoing it when abandoned.

Stop admitting where the engine can (its kind's drain or pause route), then
wait until nothing runs or the drain deadline. A :class:`DrainReport` is filled
as it goes, so an abandoned restart knows what to undo; its ``how``: ``drain`` /
``pause`` (the engine stopped admitting), ``sigterm`` (it drains by itself on
SIGTERM, vLLM's ``--shutdown-timeout N > 0``: nothing to wait for here) or
``wait_idle`` (neither: wait for an idle moment, while it still admits).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, TypedDict

from kcops.agent.engine import series
from kcops.agent.engine.engine import Engine

if TYPE_CHECKING:
    from kcops.agent.store import Store

log = logging.getLogger("kcops.agent.engine.supervisor")


class DrainReport(TypedDict, total=False):
    how: str | None
    engine_drain_s: int  # seconds the engine drains by itself after SIGTERM
    drained: bool | None  # None: nothing says how many requests run
    in_flight_left: int | None
    error: str  # stopping admission failed (the restart goes on)
    resumed_before_sigterm: bool


async def running_requests(engine: Engine | None, store: Store | None) -> int | None:
    """Requests running now: the engine's admin state, else its scraped series."""
    if engine is None:
        return None
    try:
        got = await engine.in_flight()
    except Exception:
        got = None
    if got is None and store is not None:
        value = series.read(store, engine.adapter, {"kcops_requests_running": sum})
        running = value.get("requests_running")
        got = int(running) if running is not None else None
    return got


async def drain(
    engine: Engine | None, store: Store | None, deadline_s: float, report: DrainReport
) -> None:
    """Stop admitting where the engine can, then wait until nothing runs or ``deadline_s``."""
    t0 = time.monotonic()
    n = report.get("engine_drain_s", 0)
    how = None
    if engine is not None:
        # Noted before it is asked: an abandoned restart resumes even when it was
        # cancelled while the engine was still answering.
        how = report["how"] = await engine.admission_control()
        log.info(
            "drain: stopping admission (%s), %.2fs after the drain began",
            how or "cannot",
            time.monotonic() - t0,
        )
        try:
            await engine.stop_admitting(deadline_s)
        except Exception as exc:
            log.warning("stop admitting failed: %s", exc)
            report["error"] = f"{type(exc).__name__}: {exc}"[:300]
    if how is None and n > 0:
        report["how"] = "sigterm"
        report["in_flight_left"] = await running_requests(engine, store)
        return
    report["how"] = how or "wait_idle"
    running = await running_requests(engine, store)
    while running and time.monotonic() - t0 < deadline_s:
        await asyncio.sleep(0.2)
        running = await running_requests(engine, store)
    report["drained"] = None if running is None else running == 0
    report["in_flight_left"] = running


async def resume(engine: Engine | None, report: DrainReport) -> bool:
    """Admit again (after a pause or drain); True when the engine was asked to."""
    how = report.get("how")
    if engine is None or how not in ("drain", "pause"):
        return False
    try:
        await engine.resume_admitting(how)
    except Exception as exc:
        log.warning("resume admitting failed: %s", exc)
        return False
    return True
