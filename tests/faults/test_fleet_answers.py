"""The fleet commands (``kcops cost``, ``kcops kc recommend``, ``kcops report``) against a
Prometheus that answers badly: a real HTTP server on 127.0.0.1 answers every query one
broken way. Each answer ends the command with one line ``error: ...`` and a non-zero exit
(3 when no whole answer comes in time), never a traceback nor "no data" with exit 0, and
within bounded time and memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from kcops.cli import cli

COMMANDS = (("cost",), ("kc", "recommend"), ("report",))
HUGE_BYTES = 400 << 20


Answer = Callable[[BaseHTTPRequestHandler], None]


class Server:
    """Answers each GET with ``answer(handler)``."""

    def __init__(self, answer: Answer) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    answer(self)
                except OSError:
                    pass  # the client gave up: what the test wants

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def body(text: bytes, ctype: str = "application/json") -> Answer:
    def answer(h: BaseHTTPRequestHandler) -> int:
        h.send_response(200)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(text)))
        h.end_headers()
        h.wfile.write(text)

    return answer


def trickle(h: BaseHTTPRequestHandler) -> None:
    """A valid empty answer, one byte every 4 s (stopping after 90 s, so the test ends)."""
    text = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(text)))
    h.end_headers()
    h.wfile.flush()
    for i, byte in enumerate(text):
        if i * 4 > 90:
            break
        h.wfile.write(bytes([byte]))
        h.wfile.flush()
        time.sleep(4)


HUGE_SENT = [0]  # bytes the one huge answer got out


def huge(h: BaseHTTPRequestHandler) -> None:
    """400 MiB of valid JSON (an empty result padded with blanks), without a length."""
    h.protocol_version = "HTTP/1.0"
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.end_headers()
    pad = b" " * (1 << 20)
    h.wfile.write(b'{"status":"success","data":{"resultType":"matrix","result":[]')
    while HUGE_SENT[0] < HUGE_BYTES:
        h.wfile.write(pad)
        HUGE_SENT[0] += len(pad)
    h.wfile.write(b"}}")


BROKEN = {
    "html": body(b"<html><body>502 Bad Gateway</body></html>\n", "text/html"),
    "list": body(b"[]"),
    "no-data": body(b'{"status":"success"}'),
    "no-result": body(b'{"status":"success","data":{"resultType":"matrix"}}'),
    "not-a-number": body(
        b'{"status":"success","data":{"resultType":"matrix","result":'
        b'[{"metric":{},"values":[[1,"lots"]]}]}}'
    ),
}


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], Server]]:
    servers: list[Server] = []

    def start(answer: Answer) -> Server:
        servers.append(Server(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def run(cmd: tuple[str, ...], url: str, *extra: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    res = CliRunner().invoke(cli, [*cmd, "--prometheus", url, *extra], catch_exceptions=True)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"{cmd}: a traceback, not one line") from res.exception
    return res.exit_code, res.stderr, time.monotonic() - t0


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.parametrize("case", sorted(BROKEN))
@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_an_answer_it_cannot_read_is_one_line_and_exit_1(
    serve: Callable[..., Server], cmd: tuple[str, ...], case: str, tmp_path: object
) -> None:
    srv = serve(BROKEN[case])
    extra = ("--out", f"{tmp_path}/r.html") if cmd == ("report",) else ()
    code, err, _ = run(cmd, srv.url, *extra)
    assert code == 1, (code, err)
    one_error_line(err)


def test_a_trickled_answer_ends_the_command_within_its_deadline(
    serve: Callable[..., Server],
) -> None:
    srv = serve(trickle)
    code, err, took_s = run(("cost",), srv.url)
    assert code == 3, (code, err)
    assert "in time" in one_error_line(err)
    assert took_s < 40, took_s


def test_a_huge_answer_is_refused_before_it_is_read_whole(serve: Callable[..., Server]) -> None:
    HUGE_SENT[0] = 0
    code, err, _ = run(("cost",), serve(huge).url)
    assert code == 1, (code, err)
    assert "MiB" in one_error_line(err)
    # the client stopped reading past the cap: the server could not get it all out
    assert HUGE_SENT[0] < 128 << 20, HUGE_SENT[0]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_a_refused_selector_is_one_line_and_exit_2(
    serve: Callable[..., Server], cmd: tuple[str, ...]
) -> None:
    srv = serve(BROKEN["list"])
    code, err, _ = run(cmd, srv.url, "--selector", "namespace=prod")
    assert code == 2, (code, err)
    assert "--selector" in one_error_line(err)
