"""`kcops demo` end to end on the tiny model: load, the NaN drill, the hang drill."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
from pathlib import Path

import psutil
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
    assert "- alerts pending or firing before the drills: none" in out.stdout, out.stdout[-3000:]
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


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_demo_leaves_no_process_behind(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM or SIGHUP during the load phase (a `timeout`, a closed SSH session) stops
    the demo like Ctrl-C: it exits 128 + the signal, and Redis, the agent, the worker
    and Locust (each in its own session, out of reach of the signal) are gone too."""
    work = tmp_path / "demo"
    cmd = [kcops_bin(), "demo", "--model", "tiny", "--load-seconds", "600", "--no-drills"]
    demo = subprocess.Popen(
        [*cmd, "--workdir", str(work)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    seen = b""
    kids: list[psutil.Process] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # the load phase: every process is up
            seen += line
            if b"real load with Locust" in line:
                break
        assert b"real load with Locust" in seen, seen.decode(errors="replace")[-3000:]
        kids = psutil.Process(demo.pid).children(recursive=True)
        names = " ".join(" ".join(k.cmdline()[:3]) for k in kids)
        assert "redis-server" in names and "locust" in names and "serve" in names, names
        demo.send_signal(sig)
        rest, _ = demo.communicate(timeout=180)
        text = (seen + rest).decode(errors="replace")
        assert demo.returncode == 128 + sig, text[-3000:]
        assert f"{sig.name}: stopping" in text, text[-3000:]
        _, alive = psutil.wait_procs(kids, timeout=10)
        assert not alive, [(p.pid, p.cmdline()) for p in alive]
    finally:  # a failing run must not leave its processes to the next tests
        for p in [demo, *kids]:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                p.kill()
