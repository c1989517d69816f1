"""The incident component on a real bus, store and disk: one record per incident, joins,
closing, the caps, the API, and the capture of real processes within its budget."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from kcops.agent.config.agent import IncidentsSection
from kcops.agent.engine import Engine
from kcops.agent.events import AlertTransition, EventBus
from kcops.agent.incidents import capture, series
from kcops.agent.incidents.book import Book
from kcops.agent.incidents.incidents import SETTLE_S, Incidents
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store
from kcops.auth import TokenCheck
from tests.freezer import freezer, frozen
from tests.services import wait_until

TOKEN = "t0k"
HUNG = """
import threading, time
lock = threading.Lock(); lock.acquire()
def where_it_hangs():
    print("ready", flush=True)
    lock.acquire()
where_it_hangs()
"""


@pytest.fixture
def hung() -> Iterator[subprocess.Popen[bytes]]:
    """A real Python process blocked on a lock in ``where_it_hangs``."""
    p = subprocess.Popen([sys.executable, "-c", HUNG], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    yield p
    p.kill()
    p.wait()


def make(tmp: Path, root: int | None = None, **cfg: object) -> tuple[Incidents, EventBus, Store]:
    bus, store = EventBus(), Store()

    async def output(_: float) -> list[str]:
        return ["--- engine started: pid 1 ---", "last words"]

    inc = Incidents(
        IncidentsSection.model_validate(cfg), tmp / "incidents", store, bus, Engine(None),
        lambda: root, output, tmp / "audit.jsonl", TokenCheck(TOKEN),
    )  # fmt: skip
    return inc, bus, store


def ev(name: str, state: str, t: float, **kw: object) -> AlertTransition:
    labels = {"severity": str(kw.pop("severity", "page"))}
    prev = "firing" if state == "inactive" else "pending"
    return AlertTransition(name, labels, prev, state, t, **kw)  # type: ignore[arg-type]


async def settle(inc: Incidents) -> None:
    while inc.tasks or (inc.capturing is not None and not inc.capturing.done()):
        await asyncio.sleep(0.01)


def test_one_incident_per_stall_the_inhibited_join_then_it_closes(tmp_path: Path) -> None:
    asyncio.run(_one_incident_per_stall_the_inhibited_join_then_it_closes(tmp_path))


async def _one_incident_per_stall_the_inhibited_join_then_it_closes(tmp_path: Path) -> None:
    inc, bus, _ = make(tmp_path, capture_budget_s=0)
    await inc.start()
    bus.publish(ev("KcopsEngineStalled", "firing", 100.0))
    bus.publish(ev("KcopsEngineRestarting", "firing", 101.0, severity="info"))
    bus.publish(ev("KcopsEngineDown", "firing", 102.0, inhibited_by="KcopsEngineRestarting"))
    id_ = await inc.keep("restart_worker", 101.0)
    assert id_ == inc.current()
    bus.publish(ev("KcopsEngineStalled", "inactive", 103.0))
    bus.publish(ev("KcopsEngineDown", "inactive", 104.0))
    bus.publish(ev("KcopsEngineRestarting", "inactive", 105.0, severity="info"))
    await inc.tick(105.0 + SETTLE_S - 1)
    assert inc.current() == id_  # not quiet for long enough yet
    await inc.tick(105.0 + SETTLE_S)
    await settle(inc)
    recs = inc.book.manifests()
    assert [r["id"] for r in recs] == [id_] and recs[0]["status"] == "closed"
    states = {a["alertname"]: a["state"] for a in recs[0]["alerts"]}
    assert states == dict.fromkeys(
        ("KcopsEngineStalled", "KcopsEngineRestarting", "KcopsEngineDown"), "resolved"
    )
    what = [e["what"] for e in recs[0]["timeline"]]
    assert "KcopsEngineDown inhibited" in what and what[-1].startswith("closed")
    # A second stall is a second incident; an info alert alone opens none.
    bus.publish(ev("KcopsEngineRestarting", "firing", 200.0, severity="info"))
    assert inc.current() is None
    bus.publish(ev("KcopsEngineStalled", "firing", 201.0))
    assert inc.current() not in (None, id_)
    await inc.stop()


def test_caps_hold_over_200_stalls(tmp_path: Path) -> None:
    asyncio.run(_caps_hold_over_200_stalls(tmp_path))


async def _caps_hold_over_200_stalls(tmp_path: Path) -> None:
    inc, bus, store = make(tmp_path, capture_budget_s=0.5, max_count=7, max_bytes=1 << 20)
    store.append(SeriesKey.of("kcops_engine_pending_requests"), 1.0, 3.0)
    await inc.start()
    t = 1000.0
    for _ in range(200):
        bus.publish(ev("KcopsEngineStalled", "firing", t))
        await inc.keep("restart_worker", t)
        bus.publish(ev("KcopsEngineStalled", "inactive", t + 1))
        await inc.tick(t + 1 + SETTLE_S)
        t += 10
    await settle(inc)
    folder = tmp_path / "incidents"
    kept = [p for p in folder.iterdir()]
    assert len(kept) <= 7 and inc.opened == 200 and inc.book.dropped == 200 - len(kept)
    assert sum(f.stat().st_size for p in kept for f in p.iterdir()) <= 1 << 20
    await inc.stop()


def test_capture_of_a_real_process_and_the_api(
    tmp_path: Path, hung: subprocess.Popen[bytes]
) -> None:
    asyncio.run(_capture_of_a_real_process_and_the_api(tmp_path, hung))


async def _capture_of_a_real_process_and_the_api(
    tmp_path: Path, hung: subprocess.Popen[bytes]
) -> None:
    inc, bus, store = make(tmp_path, root=hung.pid, capture_budget_s=2)
    for i in range(5):
        store.append(
            SeriesKey.of("kcops_engine_stalled_seconds", {"engine": 'a"b'}), 10.0 + i, float(i)
        )
    store.append(SeriesKey.of("kcops_store_series"), 12.0, 1.0)  # bookkeeping: not an engine series
    await inc.start()
    bus.publish(ev("KcopsEngineDown", "firing", 14.0))
    id_ = await inc.keep("restart_worker", 14.0)
    await settle(inc)
    app = web.Application()
    app.add_routes(inc.routes())
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/api/v1/incidents")).status == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.get("/api/v1/incidents/../../etc", headers=auth)).status in (400, 404)
        assert (await client.get("/api/v1/incidents/nope", headers=auth)).status == 400
        missing = await client.get("/api/v1/incidents/20200101T000000Z-abcd", headers=auth)
        assert missing.status == 404 and id_ in (await missing.json())["known"]
        rec = await (await client.get(f"/api/v1/incidents/{id_}", headers=auth)).json()
        exported = await client.get(f"/api/v1/incidents/{id_}/export", headers=auth)
        assert exported.status == 200 and exported.content_type == "application/gzip"
    (proc,) = rec["processes"]
    assert proc["pid"] == hung.pid and proc["state"] == "S" and proc["threads"] == 1
    frames = [f["name"] for t in proc["stacks"]["threads"] for f in t["frames"]]
    assert "where_it_hangs" in frames and proc["stacks"]["native"], proc["stacks"]
    assert rec["capture"]["complete"] and rec["capture"]["seconds"] <= 2.5
    assert rec["output"] == ["--- engine started: pid 1 ---", "last words"]
    text = (tmp_path / "incidents" / id_ / "series.om").read_text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert list(fams) == ["kcops_engine_stalled_seconds"]
    samples = fams["kcops_engine_stalled_seconds"].samples
    assert [s.value for s in samples] == [0, 1, 2, 3, 4] and samples[0].labels == {"engine": 'a"b'}
    await inc.stop()


def test_a_stopped_process_is_read_without_pausing_it_within_the_budget(
    hung: subprocess.Popen[bytes],
) -> None:
    os.kill(hung.pid, signal.SIGSTOP)
    wait_until(lambda: Path(f"/proc/{hung.pid}/stat").read_text().split(") ")[1][0] == "T", 10,
               "the process stopped")  # fmt: skip
    t0 = time.monotonic()
    found, missing = capture.processes(hung.pid, 1.0)
    assert time.monotonic() - t0 <= 1.5
    (proc,) = found
    assert proc["state"] == "T" and proc["state_words"] == "stopped"
    stacks = proc["stacks"]
    assert isinstance(stacks, dict) and not stacks["native"] and not missing, stacks
    frames = [f["name"] for t in stacks["threads"] for f in t["frames"]]
    assert "where_it_hangs" in frames


def test_a_capture_that_runs_out_of_budget_says_what_it_missed(
    hung: subprocess.Popen[bytes],
) -> None:
    found, missing = capture.processes(hung.pid, 0.0)
    assert found[0]["stacks"]["threads"] == [] and missing and "budget" in missing[0]
    assert capture.processes(None, 1.0) == ([], [missing_pid := capture.processes(None, 1.0)[1][0]])
    assert "pid is not known" in missing_pid


def test_an_open_record_left_by_a_killed_agent_is_marked_incomplete(tmp_path: Path) -> None:
    book = Book(tmp_path, 10, 1 << 20)
    book.create({"id": "20261207T000000Z-0001", "status": "open", "alerts": []})
    (tmp_path / ".20261207T000001Z-0002.new").mkdir()  # killed while being born
    (tmp_path / "20261207T000000Z-0001" / ".processes.json.1-2.tmp").write_text("{torn")
    dropped = tmp_path / "20261206T000000Z-0003"  # an old drop cut short: manifest gone first
    dropped.mkdir()
    (dropped / "output.txt").write_text("x")
    assert book.recover() == 1
    (m,) = book.manifests()
    assert m["status"] == "incomplete" and "stopped" in str(m["why_incomplete"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20261207T000000Z-0001"]
    assert [p.name for p in (tmp_path / "20261207T000000Z-0001").iterdir()] == ["incident.json"]
    json.loads((tmp_path / "20261207T000000Z-0001" / "incident.json").read_text())


def test_series_render_cuts_whole_series() -> None:
    window: series.Window = []
    store = Store()
    for i in range(3):
        store.append(SeriesKey.of("kcops_engine_x", {"i": str(i)}), 1.0, 1.0)
    window = series.snapshot(store, 0.0, 2.0)
    text, cut = series.render(window, 80)
    assert cut and text.endswith("# EOF\n") and text.count("kcops_engine_x{") == 1


def test_a_frozen_process_is_read_within_the_budget(hung: subprocess.Popen[bytes]) -> None:
    """Frozen by the cgroup freezer: no ptrace pause may wait on it; the stacks come from
    reading its memory, and the record says it is frozen."""
    fz = freezer()
    with frozen(fz, hung.pid):
        t0 = time.monotonic()
        found, missing = capture.processes(hung.pid, 1.0)
        took = time.monotonic() - t0
    (proc,) = found
    assert took <= 1.5 and proc["frozen"] is True, (took, proc)
    stacks = proc["stacks"]
    assert isinstance(stacks, dict) and not stacks["native"], stacks
    assert "where_it_hangs" in [f["name"] for t in stacks["threads"] for f in t["frames"]]
    assert not missing
