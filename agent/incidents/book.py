"""Incident records on disk: ``<state_dir>/incidents/<id>/``, whole files only, bounded.

A record is born whole: its folder is filled as ``.<id>.new`` and renamed into place.
Each part and then the manifest (``incident.json``) are replaced atomically, so a kill
at any moment leaves whole files; a record still ``open`` when the agent starts is
marked ``incomplete`` (what it holds is whole, what it lacks is said). Past
``max_count`` records or ``max_bytes`` in all, the oldest are dropped and counted.
Every method touches the disk: the component calls them on its writer thread.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import tarfile
from pathlib import Path

from pydantic import JsonValue

from kcops.agent.atomicfile import write_bytes_atomic

MANIFEST = "incident.json"
ID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{4}$")
Manifest = dict[str, JsonValue]


class UnknownIncident(LookupError):
    pass


class Book:
    def __init__(self, root: Path, max_count: int, max_bytes: int) -> None:
        self.root = root
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.dropped = 0

    def recover(self) -> int:
        """Clear what a killed agent left half-made; mark its open records incomplete."""
        if not self.root.is_dir():
            return 0
        marked = 0
        for p in self.root.iterdir():
            if p.name.startswith("."):
                shutil.rmtree(p, ignore_errors=True)
                continue
            for tmp in p.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)
            if ID.match(p.name) and not (p / MANIFEST).exists():
                _remove(p)  # a drop cut short by an older agent: its manifest went first
                continue
            m = self._manifest(p.name)
            if m is not None and m.get("status") == "open":
                m["status"] = "incomplete"
                m["why_incomplete"] = "the agent stopped before the incident closed"
                self.write(p.name, MANIFEST, _json(m))
                marked += 1
        return marked

    def create(self, m: Manifest) -> None:
        new = self.root / f".{m['id']}.new"
        shutil.rmtree(new, ignore_errors=True)
        write_bytes_atomic(new / MANIFEST, _json(m))
        new.rename(self.root / str(m["id"]))
        self.prune(keep=str(m["id"]))

    def write(self, id_: str, name: str, data: bytes) -> None:
        """One part (or the manifest), whole; a record pruned meanwhile is not recreated."""
        if (self.root / id_).is_dir():
            write_bytes_atomic(self.root / id_ / name, data)

    def prune(self, keep: str | None = None) -> None:
        ids = self.ids()  # newest first
        sizes = {i: _size(self.root / i) for i in ids}
        total = sum(sizes.values())
        for i in reversed(ids):
            if len(ids) <= self.max_count and total <= self.max_bytes:
                break
            if i == keep:
                continue
            _remove(self.root / i)
            ids.remove(i)
            total -= sizes[i]
            self.dropped += 1

    def ids(self) -> list[str]:
        try:
            names = [p.name for p in self.root.iterdir() if ID.match(p.name)]
        except OSError:
            return []
        return sorted(names, reverse=True)

    def manifests(self) -> list[Manifest]:
        return [m for i in self.ids() if (m := self._manifest(i)) is not None]

    def read(self, id_: str) -> Manifest:
        """The manifest with its parts: processes, output lines, the series' size."""
        m = self._manifest(id_)
        if m is None:
            raise UnknownIncident(id_)
        folder = self.root / id_
        procs: JsonValue = []
        with contextlib.suppress(OSError, ValueError):
            procs = json.loads((folder / "processes.json").read_bytes())
        try:
            output = (folder / "output.txt").read_text(errors="replace").splitlines()
        except OSError:
            output = []
        series = folder / "series.om"
        return {
            **m,
            "processes": procs,
            "output": list(output),
            "series_bytes": series.stat().st_size if series.exists() else 0,
        }

    def export(self, id_: str) -> bytes:
        if self._manifest(id_) is None:
            raise UnknownIncident(id_)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(
                self.root / id_,
                arcname=f"kcops-incident-{id_}",
                filter=lambda t: None if t.name.split("/")[-1].startswith(".") else t,
            )
        return buf.getvalue()

    def _manifest(self, id_: str) -> Manifest | None:
        if not ID.match(id_):
            return None
        try:
            m = json.loads((self.root / id_ / MANIFEST).read_bytes())
        except (OSError, ValueError):
            return None
        return m if isinstance(m, dict) else None


def _json(m: Manifest) -> bytes:
    return json.dumps(m, indent=1, default=str).encode()


def _remove(folder: Path) -> None:
    """Out of sight in one rename, then deleted: a kill midway leaves only a dot-folder."""
    gone = folder.with_name(f".{folder.name}.gone")
    try:
        folder.rename(gone)
    except OSError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def _size(folder: Path) -> int:
    with contextlib.suppress(OSError):
        return sum(f.stat().st_size for f in folder.iterdir())
    return 0
