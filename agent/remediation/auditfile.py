"""The audit log's file as bytes: whole writes, and a torn tail moved aside, in pieces of
:data:`MAX_RECORD_BYTES` so that memory stays bounded for a log of any size."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

log = logging.getLogger("kcops.agent.actions")

MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes; reads go this much at a time


def repair_torn_tail(path: Path) -> int:
    """Move a torn last line (no final newline) of ``path``, however long, aside to
    ``<log>.torn``; returns its size in bytes. A log that is one such line throughout
    (garbage, not records) is renamed there when no ``.torn`` is in the way. Reads and
    copies :data:`MAX_RECORD_BYTES` at a time: memory stays bounded for any size."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    aside = path.with_name(path.name + ".torn")
    try:
        size = keep = os.fstat(fd).st_size
        while keep > 0:  # back to the end of the last whole line, one piece at a time
            start = max(0, keep - MAX_RECORD_BYTES)
            nl = os.pread(fd, keep - start, start).rfind(b"\n")
            keep = start + nl + 1 if nl >= 0 else start
            if nl >= 0:
                break
        if keep == size:
            return 0
        renamed = keep == 0 and not aside.exists()
        if renamed:
            os.replace(path, aside)  # nothing to keep: no copy of a log of any size
        afd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for at in range(size if renamed else keep, size, MAX_RECORD_BYTES):
                write_all(afd, os.pread(fd, min(MAX_RECORD_BYTES, size - at), at))
            write_all(afd, b"\n")
            os.fsync(afd)
        finally:
            os.close(afd)
        if not renamed:
            os.ftruncate(fd, keep)
            os.fsync(fd)
    finally:
        os.close(fd)
    log.warning("audit log %s: torn last record (%d bytes) moved to %s", path, size - keep, aside)
    return size - keep


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a short write is completed) or raise OSError."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write wrote nothing")
        view = view[n:]
