"""The CLI waits out the query API's momentary refusal (503 ``unavailable``), and only
that, on every path a CLI reads the agent by (``agent_request`` and ``kcops top``'s and
``kcops report``'s client): a real HTTP server on 127.0.0.1 answers 503 a set number of
times."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import kcops.cli.common as common
from kcops.cli.common import agent_request
from kcops.cli.topdata import AgentClient, QueryBusy, QueryRefused

WAITS = (0.01, 0.02, 0.01)  # the schedule under test, short


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
            result = [{"metric": {}, "value": [0, "1"]}]
            body = {"status": "success", "data": {"resultType": "vector", "result": result}}
            code = 200
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
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(common, "RETRY_UNAVAILABLE_S", WAITS)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _reset(refusals: int, error_type: str = "unavailable") -> None:
    Refusing.refusals, Refusing.error_type, Refusing.calls = refusals, error_type, 0


def test_a_get_waits_out_the_query_apis_refusal(server: str) -> None:
    _reset(len(WAITS))
    assert agent_request("GET", server, "/api/v1/query?query=up").status_code == 200
    assert Refusing.calls == len(WAITS) + 1


def test_a_refusal_that_lasts_is_returned_and_nothing_else_is_retried(server: str) -> None:
    _reset(10)
    assert agent_request("GET", server, "/api/v1/query?query=up").status_code == 503
    assert Refusing.calls == len(WAITS) + 1  # then the caller sees the 503
    _reset(1)
    assert agent_request("POST", server, "/api/v1/actions/x").status_code == 503  # not a GET
    assert Refusing.calls == 1
    _reset(1, error_type="timeout")  # the query itself was too costly: retrying won't help
    assert agent_request("GET", server, "/api/v1/query?query=up").status_code == 503
    assert Refusing.calls == 1


def test_the_shipped_schedule_outlasts_a_loop_share_in_debt() -> None:
    # The share refills at 0.5 s a second; a query charged 10 s of loop time leaves it
    # 9.5 s in debt: 19 s before the next query is let in. The CLI must wait that long.
    assert sum(common.RETRY_UNAVAILABLE_S) >= 19.0
    assert common.RETRY_UNAVAILABLE_S[0] <= 0.25  # a brief refusal costs a brief wait


def test_tops_client_waits_out_the_refusal_in_every_get(server: str) -> None:
    client = AgentClient(server)
    _reset(len(WAITS))
    assert client.vector("up") == [({}, 1.0)]  # kcops top --once failed here in make test
    assert Refusing.calls == len(WAITS) + 1
    _reset(len(WAITS) + 1)
    with pytest.raises(QueryBusy, match="HTTP 503"):
        client.scalar("up")
    _reset(1, error_type="timeout")  # too costly: not waited out, the caller splits it
    with pytest.raises(QueryRefused):
        client.vector("up")
    assert Refusing.calls == 1
