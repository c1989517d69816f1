"""The CLI waits out the query API's momentary refusal (503 ``unavailable``), and only
that: a real HTTP server on 127.0.0.1 answers 503 a set number of times."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kcops.cli.common import RETRY_UNAVAILABLE_S, agent_request


class Refusing(BaseHTTPRequestHandler):
    refusals = 0
    error_type = "unavailable"
    calls = 0

    def _answer(self) -> None:
        cls = type(self)
        cls.calls += 1
        if cls.calls <= cls.refusals:
            body, code = {"status": "error", "errorType": cls.error_type, "error": "busy"}, 503
        else:
            body, code = {"status": "success", "data": {}}, 200
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _reset(refusals: int, error_type: str = "unavailable") -> None:
    Refusing.refusals, Refusing.error_type, Refusing.calls = refusals, error_type, 0


def test_a_get_waits_out_the_query_apis_refusal(server: str) -> None:
    _reset(len(RETRY_UNAVAILABLE_S))
    assert agent_request("GET", server, "/api/v1/query?query=up").status_code == 200
    assert Refusing.calls == len(RETRY_UNAVAILABLE_S) + 1


def test_a_refusal_that_lasts_is_returned_and_nothing_else_is_retried(server: str) -> None:
    _reset(10)
    assert agent_request("GET", server, "/api/v1/query?query=up").status_code == 503
    assert Refusing.calls == len(RETRY_UNAVAILABLE_S) + 1  # then the caller sees the 503
    _reset(1)
    assert agent_request("POST", server, "/api/v1/actions/x").status_code == 503  # not a GET
    assert Refusing.calls == 1
    _reset(1, error_type="timeout")  # the query itself was too costly: retrying won't help
    assert agent_request("GET", server, "/api/v1/query?query=up").status_code == 503
    assert Refusing.calls == 1
