"""The runner isolates collector failures, counts them and marks series stale."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import pytest

from kcops.agent.collectors import CollectorRunner
from kcops.agent.samples import Sample, SeriesKey
from kcops.agent.store import Store
from kcops.errors import CollectorUnavailable


class Scripted:
    """A collector that returns, or raises, what the test scripts for each call."""

    def __init__(self, name: str, script: list[object]) -> None:
        self.name = name
        self.script = list(script)

    def collect(self, now: float) -> Iterable[Sample]:
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[return-value]


class Slow:
    """An async read that never answers: only the runner's timeout ends it."""

    name = "slow"

    async def collect(self, now: float) -> Iterable[Sample]:
        await asyncio.Event().wait()
        return []


def errors(st: Store, collector: str, reason: str) -> float | None:
    got = st.latest(
        SeriesKey.of("kcops_collector_errors_total", {"collector": collector, "reason": reason})
    )
    return None if got is None else got[1]


def test_one_broken_collector_does_not_stop_the_others() -> None:
    st = Store()
    ok = Scripted("ok", [[Sample.of("m_ok", i)] for i in range(3)])
    bad = Scripted("bad", [RuntimeError("boom")] * 3)
    runner = CollectorRunner(st, [bad, ok])

    async def go() -> None:
        for t in (1.0, 2.0, 3.0):
            await runner.tick(t)

    asyncio.run(go())
    assert st.latest(SeriesKey.of("m_ok")) == (3.0, 2.0)
    assert errors(st, "bad", "exception") == 3
    status = runner.status()
    assert status["healthy"] is False
    assert status["collectors"]["bad"]["error"] == "RuntimeError: boom"
    assert status["collectors"]["ok"]["ok"] is True


def test_unavailable_marks_previous_series_stale_and_counts_reason() -> None:
    st = Store()
    c = Scripted(
        "nvml",
        [[Sample.of("g", 1.0)], CollectorUnavailable("no driver", reason="no_driver")],
    )
    runner = CollectorRunner(st, [c])
    asyncio.run(runner.tick(1.0))
    assert st.latest(SeriesKey.of("g")) == (1.0, 1.0)
    asyncio.run(runner.tick(2.0))
    assert st.latest(SeriesKey.of("g")) is None  # stale: absent, not frozen at 1
    assert errors(st, "nvml", "no_driver") == 1
    up = st.latest(SeriesKey.of("kcops_collector_up", {"collector": "nvml"}))
    assert up is not None and up[1] == 0.0


def test_series_that_disappears_gets_stale_marker() -> None:
    st = Store()
    c = Scripted("x", [[Sample.of("a", 1), Sample.of("b", 1)], [Sample.of("a", 2)]])
    runner = CollectorRunner(st, [c])
    asyncio.run(runner.tick(1.0))
    asyncio.run(runner.tick(2.0))
    assert st.latest(SeriesKey.of("a")) == (2.0, 2.0)
    assert st.latest(SeriesKey.of("b")) is None


def test_async_collector_timeout_is_counted() -> None:
    st = Store()
    runner = CollectorRunner(st, [Slow()], timeout_s=0.05)
    asyncio.run(runner.tick(1.0))
    assert errors(st, "slow", "timeout") == 1


class Stuck:
    """A synchronous read that blocks until released, like NVML on a lost GPU."""

    name = "stuck"

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()

    def collect(self, now: float) -> Iterable[Sample]:
        self.release.wait(10)
        return [Sample.of("g", now)]


def test_in_thread_collector_never_blocks_the_loop_nor_piles_up() -> None:
    from kcops.agent.collectors.base import InThread

    st = Store()
    stuck = Stuck()
    wrapped = InThread(stuck)
    runner = CollectorRunner(st, [wrapped], timeout_s=0.05)

    async def go() -> None:
        await runner.tick(1.0)  # the read hangs: this tick times out
        await runner.tick(2.0)  # still hanging: reported, no second thread
        stuck.release.set()
        # The driver is back once the stuck read has returned: wait for exactly that.
        assert wrapped._pending is not None
        await asyncio.wait_for(asyncio.shield(wrapped._pending), timeout=10)
        await runner.tick(3.0)

    asyncio.run(go())
    assert errors(st, "stuck", "timeout") == 1
    assert errors(st, "stuck", "hung") == 1
    assert st.latest(SeriesKey.of("g")) == (3.0, 3.0)


class FailsLate:
    """A threaded read that outlives its tick, then fails (NVML losing its driver)."""

    name = "late"

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()

    def collect(self, now: float) -> Iterable[Sample]:
        self.release.wait(10)
        raise CollectorUnavailable("no NVIDIA driver", reason="no_driver")


def test_a_threaded_read_that_fails_after_its_timeout_leaves_no_unretrieved_error() -> None:
    """The tick gives up on the read; the read's later error is taken, not logged by
    asyncio as "Future exception was never retrieved" with a traceback."""
    import gc

    from kcops.agent.collectors.base import InThread

    st = Store()
    late = FailsLate()
    runner = CollectorRunner(st, [InThread(late)], timeout_s=0.05)
    seen: list[dict[str, object]] = []

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        await runner.tick(1.0)
        late.release.set()
        pending = runner.collectors[0]._pending  # type: ignore[attr-defined]
        while not pending.done():
            await asyncio.sleep(0.01)
        del pending
        await runner.tick(2.0)  # a new read replaces the late one: its last reference goes
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(go())
    assert errors(st, "late", "timeout") == 1
    assert errors(st, "late", "no_driver") == 1  # the second read failed within its tick
    assert not seen, seen


def test_a_bug_that_repeats_each_tick_logs_its_traceback_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Counted every tick, but its traceback logged again only when the error changes: under
    fd exhaustion one collector's traceback each tick was most of the agent's log."""
    same = [RuntimeError("EMFILE") for _ in range(20)]
    st = Store()
    r = CollectorRunner(st, [Scripted("buggy", [*same, RuntimeError("other")])])
    with caplog.at_level(logging.ERROR, logger="kcops.agent.collectors"):
        for t in range(21):
            asyncio.run(r.tick(float(t)))
    tracebacks = [x for x in caplog.records if x.exc_info]
    assert len(tracebacks) == 2
    assert errors(st, "buggy", "exception") == 21
