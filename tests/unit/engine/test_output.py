"""The supervised engine's output: forwarded unchanged, its last lines kept in a bounded
ring that outlives the child (a real child process, real pipes)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from kcops.agent.config.actions import RestartSection
from kcops.agent.engine.output import OutputRing
from kcops.agent.engine.supervisor import Supervisor
from tests.clock import ManualClock
from tests.services import wait_until_async

# Both streams, a line with a non-UTF-8 byte, and a last line with no newline.
TALKER = (
    "import sys\n"
    "print('hello out', flush=True)\n"
    "sys.stderr.write('oops err\\n'); sys.stderr.flush()\n"
    "sys.stdout.buffer.write(b'bad \\xff byte\\n' + b'x' * 5000 + b'\\nno newline')\n"
)


def sinks(tmp_path: Path) -> tuple[dict[str, int], Path, Path]:
    out, err = tmp_path / "out", tmp_path / "err"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    return {"out": os.open(out, flags), "err": os.open(err, flags)}, out, err


def test_a_child_is_forwarded_byte_for_byte_and_its_last_words_kept(tmp_path: Path) -> None:
    fds, out, err = sinks(tmp_path)

    async def body() -> OutputRing:
        ring = OutputRing(sinks=fds)
        proc = await ring.spawn(
            lambda o, e: asyncio.create_subprocess_exec(
                sys.executable, "-c", TALKER, stdout=o, stderr=e
            )
        )
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        await ring.close(timeout_s=10)  # the pumps end at EOF by themselves
        return ring

    try:
        ring = asyncio.run(body())
    finally:
        for fd in fds.values():
            os.close(fd)
    assert out.read_bytes() == b"hello out\nbad \xff byte\n" + b"x" * 5000 + b"\nno newline"
    assert err.read_bytes() == b"oops err\n"
    lines = ring.lines()
    assert lines[0].startswith("--- engine started: pid ") and lines[0].endswith(" ---")
    assert "err| oops err" in lines
    assert [ln for ln in lines if ln.startswith("out|")] == [
        "out| hello out",
        "out| bad \ufffd byte",
        "out| " + "x" * 4096 + " [cut]",
        "out| no newline",
    ]


def test_a_line_without_its_newline_shows_while_the_stream_is_open() -> None:
    ring = OutputRing(sinks={})
    ring.feed("err", b"Traceback (most recent call last):\n  File")
    assert ring.lines() == ["err| Traceback (most recent call last):", "err|   File"]
    ring.feed("err", b' "x.py"\n')
    assert ring.lines()[-1] == 'err|   File "x.py"'


def test_bounds_drop_the_oldest_lines_first() -> None:
    ring = OutputRing(sinks={})
    for i in range(300):
        ring.feed("out", f"line {i}\n".encode())
    lines = ring.lines()
    assert len(lines) == 200 and lines[0] == "out| line 100" and lines[-1] == "out| line 299"
    assert ring.dropped_lines == 100

    ring = OutputRing(sinks={})
    ring.feed("out", b"".join(b"%03d" % i + b"y" * 2000 + b"\n" for i in range(100)))
    lines = ring.lines()
    assert sum(len(ln.encode()) for ln in lines) <= 64 * 1024
    assert len(lines) == 32 and lines[-1].startswith("out| 099")

    ring = OutputRing(sinks={})
    ring.feed("out", b"z" * 100_000)  # no newline yet: the held part stays bounded too
    ring.feed("out", b"z" * 100_000 + b"\n")
    assert ring.lines() == ["out| " + "z" * 4096 + " [cut]"]


def test_close_does_not_wait_for_a_survivor_that_holds_the_pipe() -> None:
    # The child exits; the sleep it started keeps the child's stdout open.
    leaver = "import subprocess; print(subprocess.Popen(['sleep', '30']).pid, flush=True)"

    async def body() -> None:
        ring = OutputRing(sinks={})
        proc = await ring.spawn(
            lambda o, e: asyncio.create_subprocess_exec(
                sys.executable, "-c", leaver, stdout=o, stderr=e
            )
        )
        assert await asyncio.wait_for(proc.wait(), 10) == 0  # the child alone, not its pipes

        async def pid_line() -> str | None:
            return next((ln for ln in ring.lines() if ln.startswith("out| ")), None)

        survivor = int((await wait_until_async(pid_line, 10, "the pid")).removeprefix("out| "))
        try:
            t0 = time.monotonic()
            await ring.close(timeout_s=0.2)
            assert time.monotonic() - t0 < 5 and not ring._tasks
        finally:
            os.kill(survivor, signal.SIGKILL)

    asyncio.run(body())


def test_the_supervisors_ring_keeps_the_dead_engines_words_across_the_respawn() -> None:
    cmd = [sys.executable, "-c", "import sys; print('dying words'); sys.exit(3)"]

    async def body() -> list[str]:
        clock = ManualClock()
        sup = Supervisor(cmd, RestartSection(backoff_initial_s=0.0), clock=clock)
        sup.output.sinks = {}  # not into pytest's output
        await sup.start()
        first = sup.pid()
        try:
            assert sup._waiter is not None
            await asyncio.wait_for(asyncio.shield(sup._waiter), 10)

            async def said() -> bool:
                return "out| dying words" in sup.output.lines()

            await wait_until_async(said, 10, "the first engine's words")
            await sup.tick(clock())  # the crash: respawn after no backoff
            await sup.tick(clock())
            assert sup.proc is not None and sup.proc.pid != first
        finally:
            await sup.stop()
        return sup.output.lines()

    lines = asyncio.run(body())
    started = [i for i, ln in enumerate(lines) if ln.startswith("--- engine started: pid ")]
    assert len(started) == 2 and "out| dying words" in lines[started[0] : started[1]]
