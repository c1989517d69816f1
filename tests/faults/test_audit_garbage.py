"""Garbage in the state dir's files, read back at start and by every reader: an audit
log of 1 GiB of NULs with no newline, a valid log with megabytes of garbage after its
last record, a line of garbage longer than any record, state files of 1 GiB. Each is set
aside or skipped whole, in bounded memory (tracemalloc's peak) and without touching the
records around it."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kcops.agent.remediation.auditfile import repair_torn_tail
from kcops.agent.remediation.auditread import ReadStats, read_audit

T = TypeVar("T")
RECORDS = b'{"ts":1.0,"kind":"page"}\n{"ts":2.0,"kind":"page"}\n'
PEAK_BYTES = 8 << 20  # a few reads of MAX_RECORD_BYTES, far below the garbage


def peak(fn: Callable[[], T]) -> tuple[T, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_log_of_1gib_of_nuls_is_set_aside_whole(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    with open(log, "wb") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB of NULs, no newline, no disk used
    moved, peak_bytes = peak(lambda: repair_torn_tail(log))
    assert moved == 1 << 30
    assert not log.exists() or log.stat().st_size == 0  # no garbage left before new records
    assert (tmp_path / "audit.jsonl.torn").stat().st_size == (1 << 30) + 1
    assert peak_bytes < PEAK_BYTES, peak_bytes
    assert list(read_audit(log)) == []


def test_garbage_after_the_last_record_is_set_aside_and_the_records_kept(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    garbage = b"\0" * (3 << 20)  # three reads' worth, no newline
    log.write_bytes(RECORDS + garbage)
    (tmp_path / "audit.jsonl.torn").write_bytes(b"older\n")  # an earlier repair's: kept
    moved, peak_bytes = peak(lambda: repair_torn_tail(log))
    assert moved == len(garbage)
    assert log.read_bytes() == RECORDS
    assert (tmp_path / "audit.jsonl.torn").read_bytes() == b"older\n" + garbage + b"\n"
    assert peak_bytes < PEAK_BYTES, peak_bytes


def test_a_line_longer_than_any_record_is_skipped_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_bytes(RECORDS + b"\0" * (32 << 20) + b"\n" + b'{"ts":3.0,"kind":"page"}\n')
    stats = ReadStats()
    recs, peak_bytes = peak(lambda: list(read_audit(log, stats=stats)))
    assert [r["ts"] for r in recs] == [1.0, 2.0, 3.0]
    assert stats.invalid == 1
    assert peak_bytes < PEAK_BYTES, peak_bytes


def test_state_files_of_1gib_are_set_aside_without_being_read(tmp_path: Path) -> None:
    from kcops.agent.remediation.statefile import StateFile
    from kcops.agent.rules.forstate import read_saved

    state, for_state = tmp_path / "remediation-state.json", tmp_path / "alerts_for_state.json"
    for path in (state, for_state):
        with open(path, "wb") as fh:
            fh.truncate(1 << 30)
    got, peak_bytes = peak(lambda: (StateFile(state).read(), read_saved(for_state)))
    assert got == (None, {})
    assert peak_bytes < 64 << 20, peak_bytes  # each read stops at its cap, far below 1 GiB
    for path in (state, for_state):
        assert not path.exists()
        assert path.with_suffix(".json.corrupt").stat().st_size == 1 << 30
