"""A child cgroup that freezes a process (cgroup v2's ``cgroup.freeze`` or the v1 freezer),
for tests of what the agent reads of a process that cannot run, nor take a signal."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.services import wait_until

CGROUP = Path("/sys/fs/cgroup")
POLL_S = 0.2


@dataclass
class Freezer:
    """A child cgroup of the freezer this host has: cgroup v2 (``cgroup.freeze``) when
    /sys/fs/cgroup is v2 alone, else the v1 freezer (also on a hybrid host, whose v2 tree
    under /sys/fs/cgroup/unified holds no controller)."""

    folder: Path
    v2: bool

    def add(self, pid: int) -> Path:
        """Move ``pid`` here; return the cgroup it came from."""
        came = self.origin(pid)
        (self.folder / "cgroup.procs").write_text(str(pid))
        return came

    def origin(self, pid: int) -> Path:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (self.v2 and controllers == "") or (
                not self.v2 and "freezer" in controllers.split(",")
            ):
                return self.folder.parent / path.lstrip("/")
        raise AssertionError(f"pid {pid} is in no cgroup of {self.folder.parent}")

    def freeze(self, on: bool) -> None:
        if self.v2:
            (self.folder / "cgroup.freeze").write_text("1" if on else "0")
        else:
            (self.folder / "freezer.state").write_text("FROZEN" if on else "THAWED")

    def frozen(self) -> bool:
        if self.v2:
            return "frozen 1" in (self.folder / "cgroup.events").read_text()
        return (self.folder / "freezer.state").read_text().strip() == "FROZEN"

    def empty(self, back: Path) -> bool:
        """Move what is left back to ``back``; True once the cgroup holds nothing."""
        pids = (self.folder / "cgroup.procs").read_text().split()
        for pid in pids:
            with contextlib.suppress(OSError):  # gone meanwhile
                (back / "cgroup.procs").write_text(pid)
        return not (self.folder / "cgroup.procs").read_text().split()


def freezer() -> Freezer:
    """A child cgroup to freeze in (tried now), or the test is skipped saying what is
    missing."""
    if (CGROUP / "cgroup.controllers").exists():
        parent, v2 = CGROUP, True
    elif (CGROUP / "freezer" / "cgroup.procs").exists():
        parent, v2 = CGROUP / "freezer", False
    else:
        pytest.skip(f"no cgroup freezer: {CGROUP} is neither cgroup v2 nor has a v1 freezer")
    folder = parent / f"kcops-test-incident-{os.getpid()}"
    try:
        folder.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a child cgroup under {parent} (read-only or not delegated "
                    f"to this user): {exc}")  # fmt: skip
    knob = "cgroup.freeze" if v2 else "freezer.state"
    has_knob = (folder / knob).exists()
    folder.rmdir()  # made again by frozen(), which removes it whatever happens
    if not has_knob:
        pytest.skip(f"{parent}: a child cgroup has no {knob} (a kernel older than 5.2 for v2)")
    return Freezer(folder, v2)


@contextlib.contextmanager
def frozen(fz: Freezer, pid: int) -> Iterator[None]:
    """Freeze ``pid`` in ``fz``; thaw it and remove the cgroup on the way out (a killed
    process in a v1 freezer dies only once thawed)."""
    back = fz.origin(pid)
    fz.folder.mkdir()
    try:
        fz.add(pid)
        fz.freeze(True)
        wait_until(fz.frozen, 30, f"{fz.folder} frozen", interval_s=POLL_S)
        yield
    finally:
        fz.freeze(False)
        wait_until(lambda: fz.empty(back), 30, f"{fz.folder} empty", interval_s=POLL_S)
        fz.folder.rmdir()
