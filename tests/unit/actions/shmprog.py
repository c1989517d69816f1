"""Helpers of the shared-memory cleanup tests: real segments in the real /dev/shm.

Each test works in its own directory of ``/dev/shm`` (tmpfs, the same mapping
and ``/proc`` view as a top-level ``psm_*``): other test runs on the machine,
and their cleanups, never see it, and it never sees theirs.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

HOLDER = str(Path(__file__).with_name("shm_holder.py"))


def holder_cmd(root: Path, *args: str) -> list[str]:
    """argv of tests/unit/actions/shm_holder.py: maps ``args`` under ``root``."""
    return [sys.executable, HOLDER, str(root), *args]


def make_segment(root: Path, name: str) -> int:
    """A closed, unused segment (as another process leaves one); returns its inode."""
    path = root / name
    path.write_bytes(b"\0" * 4096)
    return path.stat().st_ino


def names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A fresh directory in the real /dev/shm, removed afterwards."""
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        pytest.skip("no writable /dev/shm on this machine")
    d = base / f"kcops-test-{uuid.uuid4().hex[:12]}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
