"""kill -9 while incident records are written: whole records or ones marked incomplete.

A child process opens records one after another the way the agent does (born whole,
then the capture of a real hung process, its parts and the manifest rewritten) and is
killed with SIGKILL at random moments. After each kill, the next start's recovery runs:
every record left must have a manifest that parses, parts that parse, no temp file,
and a status of closed or incomplete; none is torn.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcops.agent.incidents.book import MANIFEST, Book

pytestmark = pytest.mark.slow
WRITER = """
import json, sys, time, secrets
from pathlib import Path
from kcops.agent.incidents import capture
from kcops.agent.incidents.book import Book, MANIFEST
book = Book(Path(sys.argv[1]), 8, 4 << 20)
target = int(sys.argv[2])
n = 0
while True:
    n += 1
    id_ = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(1e9 + n)) + "-" + secrets.token_hex(2)
    m = {"id": id_, "status": "open", "alerts": [], "capture": None, "parts": {}}
    book.create(m)
    procs, missing = capture.processes(target, 1.0)
    parts = {"processes.json": json.dumps(procs * 40).encode(), "output.txt": b"x\\n" * 5000}
    for name, data in parts.items():
        book.write(id_, name, data)
    m.update(status="closed", parts={k: len(v) for k, v in parts.items()})
    m["capture"] = {"missing": missing}
    book.write(id_, MANIFEST, json.dumps(m).encode())
    print(n, flush=True)
"""


def test_kill9_during_capture_leaves_no_torn_record(tmp_path: Path) -> None:
    folder = tmp_path / "incidents"
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    rng = random.Random(38)
    seen = 0
    try:
        for _ in range(12):
            child = subprocess.Popen(
                [sys.executable, "-c", WRITER, str(folder), str(target.pid)],
                stdout=subprocess.PIPE,
            )
            assert child.stdout is not None
            child.stdout.readline()  # one whole record first, then kill at a random moment
            time.sleep(rng.uniform(0.0, 0.4))
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            book = Book(folder, 8, 4 << 20)
            book.recover()
            for p in folder.iterdir():
                assert not p.name.startswith("."), p
                names = {f.name for f in p.iterdir()}
                assert not any(n.startswith(".") for n in names), names
                m = json.loads((p / MANIFEST).read_bytes())
                assert m["status"] in ("closed", "incomplete"), m
                if "processes.json" in names:
                    assert isinstance(json.loads((p / "processes.json").read_bytes()), list)
                seen += 1
    finally:
        target.kill()
        target.wait()
    assert seen > 12 and len(list(folder.iterdir())) <= 8
