"""The real agent (``kcops agent run``) against a misbehaving engine and probe socket.

A small threaded HTTP server plays the engine: it serves the vLLM fixture, then
a truncated page, a page that is not Prometheus text, and hangs past the
timeout. Garbage is sent to the probe socket and the engine pid disappears.
After each, the agent must still answer, with the error counted.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kcops.kernels import wire
from tests.services import free_port, kcops_bin, running, wait_http, wait_until

FIXTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "vllm_metrics.txt").read_bytes()


class Engine(BaseHTTPRequestHandler):
    mode = "ok"
    released = threading.Event()  # a hung request answers once this is set

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        mode = type(self).mode
        if mode == "hang":  # past the agent's timeout, until the test moves on
            type(self).released.wait(30)
        if self.path == "/health":
            body, ctype = b"{}", "application/json"
        elif mode == "truncated":
            body, ctype = FIXTURE[: len(FIXTURE) // 2 + 11], "text/plain"
        elif mode == "garbage":
            body, ctype = b"<html><h1>502</h1></html>\n", "text/plain"
        else:
            body, ctype = FIXTURE, "text/plain; version=0.0.4"
        with contextlib.suppress(OSError):
            self.send_response(200)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


@contextlib.contextmanager
def engine() -> Iterator[tuple[int, type[Engine]]]:
    handler: type[Engine] = type("E", (Engine,), {"mode": "ok", "released": threading.Event()})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1], handler
    finally:
        handler.released.set()
        srv.shutdown()
        srv.server_close()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def errors(m: dict, collector: str, reason: str) -> float:
    return m.get(
        ("kcops_collector_errors_total", (("collector", collector), ("reason", reason))), 0.0
    )


def test_agent_survives_a_misbehaving_engine_and_probe(tmp_path: Path) -> None:
    # the engine's pid: alive until killed below (or until this test's end closes its stdin)
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    sock_path = tmp_path / "probe.sock"
    port = free_port()
    agent_url = f"http://127.0.0.1:{port}"
    with engine() as (eport, handler):
        cfg = tmp_path / "agent.yaml"
        cfg.write_text(
            f"""
agent: {{tick_s: 0.3}}
engine: {{url: "http://127.0.0.1:{eport}", adapter: vllm, timeout_s: 0.25, pid: {sleeper.pid}}}
collectors:
  probe: {{socket_path: "{sock_path}"}}
"""
        )
        cmd = [
            kcops_bin(),
            "agent",
            "run",
            "--config",
            str(cfg),
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path / "state"),
            "--mode",
            "off",
        ]
        try:
            with running(cmd, log_path=tmp_path / "agent.log") as agent:
                wait_http(agent_url + "/healthz", 30, agent)
                wait_until(
                    lambda: any(k[0] == "kcops_requests_running" for k in scrape(agent_url)),
                    10,
                    "the engine's series on the agent",
                )
                m = scrape(agent_url)
                assert m[("kcops_engine_up", ())] == 1
                assert m[("kcops_process_up", (("process", "engine"),))] == 1

                for mode, reason in (
                    ("truncated", "truncated"),
                    ("garbage", "parse"),
                    ("hang", "timeout"),
                ):
                    handler.mode = mode
                    wait_until(
                        lambda r=reason: errors(scrape(agent_url), "engine_scrape", r) >= 2,
                        10,
                        f"two engine_scrape errors of reason {reason}",
                    )
                    assert agent.poll() is None
                # hung: not answering in time (the health sample of the tick that counted the
                # second timeout may be published a moment after the count)
                wait_until(
                    lambda: scrape(agent_url).get(("kcops_engine_up", ())) == 0,
                    10,
                    "kcops_engine_up at 0 while the engine hangs",
                )
                handler.mode = "ok"
                handler.released.set()
                wait_until(
                    lambda: scrape(agent_url).get(("kcops_engine_up", ())) == 1,
                    10,
                    "kcops_engine_up back at 1",
                )

                good = wire.encode(wire.Frame(pid=1, process="p", seq=0, calls_by_layer={"0": 2}))
                # cut short, another version, no header at all: a connection each
                for junk in (b"junk", b"KCPF\x00\x07\x00\x00\x00\x00", b"\x00" * 5000, good):
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                        s.connect(str(sock_path))
                        s.sendall(junk)
                bad = ("kcops_probe_frames_total", (("outcome", "malformed"),))
                ok = ("kcops_probe_frames_total", (("outcome", "ok"),))

                def all_counted() -> bool:
                    m = scrape(agent_url)
                    return m.get(bad) == 2 and m.get(ok) == 1

                wait_until(all_counted, 10, "two malformed frames and the good one")
                m = scrape(agent_url)
                assert m[("kcops_probe_frames_total", (("outcome", "unknown_version"),))] == 1
                for reason in ("truncated", "bad_version", "bad_magic"):
                    assert m[("kcops_probe_frames_refused_total", (("reason", reason),))] == 1
                calls = (("engine", "unknown"), ("layer", "0"), ("process", "p"))  # a bare probe
                assert m[("kcops_attention_calls_total", calls)] == 2

                sleeper.kill()
                sleeper.wait()
                wait_until(
                    lambda: errors(scrape(agent_url), "process", "process_gone") >= 2,
                    10,
                    "two process_gone errors",
                )
                m = scrape(agent_url)
                assert m[("kcops_process_up", (("process", "engine"),))] == 0
                st = httpx.get(agent_url + "/api/v1/status", timeout=5).json()
                cols = st["components"]["collectors"]["collectors"]
                assert "gone" in cols["process"]["error"]
                assert cols["nvml"]["ok"] is False and "driver" in cols["nvml"]["error"]
                assert agent.poll() is None
                out = subprocess.run(
                    [kcops_bin(), "status", "--agent", agent_url],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                assert "nvml: unavailable (" in out.stdout, out.stdout + out.stderr
                assert not [k for k in scrape(agent_url) if k[0].startswith("kcops_gpu_")]
        finally:
            if sleeper.poll() is None:
                sleeper.kill()
                sleeper.wait()
            assert sleeper.stdin is not None
            sleeper.stdin.close()
