"""Errors that repeat: back-off, a log line per interval with a count, and asyncio's failed
accepts (the agent's HTTP server) counted instead of logged with a traceback each second."""

from __future__ import annotations

import asyncio
import errno
import logging

import pytest

from kcops.agent.backoff import ACCEPT_OUT_OF_RESOURCE, Backoff, LoopErrors, RepeatLog
from kcops.agent.samples import SeriesKey


def test_backoff_doubles_to_its_cap_and_a_success_resets_it() -> None:
    b = Backoff(0.1, 1.0)
    assert [b.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.1


def test_a_repeating_error_is_logged_once_per_interval_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = logging.getLogger("kcops.test.repeat")
    rl = RepeatLog(log, 60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="kcops.test.repeat"):
        logged = []
        for _ in range(1000):
            logged.append(rl("accept", logging.WARNING, "accept failed: %s", "EMFILE"))
            now[0] += 0.1  # 100 s in all
        assert rl("read", logging.WARNING, "read failed")  # another kind has its own interval
    assert sum(logged) == 2 and rl.counts == {"accept": 1000, "read": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "accept failed: EMFILE"
    assert lines[1] == "accept failed: EMFILE (600 times in the last 60 s)"


def _context(exc: OSError) -> dict[str, object]:
    return {"message": ACCEPT_OUT_OF_RESOURCE, "exception": exc}


def test_asyncio_failed_accepts_are_counted_and_other_errors_go_where_they_went(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """asyncio retries a failed accept after 1 s and reports each with a traceback: a
    minute of EMFILE was 60 tracebacks. Now: counted, one line a minute."""
    seen: list[dict[str, object]] = []

    async def main() -> LoopErrors:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        errors = LoopErrors(logging.getLogger("kcops.test.loop"))
        errors.install(loop)
        for _ in range(30):
            loop.call_exception_handler(_context(OSError(errno.EMFILE, "Too many open files")))
        loop.call_exception_handler({"message": "something else"})
        # asyncio's accept retry, pending when the server closed, fires on a closed socket
        loop.call_exception_handler({
            "message": "Exception in callback BaseSelectorEventLoop._start_serving(<...>)",
            "exception": ValueError("Invalid file descriptor: -1"),
        })  # fmt: skip
        errors.uninstall(loop)
        assert loop.get_exception_handler() is not errors
        return errors

    with caplog.at_level(logging.WARNING, logger="kcops.test.loop"):
        errors = asyncio.run(main())
    assert [c["message"] for c in seen] == ["something else"]  # the handler before ours
    assert len(caplog.records) == 1 and "Too many open files" in caplog.records[0].getMessage()
    (s,) = errors.samples()
    assert s.key == SeriesKey.of(
        "kcops_collector_errors_total", {"collector": "http", "reason": "accept"}
    )
    assert s.value == 30
