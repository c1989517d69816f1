"""Raw HTTP over a socket, for requests no HTTP client would send (malformed on purpose)."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class RawAnswer:
    """What came back: nothing (a clean close), or a status line, headers and a body."""

    status: int | None
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _read_head(sock: socket.socket, deadline: float) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            return buf, b""
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def send_raw(
    port: int, parts: list[bytes], *, timeout_s: float = 10.0, half_close: bool = False
) -> RawAnswer:
    """Send ``parts`` (one ``sendall`` each) to 127.0.0.1:``port`` and read one answer.

    The answer ends at its Content-Length (a server may linger before it closes).
    ``half_close`` shuts the sending side after the last part (a client that gives up).
    """
    deadline = time.monotonic() + timeout_s
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        for part in parts:
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered and closed before taking it all
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        try:
            head, body = _read_head(sock, deadline)
        except ConnectionResetError:
            return RawAnswer(None, {}, b"")
        if not head:
            return RawAnswer(None, {}, b"")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        want = int(headers.get("content-length", "0"))
        while len(body) < want:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return RawAnswer(status, headers, body[:want])


def assert_json_4xx_or_closed(answer: RawAnswer, what: object) -> None:
    """A JSON 4xx naming the problem, or a clean close: never text/plain, never a 5xx."""
    if answer.status is None:
        return
    assert 400 <= answer.status < 500, (what, answer.status, answer.body[:300])
    assert answer.headers.get("content-type", "").startswith("application/json"), (
        what,
        answer.headers,
        answer.body[:300],
    )
    body = answer.json()
    assert "error" in body and "Traceback" not in answer.body.decode("utf-8", "replace"), body


# Requests no client library sends: (name, parts). Each is answered 4xx or closed.
MALFORMED: list[tuple[str, list[bytes]]] = [
    ("garbage request line", [b"HELLO THERE\r\n\r\n"]),
    ("bad HTTP version", [b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n"]),
    ("70 KB URL", [b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"]),
    ("10 KB header", [b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 9000 + b"\r\n\r\n"]),
    ("header without colon", [b"GET /healthz HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n"]),
    ("NUL in a header", [b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"]),
    ("non-UTF-8 header name", [b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-\xff\xfe: v\r\n\r\n"]),
    ("non-UTF-8 path", [b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n"]),
    ("Content-Length abc", [b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"]),
    ("Content-Length -1", [b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"]),
    (
        "two Content-Lengths",
        [b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"],
    ),
    (
        "Content-Length and chunked",
        [
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        ],
    ),
    (
        "bad chunk size",
        [b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n"],
    ),
    (
        "chunk longer than said",
        [b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcdef\r\n"],
    ),
    (
        "unknown transfer coding",
        [b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, zz\r\n\r\n"],
    ),
    ("TLS hello on the HTTP port", [b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03" + b"\0" * 32]),
    ("CRLFs, then garbage", [b"\r\n" * 64 + b"\x01\x02 \x03\r\n\r\n"]),
]
