"""``kcops incident``: the summary of a record, and the commands against the agent's own
incident routes and records on disk, served on 127.0.0.1."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner

from kcops.agent.atomicfile import Writer
from kcops.agent.incidents.book import Book
from kcops.agent.incidents.routes import build_routes
from kcops.auth import TokenCheck
from kcops.cli import cli
from kcops.cli.common import Doc
from kcops.cli.incident import summary, where_hung

TOKEN = "t0ken"
ID = "20261207T043512Z-1a2b"
T0 = 1796600000.0


def _frame(name: str, file: str, line: int) -> Doc:
    return {"name": name, "file": file, "line": line}


def _proc(pid: int, role: str, threads: list[Doc], error: str | None = None) -> Doc:
    return {
        "pid": pid, "ppid": 1, "role": role, "cmdline": f"python -m {role}", "state": "S",
        "state_words": "sleeping", "frozen": False, "wchan": "futex_wait_queue",
        "threads": len(threads) or 3, "rss_bytes": 3 * 2**30, "fds": 40, "cpu_s": 12.5,
        "stacks": {"tool": "py-spy 0.4.3", "native": False, "error": error, "threads": threads},
    }  # fmt: skip


def _thread(tid: int, name: str, frames: list[Doc], **flags: bool) -> Doc:
    return {"thread_id": tid, "name": name, "active": flags.get("active", False),
            "owns_gil": flags.get("owns_gil", False), "frames": frames}  # fmt: skip


MANIFEST: Doc = {
    "id": ID, "opened_at": T0, "closed_at": T0 + 40.0, "status": "closed",
    "why_incomplete": None, "trigger": "KcopsEngineStalled",
    "alerts": [
        {"alertname": "KcopsEngineStalled", "labels": {}, "state": "resolved",
         "first_t": T0 - 5, "inhibited_by": None},
        {"alertname": "KcopsEngineDown", "labels": {}, "state": "inhibited",
         "first_t": T0 + 3, "inhibited_by": "KcopsEngineRestarting"},
    ],
    "timeline": [
        {"t": T0, "kind": "alert", "what": "KcopsEngineStalled firing", "alertname":
         "KcopsEngineStalled", "state": "firing", "action": None, "outcome": None},
        {"t": T0 + 0.8, "kind": "capture", "what": "stacks of 2 processes in 0.8s",
         "alertname": None, "state": None, "action": None, "outcome": None},
        {"t": T0 + 2.5, "kind": "action", "what": "restart_worker ok", "alertname": None,
         "state": None, "action": "restart_worker", "outcome": "ok"},
    ],
    "capture": {"started_at": T0, "seconds": 0.8, "budget_s": 2.0, "complete": False,
                "missing": ["output (no pods/log RBAC)"]},
    "parts": {"processes.json": 2000, "output.txt": 100, "series.om": 5000},
}  # fmt: skip
RECORD: Doc = {
    **MANIFEST,
    "processes": [
        _proc(100, "API server", [], error="py-spy: Permission denied\x1b[31m"),
        _proc(101, "EngineCore", [
            _thread(7, "Thread-2", [_frame("wait", "threading.py", 331)]),
            _thread(101, "MainThread", [
                _frame("execute_model", "kcops/plugin.py", 88),
                _frame("step", "vllm/v1/engine/core.py", 210),
                _frame("run_busy_loop", "vllm/v1/engine/core.py", 500),
            ], active=True),
            _thread(8, "gloo", [_frame("wait", "threading.py", 331)], owns_gil=True),
        ]),
    ],
    "output": [f"line {i}" for i in range(30)] + ["\x1b[2Jgone\u202e"],
    "series_bytes": 5000,
}  # fmt: skip


def test_summary_names_each_process_where_it_hung_and_escapes_the_engines_text() -> None:
    text = summary(copy.deepcopy(RECORD))
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b[2Jgone\\u202e" in text
    assert "pid 101 EngineCore: S sleeping, wchan futex_wait_queue, 3 threads" in text
    assert "RSS 3072 MiB, CPU 12.5 s" in text
    hung = text.index("where it hung (101 MainThread, active):")
    assert text.index("execute_model (kcops/plugin.py:88)") > hung
    assert "thread (8 gloo, owns the GIL):" in text  # idle-looking, but holds the GIL
    assert "Thread-2" not in text and "(1 more thread(s) idle in a wait)" in text
    assert "stack error: py-spy: Permission denied\\x1b[31m" in text
    assert "  line 10\n" not in text and "  line 11\n" in text and "(20 of 31)" in text
    assert "    +2.5s  action   restart_worker ok" in text
    assert "capture missed: output (no pods/log RBAC)" in text
    assert "KcopsEngineDown (inhibited by KcopsEngineRestarting)" in text
    assert where_hung(RECORD) == "EngineCore (pid 101): execute_model (kcops/plugin.py:88)"


def test_summary_of_a_frozen_process_and_of_a_record_without_capture() -> None:
    rec = copy.deepcopy(RECORD)
    rec["processes"][1]["frozen"] = True
    assert "EngineCore: S sleeping, frozen" in summary(rec)
    bare = {**MANIFEST, "capture": None, "processes": [], "output": [], "timeline": []}
    text = summary(bare)
    assert (
        "capture: not taken (yet)" in text
        and "capture missed: -" in text
        and "(none captured)" in text
    )
    assert where_hung(bare) is None
    # The API server's event loop idles in select: the EngineCore is where it hung.
    idle = _thread(100, "MainThread", [_frame("select", "selectors.py", 468)])
    rec["processes"][0]["stacks"]["threads"] = [idle]
    assert where_hung(rec) == "EngineCore (pid 101): execute_model (kcops/plugin.py:88)"
    rec["processes"] = rec["processes"][:1]
    assert where_hung(rec) == "API server (pid 100): select (selectors.py:468)"


@pytest.fixture
def book(tmp_path: Path) -> Book:
    """The agent's own store of records, holding RECORD as the agent writes it."""
    book = Book(tmp_path / "incidents", max_count=50, max_bytes=1 << 26)
    book.create(dict(MANIFEST))
    book.write(ID, "processes.json", json.dumps(RECORD["processes"]).encode())
    book.write(ID, "output.txt", "\n".join(RECORD["output"]).encode())
    book.write(ID, "series.om", b"#" * 5000)
    return book


