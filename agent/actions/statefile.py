"""A small JSON state file written atomically: tmp file, fsync, rename, fsync dir.

Reading validates the file against :class:`RemediationState`: a file that is
not JSON, or JSON of the wrong shape, is moved aside (``<file>.corrupt``) with
a warning and the agent starts empty — never a failed start. Temp files left
by a crash between write and rename are removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("kcops.agent.actions")

MAX_STATE_BYTES = 16 << 20


class RemediationState(BaseModel):
    """The shape of remediation's state file (version 1); unknown keys are kept out."""

    model_config = ConfigDict(extra="ignore")

    version: int = Field(1, ge=1, le=1)
    guards: dict[str, Any] = Field(default_factory=dict)
    ladders: dict[str, dict[str, Any]] = Field(default_factory=dict)
    ended: dict[str, float] = Field(default_factory=dict)
    restores: dict[str, Any] = Field(default_factory=dict)
    replicas: int | None = Field(None, ge=0, le=100_000)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def remove_stale_temps(path: Path) -> int:
    """Delete temp files of ``path`` left by earlier (crashed) processes; returns how many."""
    n = 0
    with contextlib.suppress(OSError):
        for tmp in path.parent.glob(f".{path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()
                n += 1
    return n


def _set_aside(path: Path, why: str) -> None:
    aside = path.with_suffix(path.suffix + ".corrupt")
    with contextlib.suppress(OSError):
        os.replace(path, aside)
    log.warning("state %s %s; moved to %s and starting empty", path, why, aside)


def read_state(path: Path, model: type[BaseModel] = RemediationState) -> dict[str, Any]:
    """The saved state validated by ``model`` (as a dict), or {} when there is none.

    A corrupt or wrong-shaped file is kept aside with a warning, never fatal.
    """
    remove_stale_temps(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("state %s cannot be read (%s); starting empty", path, exc.strerror)
        return {}
    if len(raw) > MAX_STATE_BYTES:
        _set_aside(path, f"is larger than {MAX_STATE_BYTES} bytes")
        return {}
    try:
        return model.model_validate_json(raw).model_dump(exclude_none=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        _set_aside(path, f"is not valid ({exc.error_count()} errors, first at {where}: "
                   f"{first['msg'][:120]})")  # fmt: skip
        return {}
