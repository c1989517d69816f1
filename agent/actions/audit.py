"""The audit log: append-only JSON lines, written at once, made durable in batches.

Every decision the runner takes lands here — runs, dry runs, refusals by a
guard, ladder steps, pages, restores — with the alert transition that
triggered it. It survives agent restarts; ``kcops actions history`` reads it.

Durability: :meth:`AuditLog.append` writes the line at once (readers see it)
but does not fsync on the event loop; the fsync runs in a worker thread, one
for every record written since the last one (batched). Whoever acknowledges a
record to the outside (an HTTP answer) awaits :meth:`AuditLog.sync` first, so
an acknowledged record is on disk. Outside an event loop ``append`` fsyncs
itself, as before.

A crash in the middle of a write leaves a torn last line; the next start
moves those bytes to ``<log>.torn`` (kept, counted in ``torn_repairs``) and
truncates the log to its last full line, so the next record is not glued to
the torn one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from kcops.agent.actions.records import AuditRecord, JSONObject, parse_record

log = logging.getLogger("kcops.agent.actions")

MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes; the tail scan stops here


def repair_torn_tail(path: Path) -> int:
    """Move a torn last line (no final newline) of ``path`` aside; returns its size in bytes."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - MAX_RECORD_BYTES)
        tail = os.pread(fd, size - start, start)
        if not tail or tail.endswith(b"\n"):
            return 0
        keep = start + tail.rfind(b"\n") + 1  # 0 if the whole scanned tail is one torn line
        torn = os.pread(fd, size - keep, keep)
        aside = path.with_name(path.name + ".torn")
        afd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(afd, torn + b"\n")
            os.fsync(afd)
        finally:
            os.close(afd)
        os.ftruncate(fd, keep)
        os.fsync(fd)
    finally:
        os.close(fd)
    log.warning("audit log %s: torn last record (%d bytes) moved to %s", path, len(torn), aside)
    return len(torn)


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._lock = threading.Lock()  # one fsync at a time; counters below
        self._written = 0  # records written (page cache)
        self._synced = 0  # records known on disk
        self._pending: asyncio.Task[None] | None = None
        self.torn_repairs = 0
        self.torn_bytes = 0

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = repair_torn_tail(self.path)
            if torn:
                self.torn_repairs += 1
                self.torn_bytes += torn
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return self._fd

    def append(self, record: AuditRecord | JSONObject) -> None:
        """Write one record now; on an event loop its fsync follows in a thread (see module).

        The agent writes the models of :mod:`~kcops.agent.actions.records`; a plain JSON
        object is written as it is.
        """
        obj = record.as_json() if isinstance(record, BaseModel) else record
        line = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":")) + "\n"
        fd = self._open()
        os.write(fd, line.encode())  # O_APPEND and one write: a record is never interleaved
        self._written += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._fsync()
            return
        if self._pending is None or self._pending.done():
            self._pending = loop.create_task(self.sync())

    def _fsync(self) -> None:
        with self._lock:
            target = self._written
            if self._synced >= target or self._fd is None:
                return
            os.fsync(self._fd)
            self._synced = target

    async def sync(self) -> None:
        """Return once every record appended so far is on disk (fsync in a thread)."""
        if self._synced < self._written:
            await asyncio.to_thread(self._fsync)

    @property
    def unsynced(self) -> int:
        """Records written but not yet known on disk."""
        return self._written - self._synced

    def close(self) -> None:
        if self._fd is not None:
            self._fsync()
            os.close(self._fd)
            self._fd = None


def read_audit(path: Path, since: float | None = None) -> Iterator[JSONObject]:
    """Records with ``ts >= since``, as stored; a torn or corrupt line (crash mid-write)
    is skipped. :func:`read_records` gives them as models."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with fh:
        for raw in fh:
            try:
                rec = json.loads(raw)
                ts = float(rec.get("ts", 0)) if isinstance(rec, dict) else None
            except (ValueError, TypeError, RecursionError):
                continue
            if ts is None or (since is not None and ts < since):
                continue
            yield rec


def read_records(path: Path, since: float | None = None) -> Iterator[AuditRecord]:
    """:func:`read_audit`'s records as the models of their kinds (``parse_record``)."""
    for raw in read_audit(path, since):
        yield parse_record(raw)
