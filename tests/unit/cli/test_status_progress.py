"""`kcops status` says what the stall watch sees, and says so when it cannot watch."""

from __future__ import annotations

from kcops.cli.status import format_status, progress_line

BASE = {
    "version": "0", "pid": 1, "uptime_s": 10, "ticks": 10, "tick_s": 1.0, "series": 5,
    "mode": "enforce", "engine_url": "http://127.0.0.1:8000", "components": {},
}  # fmt: skip


def test_a_stalled_engine_reads_with_its_pending_work_and_the_canary() -> None:
    progress = {
        "watched": True, "verdict": "still", "pending": 3.0, "stalled_s": 7.0,
        "canary": {"enabled": True, "last": {"outcome": "timeout", "duration_s": 3.0}},
    }  # fmt: skip
    text = format_status({**BASE, "engine": {"state": "stalled", "progress": progress}}, now=10)
    assert "progress stalled; 3 pending, still for 7s; canary timeout in 3s" in text


def test_an_engine_without_progress_counters_never_reads_healthy() -> None:
    progress = {
        "watched": False,
        "why": "not watched: every progress counter unknown; the engine does not read as healthy",
        "kind_lacks": "tgi exports no progress counter (tokens or engine steps); ...",
    }
    line = progress_line("ready", progress)
    assert line.startswith("ready; stall detection off: tgi exports no progress counter")
