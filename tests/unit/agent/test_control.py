"""The control API's edges: protocol errors as JSON in one log line, the body deadline, exposure."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner

from kcops.agent.app import Agent
from kcops.agent.config import parse_config
from kcops.agent.control import build_app
from kcops.agent.jsonapi import error_body
from kcops.agent.preflight import check_exposure, is_loopback
from kcops.cli import cli
from kcops.errors import ConfigError
from kcops.httpedge import JsonErrorRunner
from tests.faults.rawhttp import assert_json_4xx_or_closed, send_raw


@pytest.fixture
def server() -> Iterator[int]:
    """The agent's app (a 0.3 s body deadline) on a free port, served from another thread."""
    started = threading.Event()
    port: list[int] = []
    stop = threading.Event()

    async def serve() -> None:
        app = build_app(body_timeout_s=0.3)

        async def echo(request: web.Request) -> web.Response:
            return web.json_response({"bytes": len(await request.read())})

        app.router.add_post("/echo", echo)
        runner = JsonErrorRunner(app, error_body, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        assert runner.addresses
        port.append(runner.addresses[0][1])
        started.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await runner.cleanup()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield port[0]
    stop.set()
    thread.join(10)


def _records_with_tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info or r.exc_text]


def test_a_protocol_error_is_json_and_one_warning_line(
    server: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    answer = send_raw(server, [b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"])
    assert answer.status == 400
    assert_json_4xx_or_closed(answer, "Content-Length: abc")
    assert "Content-Length" in answer.json()["error"]
    lines = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert lines and all(r.levelno == logging.WARNING for r in lines)
    assert "\n" not in lines[0].getMessage()
    assert not _records_with_tracebacks(caplog)


def test_a_bad_chunk_after_a_good_one_is_answered_by_the_body_deadline(
    server: int, caplog: pytest.LogCaptureFixture
) -> None:
    # aiohttp's C parser queues this error behind the request instead of failing its
    # body: without the deadline the handler would wait for as long as the client stays.
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    answer = send_raw(server, [head, b"zz\r\nabc\r\n"], timeout_s=5)
    assert_json_4xx_or_closed(answer, "bad chunk mid-body")
    assert answer.status in (400, 408), answer
    assert not _records_with_tracebacks(caplog)


def test_a_client_that_stalls_mid_body_gets_408(server: int) -> None:
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"
    answer = send_raw(server, [head], timeout_s=5)
    assert answer.status == 408 and "within 0.3s" in answer.json()["error"]
    good = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
    assert send_raw(server, [good]).json() == {"bytes": 3}


def test_a_client_that_hangs_up_mid_body_is_not_logged_as_a_bug(
    server: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"
    assert send_raw(server, [head], half_close=True).status in (None, 400, 408)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not _records_with_tracebacks(caplog)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("agent.example.com", False),
    ],
)
def test_listening_beyond_loopback_needs_a_token(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    check_exposure(host, token_configured=True)  # with a token anything goes
    if loopback:
        check_exposure(host, token_configured=False)
    else:
        with pytest.raises(ConfigError, match="not a loopback address and no token"):
            check_exposure(host, token_configured=False)


def test_the_agent_refuses_to_start_on_0000_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KCOPS_TOKEN", raising=False)
    cfg = parse_config({"agent": {"listen": "0.0.0.0:0", "state_dir": str(tmp_path)}})
    with pytest.raises(ConfigError, match="KCOPS_TOKEN"):
        Agent(cfg, token=None)
    Agent(cfg, token="t")  # a token: allowed


def test_agent_run_on_0000_without_a_token_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        cli,
        ["agent", "run", "--listen", "0.0.0.0:0", "--state-dir", str(tmp_path)],
        env={"KCOPS_TOKEN": None},
    )
    assert res.exit_code == 2, res.output
    assert "not a loopback address" in res.output


def test_json_dumps_never_writes_a_bare_nan() -> None:
    import json
    import math

    from kcops.agent.jsonapi import json_dumps

    text = json_dumps({"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": (math.nan,)}})
    assert json.loads(text) == {"a": None, "b": [None, None, 1.5], "c": {"d": [None]}}
