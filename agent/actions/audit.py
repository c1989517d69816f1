"""The audit log: append-only JSON lines, one fsync per record.

Every decision the runner takes lands here — runs, dry runs, refusals by a
guard, ladder steps, pages, restores — with the alert transition that
triggered it. It survives agent restarts; ``kcops actions history`` reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return self._fd

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, default=str, separators=(",", ":")) + "\n"
        fd = self._open()
        os.write(fd, line.encode())
        os.fsync(fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_audit(path: Path, since: float | None = None) -> Iterator[dict[str, Any]]:
    """Records with ``ts >= since``; a torn last line (crash mid-write) is skipped."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with fh:
        for raw in fh:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if since is not None and float(rec.get("ts", 0)) < since:
                continue
            yield rec
