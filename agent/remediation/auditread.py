"""Reading the audit log: records, the lines that are not (counted), and unfinished runs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kcops.agent.outcome import Outcome
from kcops.agent.remediation.auditfile import MAX_RECORD_BYTES
from kcops.agent.remediation.records import (
    ActionRecord,
    AuditRecord,
    JSONObject,
    StartedRecord,
    parse_record,
)

UNFINISHED_SCAN_BYTES = 8 << 20  # how far back a restart looks for runs with no outcome


@dataclass
class ReadStats:
    """What :func:`read_audit` found besides records."""

    invalid: int = 0  # lines that are not a record (torn, corrupt): skipped
    recovered: int = 0  # whole records found after a fragment on the same line


def parse_line(raw: bytes) -> JSONObject | None:
    """The record of one line; a whole record glued after a torn fragment is recovered
    (the fragment dropped); None when the line holds none."""
    rec = _record(raw)
    if rec is not None:
        return rec
    at = raw.find(b'{"', 1)
    for _ in range(64):
        if at < 0:
            break
        rec = _record(raw[at:])
        if rec is not None:
            return rec
        at = raw.find(b'{"', at + 1)
    return None


def _record(raw: bytes) -> JSONObject | None:
    try:
        rec = json.loads(raw)
        if not isinstance(rec, dict):
            return None
        float(rec.get("ts", 0))
    except (ValueError, TypeError, RecursionError):
        return None
    return rec


def read_audit(
    path: Path, since: float | None = None, stats: ReadStats | None = None
) -> Iterator[JSONObject]:
    """Records with ``ts >= since``, as stored; a line that is not a record is skipped and
    counted in ``stats`` (a record glued to a torn fragment is recovered).
    :func:`read_records` gives them as models."""
    stats = stats if stats is not None else ReadStats()
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with fh:
        for raw in _lines(fh):
            if not raw.strip():
                continue
            rec = _record(raw)
            if rec is None:
                rec = parse_line(raw)
                if rec is None:
                    stats.invalid += 1
                    continue
                stats.recovered += 1
            if since is not None and float(rec.get("ts", 0)) < since:  # type: ignore[arg-type]
                continue
            yield rec


def _lines(fh: BinaryIO) -> Iterator[bytes]:
    """The file's lines; one longer than :data:`MAX_RECORD_BYTES` (garbage, not a record)
    is skipped a piece at a time, so memory stays bounded, and given as ``b"\\0"``."""
    while raw := fh.readline(MAX_RECORD_BYTES + 1):
        if len(raw) <= MAX_RECORD_BYTES or raw.endswith(b"\n"):
            yield raw
            continue
        while (more := fh.readline(MAX_RECORD_BYTES)) and not more.endswith(b"\n"):
            pass
        yield b"\0"


def read_records(
    path: Path, since: float | None = None, stats: ReadStats | None = None
) -> Iterator[AuditRecord]:
    """:func:`read_audit`'s records as the models of their kinds (``parse_record``)."""
    for raw in read_audit(path, since, stats):
        yield parse_record(raw)


def unfinished(path: Path, scan_bytes: int = UNFINISHED_SCAN_BYTES) -> list[JSONObject]:
    """``started`` records of the log's last ``scan_bytes`` with no outcome after them:
    runs the agent was killed in the middle of."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - scan_bytes))
            data = fh.read()
    except FileNotFoundError:
        return []
    if size > scan_bytes:
        data = data[data.find(b"\n") + 1 :]
    open_runs: dict[str, JSONObject] = {}
    for raw in data.splitlines():
        rec = parse_line(raw) if raw.strip() else None
        if rec is None:
            continue
        run_id = rec.get("run_id")
        if not isinstance(run_id, str):
            continue
        if rec.get("kind") == "started":
            open_runs[run_id] = rec
        elif rec.get("kind") == "action":
            open_runs.pop(run_id, None)
    return list(open_runs.values())


def interrupted_runs(path: Path, now: float) -> list[ActionRecord]:
    """An ``interrupted`` outcome for each run the last agent started and never finished
    (killed while it ran): the run is on record, its cooldown explained."""
    out = []
    for raw in unfinished(path):
        try:
            st = StartedRecord.model_validate({k: v for k, v in raw.items() if k != "kind"})
        except ValueError:
            continue
        out.append(
            ActionRecord(
                ts=now,
                run_id=st.run_id,
                action=st.action,
                params=st.params,
                target=st.target,
                mode=st.mode,
                outcome=Outcome.INTERRUPTED,
                error=f"the agent stopped while it ran (started at {st.ts:.3f}, no outcome "
                "recorded): it may have acted; its cooldown and budget stay spent",
                trigger=st.trigger,
                ladder=st.ladder,
                forced=st.forced,
                reason=st.reason,
            )
        )
    return out
