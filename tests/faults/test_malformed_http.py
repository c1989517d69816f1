"""Malformed HTTP at the socket, against the real agent and the real worker.

Each request no client library would send (a broken request line, headers, chunked
bodies, non-UTF-8 bytes, TLS on the HTTP port) gets a JSON 4xx or a clean close;
neither server logs a traceback, and both still answer afterwards.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.faults.conftest import TOKEN, RealAgent, RealWorker
from tests.faults.rawhttp import MALFORMED, assert_json_4xx_or_closed, send_raw

pytestmark = pytest.mark.slow


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def _no_traceback(log: Path) -> None:
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert not [line for line in text.splitlines() if "ERROR aiohttp" in line], text[-3000:]


def _malformed_everywhere(port: int, post_path: str, health_url: str, log: Path) -> None:
    cases = [(name, [p.replace(b"/healthz", post_path.encode()) for p in parts])
             for name, parts in MALFORMED]  # fmt: skip
    for name, parts in cases:
        assert_json_4xx_or_closed(send_raw(port, parts), name)
    # a client that gives up mid-body: the server closes, nothing is logged as a bug
    cut = f"POST {post_path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{".encode()
    assert_json_4xx_or_closed(send_raw(port, [cut], half_close=True), "body cut short")
    # the same bad chunk as above, after a good one (aiohttp queues that error; the body
    # deadline answers it: checked with a short deadline in tests/unit/agent/test_control.py)
    assert httpx.get(health_url, timeout=1.0).status_code == 200
    _no_traceback(log)


def test_malformed_requests_to_the_agent(real_agent: RealAgent) -> None:
    port = _port(real_agent.url)
    _malformed_everywhere(port, "/api/v1/alertmanager", real_agent.url + "/healthz", real_agent.log)
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    for body in (b"\xff\xfe\xfd", b'{"alerts": "\xc3"}', b"\xed\xa0\x80"):
        req = b"POST /api/v1/alertmanager HTTP/1.1\r\nHost: x\r\n" + auth
        req += b"Content-Length: %d\r\n\r\n" % len(body) + body
        answer = send_raw(port, [req])
        assert answer.status == 400, answer
        assert_json_4xx_or_closed(answer, body)
    bad_auth = b"POST /api/v1/actions/notify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\r\n"
    answer = send_raw(port, [bad_auth + b"Content-Length: 2\r\n\r\n{}"])
    assert answer.status == 401
    assert_json_4xx_or_closed(answer, "non-UTF-8 Authorization")
    _no_traceback(real_agent.log)


def test_malformed_requests_to_the_worker(real_worker: RealWorker) -> None:
    _malformed_everywhere(
        real_worker.port, "/v1/completions", real_worker.url + "/health", real_worker.log
    )
    for body in (b"\xff\xfe\xfd", b'{"prompt": "\xc3"}', b'{"prompt": "\\ud800"}'):
        req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
        req += b"Content-Length: %d\r\n\r\n" % len(body) + body
        answer = send_raw(real_worker.port, [req])
        assert answer.status == 400, answer
        assert_json_4xx_or_closed(answer, body)
        assert "message" in answer.json()["error"]  # the OpenAI shape
    bad_auth = b"POST /admin/route HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\r\n"
    answer = send_raw(real_worker.port, [bad_auth + b"Content-Length: 2\r\n\r\n{}"])
    assert answer.status == 401
    assert_json_4xx_or_closed(answer, "non-UTF-8 Authorization")
    _no_traceback(real_worker.log)
