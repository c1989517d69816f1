"""A small JSON state file written atomically: tmp file, fsync, rename, fsync dir.

Reading validates the file against a model (by default
:class:`~kcops.agent.remediation.remediation_state.RemediationState`, typed down to
its inner records): a file that is not JSON, or JSON of the wrong shape at any
depth, is moved aside (``<file>.corrupt``) with a warning and the agent starts
empty — never a failed start. Temp files left by a crash between write and
rename are removed at the next read; a failed write removes its own.

:class:`StateFile` adds what the agent needs on top: a count of the files set
aside, and :meth:`StateFile.save_async`, which serialises on the event loop and
writes (two fsyncs) on the file's own writer thread. Writes are serialised by a lock and
numbered, so an older snapshot finishing late never replaces a newer one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

from kcops.agent.atomicfile import Writer, remove_stale_temps, write_bytes_atomic
from kcops.agent.remediation.remediation_state import RemediationState

log = logging.getLogger("kcops.agent.actions")

MAX_STATE_BYTES = 16 << 20


M = TypeVar("M", bound=BaseModel)
State = BaseModel | Mapping[str, object]


def encode(data: State) -> bytes:
    obj = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def set_aside(path: Path, why: str) -> None:
    """Move ``path`` to ``<path>.corrupt`` (replacing an older one) with a warning."""
    aside = path.with_suffix(path.suffix + ".corrupt")
    with contextlib.suppress(OSError):
        os.replace(path, aside)
    log.warning("state %s %s; moved to %s and starting empty", path, why, aside)


def _read(path: Path, model: type[M]) -> tuple[M | None, bool]:
    """(state, whether the file was set aside); None: no state."""
    remove_stale_temps(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None, False
    except OSError as exc:
        log.warning("state %s cannot be read (%s); starting empty", path, exc.strerror)
        return None, False
    if len(raw) > MAX_STATE_BYTES:
        set_aside(path, f"is larger than {MAX_STATE_BYTES} bytes")
        return None, True
    try:
        return model.model_validate_json(raw), False
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p)[:40] for p in first["loc"]) or "<root>"
        set_aside(path, f"is not valid ({exc.error_count()} errors, first at {where}: "
                  f"{first['msg'][:120]})")  # fmt: skip
        return None, True


class StateFile(Generic[M]):
    """One state file of the agent: validated reads, ordered atomic writes, a set-aside count."""

    def __init__(self, path: Path, model: type[M] = RemediationState) -> None:  # type: ignore[assignment]
        self.path = path
        self.model = model
        self.set_aside_count = 0
        self._lock = threading.Lock()
        self._seq = 0  # snapshots taken
        self._written = 0  # the newest snapshot on disk
        self.writer = Writer(path.name)

    def read(self) -> M | None:
        """The state validated by the model; None when there is none (or it was set aside)."""
        data, aside = _read(self.path, self.model)
        self.set_aside_count += aside
        return data

    def set_aside(self, why: str) -> None:
        """Set the file aside after reading: it validated but could not be rebuilt."""
        set_aside(self.path, why)
        self.set_aside_count += 1

    def _snapshot(self, data: State) -> tuple[int, bytes]:
        self._seq += 1
        return self._seq, encode(data)

    def _write(self, seq: int, payload: bytes) -> None:
        with self._lock:
            if seq <= self._written:
                return  # a newer snapshot is on disk already
            write_bytes_atomic(self.path, payload)
            self._written = seq

    def save(self, data: State) -> None:
        """Write ``data`` now, on this thread (durable on return)."""
        self._write(*self._snapshot(data))

    async def save_async(self, data: State) -> None:
        """Serialise ``data`` here, write it on the writer thread (durable on return)."""
        seq, payload = self._snapshot(data)
        await self.writer.run(lambda: self._write(seq, payload))
