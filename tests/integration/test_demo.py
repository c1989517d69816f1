"""`kcops demo` end to end on the tiny model: load, the NaN drill, the hang drill."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.services import kcops_bin


@pytest.mark.slow
def test_demo_detects_and_repairs_both_drills(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    out = subprocess.run(
        [kcops_bin(), "demo", "--model", "tiny", "--load-seconds", "4", "--workdir", str(work)],
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "demo ok" in out.stdout
    assert "route mode now: fallback" in out.stdout
    records = [json.loads(x) for x in (work / "state" / "audit.jsonl").read_text().splitlines()]
    done = {(r["action"], r["outcome"]) for r in records if r.get("kind") == "action"}
    assert ("fallback_to_base", "ok") in done
    assert ("restart_worker", "ok") in done
    # The drill table: each alert fired, its ladder acted, and it resolved.
    assert re.search(r"KcopsAttentionErrors\s+yes\s+\S+\s+fallback_to_base\s+yes", out.stdout)
    assert re.search(r"KcopsEngineDown\s+yes\s+\S+\s+restart_worker\s+yes", out.stdout)
    # Locust's own numbers, and the report page of the run.
    assert "TTFT p99" in out.stdout and "error rate" in out.stdout
    page = (work / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 6
