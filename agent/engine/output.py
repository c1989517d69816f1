"""The supervised engine's last words: its stdout and stderr, forwarded and kept in a ring.

The supervisor gives the child pipes instead of the agent's own stdout and stderr. A pump
per stream forwards every byte unchanged to the agent's stream (the container log reads
as before) and keeps the last lines in :class:`OutputRing`, which outlives the child so an
incident record still has what the dead engine said before the respawn. The pipes are the
ring's own (not asyncio's ``PIPE``): ``Process.wait()`` then waits for the child alone,
not for every holder of its pipes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("kcops.agent.engine.output")

STREAMS = (("out", 1), ("err", 2))  # (tag, the agent's own fd it forwards to)
READ_BYTES = 65536


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class OutputRing:
    """The last ``max_lines`` lines (at most ``max_bytes`` in all, each cut at
    ``line_bytes``) of both streams, oldest dropped first. Each line is tagged by its
    stream (``out| ...``, ``err| ...``); ``mark`` adds an untagged line."""

    def __init__(
        self,
        max_lines: int = 200,
        max_bytes: int = 64 * 1024,
        line_bytes: int = 4096,
        sinks: dict[str, int] | None = None,
    ) -> None:
        self.max_lines, self.max_bytes, self.line_bytes = max_lines, max_bytes, line_bytes
        self.sinks = sinks if sinks is not None else dict(STREAMS)
        self._lines: deque[tuple[str, int]] = deque()
        self._bytes = 0
        self._partial: dict[str, bytes] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Its own threads: a log reader that stops reading holds these, never the loop's
        # default pool (the collectors' reads).
        self._pool = ThreadPoolExecutor(len(STREAMS), thread_name_prefix="kcops-engine-output")
        self.dropped_lines = 0

    def lines(self) -> list[str]:
        """The kept lines, oldest first, then any line still waiting for its newline (a
        hung engine's last words often have none yet)."""
        pending = [self._text(tag, raw) for tag, raw in self._partial.items() if raw]
        return [line for line, _ in self._lines] + pending

    def mark(self, text: str) -> None:
        self._add(text)

    def feed(self, tag: str, data: bytes) -> None:
        """Split ``data`` into lines; a line's head is kept, whatever its length."""
        *done, rest = (self._partial.get(tag, b"") + data).split(b"\n")
        for raw in done:
            self._add(self._text(tag, raw))
        self._partial[tag] = rest[: self.line_bytes + 1]  # +1: it is known to be cut

    def flush(self, tag: str) -> None:
        """The stream ended: its last line, even without a newline, is a line."""
        raw = self._partial.pop(tag, b"")
        if raw:
            self._add(self._text(tag, raw))

    def _text(self, tag: str, raw: bytes) -> str:
        cut = " [cut]" if len(raw) > self.line_bytes else ""
        return f"{tag}| {raw[: self.line_bytes].decode(errors='replace').rstrip()}{cut}"

    def _add(self, line: str) -> None:
        size = len(line.encode())
        self._lines.append((line, size))
        self._bytes += size
        while len(self._lines) > self.max_lines or self._bytes > self.max_bytes:
            self._bytes -= self._lines.popleft()[1]
            self.dropped_lines += 1

    # -- the child's pipes ------------------------------------------------------

    async def spawn(
        self, start: Callable[[int, int], Awaitable[asyncio.subprocess.Process]]
    ) -> asyncio.subprocess.Process:
        """Start a child through ``start(stdout_fd, stderr_fd)``, mark it in the ring and
        pump its two streams until their pipes close."""
        pipes = [os.pipe() for _ in STREAMS]
        try:
            proc = await start(pipes[0][1], pipes[1][1])
        except BaseException:
            for r, _ in pipes:
                os.close(r)
            raise
        finally:
            for _, w in pipes:
                os.close(w)  # the child holds them now: EOF once it (and its tree) is gone
        self.mark(f"--- engine started: pid {proc.pid} ---")
        loop = asyncio.get_running_loop()
        for (tag, _), (r, _) in zip(STREAMS, pipes, strict=True):
            task = loop.create_task(self._pump(tag, r))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return proc

    async def _pump(self, tag: str, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=READ_BYTES)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        sink: int | None = self.sinks.get(tag)
        try:
            while chunk := await reader.read(READ_BYTES):
                self.feed(tag, chunk)
                if sink is None:
                    continue
                try:  # off the loop: a slow log reader holds the engine back, as before
                    await loop.run_in_executor(self._pool, _write_all, sink, chunk)
                except OSError as exc:
                    log.warning("cannot forward the engine's std%s: %s", tag, exc)
                    sink = None  # keep reading: the engine must not block on a full pipe
        finally:
            self.flush(tag)
            transport.close()

    async def close(self, timeout_s: float = 1.0) -> None:
        """Let the pumps take what is left, then stop them: a survivor of the engine's
        tree may hold its pipes open for ever."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