@pytest.fixture
def agent(book: Book, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The agent's incident routes, served by aiohttp on 127.0.0.1 from a thread."""
    monkeypatch.setenv("KCOPS_TOKEN", TOKEN)
    app = web.Application()
    app.add_routes(build_routes(book, Writer("incidents-test"), TokenCheck(TOKEN)))
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["incident", *args])
    return res.exit_code, res.output


def test_list_and_show(agent: str) -> None:
    code, out = _run("list", "--agent", agent)
    assert code == 0, out
    row = out.splitlines()[1].split()
    assert row[0] == ID and "closed" in row and "KcopsEngineStalled" in row and "2" in row
    assert out.rstrip().endswith("missing: output (no pods/log RBAC)")
    code, out = _run("show", ID, "--agent", agent)
    assert code == 0 and "where it hung" in out and "execute_model" in out, out
    code, out = _run("show", ID, "--agent", agent, "--json")
    assert code == 0 and json.loads(out) == RECORD


def test_clear_errors(agent: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, out = _run("show", "20261207T000000Z-dead", "--agent", agent)
    assert code == 1 and "no incident '20261207T000000Z-dead'" in out and ID in out, out
    assert "kcops incident list" in out
    code, out = _run("show", "../../alerts", "--agent", agent)  # quoted: stays one id
    assert code == 1 and "not an incident id: '../../alerts'" in out, out
    assert "kcops incident list" in out
    code, out = _run("list", "--agent", "http://127.0.0.1:9")
    assert code == 3 and "cannot reach the agent" in out, out
    bad = tmp_path / "bad"
    bad.write_text("wrong")
    code, out = _run("list", "--agent", agent, "--token-file", str(bad))
    assert code == 1 and "refused the token (401)" in out, out
    monkeypatch.delenv("KCOPS_TOKEN")
    code, out = _run("list", "--agent", agent)
    assert code == 2 and "no token" in out, out


def test_export_writes_the_archive_whole_and_overwrites_only_when_forced(
    agent: str, tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()
    out_file = tmp_path / "out" / "inc.tar.gz"
    code, out = _run("export", ID, "--out", str(out_file), "--agent", agent)
    assert code == 0, out
    with tarfile.open(out_file) as tar:
        assert f"kcops-incident-{ID}/processes.json" in tar.getnames()
    code, out = _run("export", ID, "--out", str(out_file), "--agent", agent)
    assert code == 2 and "--force" in out, out
    out_file.write_bytes(b"old")
    gone = "20261207T000000Z-dead"
    code, out = _run("export", gone, "--out", str(out_file), "--agent", agent, "--force")
    assert code == 1 and f"no incident '{gone}'" in out, out
    assert out_file.read_bytes() == b"old" and list(out_file.parent.iterdir()) == [out_file]
    code, out = _run("export", ID, "--out", str(out_file), "--agent", agent, "--force")
    assert code == 0 and tarfile.is_tarfile(out_file), out
    code, out = _run("export", ID, "--out", str(tmp_path / "no" / "x.tar.gz"), "--agent", agent)
    assert code == 2 and "No such file or directory" in out, out


def test_the_reports_section_lists_the_windows_incidents(agent: str) -> None:
    from kcops.cli.report.incidents import incidents_section

    auth = {"Authorization": f"Bearer {TOKEN}"}
    page = incidents_section(agent, T0 - 60, T0 + 60, auth)
    assert f"<td>{ID}</td><td>KcopsEngineStalled</td>" in page
    assert "EngineCore (pid 101): execute_model (kcops/plugin.py:88)" in page
    assert "No incident was opened" in incidents_section(agent, T0 + 1, T0 + 60, auth)
    assert "needs KCOPS_TOKEN" in incidents_section(agent, T0 - 60, T0 + 60, {})
    assert "refused the token" in incidents_section(agent, 0, T0 + 60, {"Authorization": "x"})
    assert "kcops incident list --agent" in incidents_section(None, 0, T0 + 60, auth)


class _DemoEnv:
    """What the hang drill's ending asks of DemoEnv: the agent's URL and the token."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.headers = {"Authorization": f"Bearer {TOKEN}"}


def test_the_hang_drill_ends_by_printing_the_incident_or_saying_there_is_none(
    agent: str, book: Book, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kcops.demo import causes

    causes.show_incident(_DemoEnv(agent), "KcopsEngineDown")  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert f"(kcops incident show {ID}):" in out and "    where it hung (101 MainThread" in out
    monkeypatch.setattr(causes, "INCIDENT_WITHIN_S", 0.2)
    shutil.rmtree(book.root / ID)
    causes.show_incident(_DemoEnv(agent), "KcopsEngineDown")  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "NO INCIDENT RECORD for KcopsEngineDown" in out and "not within" in out


def test_native_frames_stay_in_the_json_and_the_summary_shows_the_python_ones() -> None:
    """A --native dump interleaves CPython's C frames (with their source lines) and libc's:
    the summary starts at the innermost Python frame; a thread with no Python frame shows
    its native ones."""
    rec = copy.deepcopy(RECORD)
    native = [_frame("select_epoll_poll_impl", "Modules/selectmodule.c", 1598),
              _frame("0x7f55", "libc.so.6", 0), _frame("EpollSelector.select", "selectors.py", 468),
              _frame("BaseEventLoop._run_once", "asyncio/base_events.py", 1884)]  # fmt: skip
    rec["processes"] = [_proc(100, "API server", [_thread(100, "MainThread", native)])]
    text = summary(rec)
    assert "EpollSelector.select (selectors.py:468)" in text and "select_epoll" not in text
    assert where_hung(rec) == "API server (pid 100): EpollSelector.select (selectors.py:468)"
    rec["processes"][0]["stacks"]["threads"][0]["frames"] = native[:2]
    assert "select_epoll_poll_impl (Modules/selectmodule.c:1598)" in summary(rec)
