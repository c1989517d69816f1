"""A small JSON state file written atomically: tmp file, fsync, rename, fsync dir."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("kcops.agent.actions")


def write_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_state(path: Path) -> dict[str, Any]:
    """The saved state, or {} when there is none. A corrupt file is kept aside, not fatal."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        aside = path.with_suffix(path.suffix + ".corrupt")
        os.replace(path, aside)
        log.error("guard state %s is corrupt; moved to %s and starting empty", path, aside)
        return {}
    return data if isinstance(data, dict) else {}
