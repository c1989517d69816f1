"""The audit log: append-only JSON lines; a record is acknowledged only once it is durable.

Every decision the runner takes lands here (runs: a ``started`` record before a run acts,
its outcome after; dry runs, refusals, ladder steps, pages, restores) with the alert
transition that triggered it; ``kcops actions history`` reads it.

Writing: on the agent's event loop :meth:`AuditLog.append` queues the line and its writer
thread writes it (the loop never waits for a disk), completing a short write and undoing a
failed one (``ENOSPC``, ``EIO``: the file cut back to where the record began). A record
the disk refused is kept in memory, in order (at most ``BACKLOG_RECORDS``/``BACKLOG_BYTES``,
then dropped and counted), and written before any newer one once the disk takes it again:
never twice, never out of order.

Durability: the writer fsyncs after each batch it wrote. Whoever acknowledges a record
to the outside (an HTTP answer, an action about to act) awaits :meth:`AuditLog.sync`,
which is True only once every record up to it is on disk; outside an event loop
``append`` writes and fsyncs itself.

Torn lines: the next start moves a torn last line (a crash mid-write) to ``<log>.torn``;
readers skip a line that is not a record (counted), and recover a whole record glued to a
fragment (:func:`.auditread.parse_line`).

Strict JSON: a non-finite number is written as ``null``, its field named in the record's
``nonfinite`` list (no ``NaN`` or ``Infinity`` token). Repeats: see :mod:`.auditrepeat`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

from pydantic import JsonValue

from kcops.agent.remediation.auditfile import repair_torn_tail, write_all
from kcops.agent.remediation.auditrepeat import Key, Repeats, Stream
from kcops.agent.remediation.records import AuditRecord, JSONObject

log = logging.getLogger("kcops.agent.actions")

BACKLOG_RECORDS = 10_000  # records kept in memory while the disk refuses them
BACKLOG_BYTES = 16 << 20
_ERROR_LOG_EVERY_S = 10.0


def strict_json(obj: JsonValue) -> tuple[str, list[str]]:
    """``obj`` as compact JSON with no NaN/Infinity token: (text, the paths set to null)."""
    try:
        return _dumps(obj), []
    except ValueError:
        paths: list[str] = []
        return _dumps(_finite(obj, "", paths)), paths


def _dumps(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"), allow_nan=False)


def _finite(v: object, path: str, paths: list[str]) -> object:
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        paths.append(path or "<record>")
        return None
    if isinstance(v, dict):
        return {k: _finite(x, f"{path}.{k}" if path else str(k), paths) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x, f"{path}[{i}]", paths) for i, x in enumerate(v)]
    return v


def encode(record: AuditRecord) -> bytes:
    """One line of the log: strict JSON; non-finite numbers as null, named in ``nonfinite``."""
    text, paths = strict_json(record.as_json())
    if paths:
        named: list[JsonValue] = list(paths)
        text, _ = strict_json({**json.loads(text), "nonfinite": named})
        log.warning("audit record: non-finite number(s) written as null: %s", ", ".join(paths))
    return text.encode() + b"\n"


class AuditLog:
    """The log and its writer: on an event loop, :meth:`append` only queues the line and
    wakes the log's own writer thread, which writes and fsyncs in order (the loop never
    waits for the disk); outside a loop (the CLI, tests) it writes and fsyncs at once."""

    def __init__(self, path: Path, repeats: Repeats | None = None) -> None:
        self.path = path
        self.repeats = repeats or Repeats()
        self._fd: int | None = None
        self._io = threading.Lock()  # whoever writes or fsyncs holds it: writer or inline
        self._cv = threading.Condition()  # the queue below; wakes the writer
        self._seq = 0  # records appended (a record's number, from 1)
        self._written = 0  # the last record written (page cache), by number
        self._synced = 0  # the last record known on disk
        self._backlog: deque[tuple[int, bytes]] = deque()  # queued, not written yet
        self._backlog_bytes = 0
        self._refused = False  # the disk refused a write: the queue waits for tick()
        self._stopping = False
        self._writer: threading.Thread | None = None
        self._waiters: list[tuple[int, asyncio.Future[bool], asyncio.AbstractEventLoop]] = []
        self._tail_suspect = False  # a fragment may end the file: end it before writing
        self._last_error_log = 0.0
        self.torn_repairs = 0
        self.torn_bytes = 0
        self.write_errors = 0  # failed writes and fsyncs (ENOSPC, EIO, ...)
        self.dropped = 0  # records lost: the queue was full
        self.last_error: str | None = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                torn = repair_torn_tail(self.path)
            except OSError as exc:  # no room to set it aside: end it with a newline instead
                self._error("cannot set a torn last record aside", exc)
                self._tail_suspect = True
                torn = 0
            if torn:
                self.torn_repairs += 1
                self.torn_bytes += torn
            # read-write: the check that the log ends in a newline reads its last byte
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        return self._fd

    def _error(self, what: str, exc: OSError) -> None:
        self.write_errors += 1
        self.last_error = f"{what}: {exc.strerror or exc}"
        now = time.monotonic()
        if now - self._last_error_log >= _ERROR_LOG_EVERY_S:
            self._last_error_log = now
            log.error(
                "audit log %s: %s (%d record(s) held in memory, %d dropped)",
                self.path, self.last_error, len(self._backlog), self.dropped,
            )  # fmt: skip

    def append(
        self,
        record: AuditRecord,
        *,
        stream: Stream | None = None,
        key: Key | None = None,
        of: JSONObject | None = None,
    ) -> int | None:
        """Queue one record (see the class); its number, or None when it was not kept
        (counted as a repeat of ``stream``'s last record, or dropped: the queue is full).

        ``stream`` and ``key``: a record that may repeat (:mod:`.auditrepeat`); ``of``
        names it in the summary.
        """
        if stream is not None:
            err = getattr(record, "error", None)
            summaries, write = self.repeats.note(stream, key, of or {}, record.ts, err)
            for s in summaries:
                self._append(s)
            if not write:
                return None
        return self._append(record)

    def tick(self, now: float) -> None:
        """Queue the summaries of repeats that ended, and try again what the disk refused."""
        for s in self.repeats.due(now):
            self._append(s)
        with self._cv:
            if not self._backlog:
                return
            self._refused = False
            self._cv.notify()
        if self._writer is None:
            self._flush_inline()

    def _append(self, record: AuditRecord) -> int | None:
        line = encode(record)
        with self._cv:
            if (
                len(self._backlog) >= BACKLOG_RECORDS
                or self._backlog_bytes + len(line) > BACKLOG_BYTES
            ):
                self.dropped += 1
                log.error("audit log %s: backlog full, record dropped: %s", self.path, line[:300])
                return None
            self._seq += 1
            seq = self._seq
            self._backlog.append((seq, line))
            self._backlog_bytes += len(line)
            if not self._refused:
                self._cv.notify()
        if not self._start_writer():
            self._flush_inline()
        return seq

    def _start_writer(self) -> bool:
        """The writer thread, started on the first append inside an event loop; False
        while there is none and no loop runs (the caller writes inline)."""
        if self._writer is not None:
            return True
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._writer = threading.Thread(
            target=self._run, name=f"kcops-audit-{self.path.name}", daemon=True
        )
        self._writer.start()
        return True

    def _run(self) -> None:
        while True:
            with self._cv:
                while (self._refused or not self._backlog) and not self._stopping:
                    self._cv.wait()
                if self._stopping and (self._refused or not self._backlog):
                    return
            self._flush_inline()

    def _flush_inline(self) -> bool:
        """Write the queue, oldest first, and fsync; False when the disk refused (the rest
        kept, in order). Answers the waiters of :meth:`sync` either way."""
        with self._io:
            ok = self._drain() and self._fsync()
        if not ok:
            with self._cv:
                self._refused = True  # held until tick() asks again
        self._answer(ok)
        return ok

    def _drain(self) -> bool:
        while True:
            with self._cv:
                if not self._backlog:
                    return True
                seq, line = self._backlog[0]
            if not self._write(line):
                return False
            with self._cv:
                self._backlog.popleft()
                self._backlog_bytes -= len(line)
            self._written = seq

    def _write(self, line: bytes) -> bool:
        """``line`` at the end of the log, whole, or nothing of it (False)."""
        try:
            fd = self._open()
            if self._tail_suspect:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    write_all(fd, b"\n")  # end the fragment: the record starts its own line
                self._tail_suspect = False
            start = os.fstat(fd).st_size  # this process is the log's one writer
        except OSError as exc:
            self._error("cannot open or check the log", exc)
            return False
        try:
            write_all(fd, line)  # O_APPEND: a record is never interleaved
        except OSError as exc:
            self._error("write failed", exc)
            try:
                os.ftruncate(fd, start)  # cut back what part of it landed
            except OSError:
                self._tail_suspect = True
            return False
        return True

    def _fsync(self) -> bool:
        target = self._written
        if self._synced >= target or self._fd is None:
            return True
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self._error("fsync failed", exc)
            return False
        self._synced = max(self._synced, target)
        return True

    def _answer(self, ok: bool) -> None:
        """Resolve the waiters whose records are on disk (True), or all the others when
        the disk refused (False); from the writer thread, through the loop."""
        with self._cv:
            keep, done = [], []
            for target, fut, loop in self._waiters:
                if self._synced >= target or not ok:
                    done.append((fut, loop, self._synced >= target))
                else:
                    keep.append((target, fut, loop))
            self._waiters = keep
        for fut, loop, value in done:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_settle, fut, value)

    async def sync(self, upto: int | None = None) -> bool:
        """Wait until records up to number ``upto`` (default: all appended so far) are
        on disk; True if they are. False: the disk refused some (they stay in memory
        and are written when it takes them: :meth:`tick`). Never blocks the loop."""
        target = self._seq if upto is None else upto
        if self._synced >= target:
            return True
        if not self._start_writer():
            return await asyncio.to_thread(self._flush_inline) and self._synced >= target
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        with self._cv:
            if self._refused:
                return False
            self._waiters.append((target, fut, loop))
            self._cv.notify()
        if self._synced >= target:  # the writer may have finished before we waited
            _settle(fut, True)
        return await fut

    @property
    def held(self) -> int:
        """Records the disk refused, kept in memory until it takes them."""
        return len(self._backlog) if self._refused else 0

    def not_durable(self, record: JSONObject | None) -> JSONObject:
        """The answer (503) while the disk refuses records: held, not acknowledged."""
        return {
            "error": f"audit log not durable ({self.last_error}): {self.held} record(s) held "
            "in memory, written when the disk takes them; this one is not acknowledged",
            "record": record,
        }

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued and stop the writer (waiting at most ``timeout_s`` for it)."""
        for s in self.repeats.flush():
            self._append(s)
        writer = self._writer
        if writer is not None:
            with self._cv:
                self._stopping = True
                self._refused = False  # one last try
                self._cv.notify()
            writer.join(timeout_s)
            if writer.is_alive():
                log.error("audit log %s: the disk did not answer within %gs", self.path, timeout_s)
                return
            self._writer = None
        self._flush_inline()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._backlog:
            log.error(
                "audit log %s: %d record(s) never written (%s)",
                self.path, len(self._backlog), self.last_error,
            )  # fmt: skip


def _settle(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)
