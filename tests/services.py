"""Start real services (Redis, Prometheus, Alertmanager, kcops processes) on
free ports of 127.0.0.1 for tests, and always stop them.

Import from tests as ``from tests.services import ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import httpx

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
T = TypeVar("T")


_BLOCK = 1500  # ports per pytest process
_handed: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _block() -> range:
    """This pytest process's own block of ports, below the kernel's ephemeral range.

    A port from ``bind(0)`` comes from the ephemeral range, where it can be taken
    by any outgoing connection (or by the other xdist worker) between the moment we
    close it and the moment the service binds it: CI saw redis-server exit for that
    reason. Below that range nothing is handed out by the kernel, and each xdist
    worker draws from a block of its own.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    low = 10000 + index * _BLOCK
    if low + _BLOCK > _ephemeral_low():
        low = 10000 + (index % 4) * _BLOCK
    return range(low, low + _BLOCK)


def free_port() -> int:
    """A port that is free now and that no other test process will be handed."""
    block = _block()
    for _ in range(2):
        start = random.randrange(len(block))  # two sessions on one machine rarely meet
        for i in range(len(block)):
            port = block[(start + i) % len(block)]
            if port in _handed:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed.add(port)
            return port
        _handed.clear()  # every port was handed once; those of finished tests are free again
    raise RuntimeError(f"no free port left in {block.start}-{block.stop - 1}")


def kcops_bin() -> str:
    exe = VENV_BIN / "kcops"
    return str(exe) if exe.exists() else (shutil.which("kcops") or "kcops")


def wait_until(
    check: Callable[[], T | None],
    timeout_s: float,
    what: str,
    on_fail: Callable[[], str] | None = None,
    *,
    interval_s: float = 0.05,
    retry_on: tuple[type[Exception], ...] = (),
) -> T:
    """Poll ``check`` until it returns something truthy (not None), and return that value.

    An exception of a type in ``retry_on`` counts as "not yet". After ``timeout_s`` fail
    naming ``what``, the last value (or exception) seen, and ``on_fail()``'s text (a log
    tail, say). The one wait helper of the tests: a test waits on a condition, not the clock.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        last: object
        try:
            got = check()
        except retry_on as exc:
            last = exc
        else:
            if got:
                return got
            last = got
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(timeout_s, what, last, on_fail))
        time.sleep(interval_s)


async def wait_until_async(
    check: Callable[[], Awaitable[T | None]],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.05,
) -> T:
    """`wait_until` inside an event loop: ``check`` is awaited, the loop runs meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(timeout_s, what, got, None))
        await asyncio.sleep(interval_s)


def _timed_out(timeout_s: float, what: str, last: object, on_fail: Callable[[], str] | None) -> str:
    extra = f"\n{on_fail()}" if on_fail is not None else ""
    return f"timed out after {timeout_s}s waiting for {what} (last: {last!r}){extra}"


def wait_port(port: int, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout_s}s")


def wait_http(url: str, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s ({last})")


def unix_connect(path: Path, data: bytes = b"", timeout_s: float = 10.0) -> socket.socket:
    """A connected Unix stream socket to ``path``, ``data`` sent. While the listener's
    backlog is full, connect fails at once (EAGAIN, or ECONNREFUSED for some kernels) until
    it accepts: retried every 2 ms for ``timeout_s``, then a TimeoutError that says so."""
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            c.connect(str(path))
            break
        except (BlockingIOError, ConnectionRefusedError) as exc:
            if time.monotonic() >= deadline:
                c.close()
                raise TimeoutError(f"{path} accepted no connection within {timeout_s}s") from exc
            time.sleep(0.002)
    if data:
        c.sendall(data)
    return c


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@contextlib.contextmanager
def running(
    cmd: Sequence[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen]:
    """Start ``cmd`` in its own process group, logging to ``log_path``; stop it on exit."""
    log = open(log_path, "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        list(cmd),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        stop(proc)
        log.close()


def need_binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        raise RuntimeError(f"{name} not installed: run `make services` (Debian package)")
    return path


@contextlib.contextmanager
def redis_server(tmp: Path) -> Iterator[str]:
    """A real redis-server on a free port; yields its URL."""
    port = free_port()
    exe = need_binary("redis-server")
    cmd = [
        exe,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(tmp),
    ]
    with running(cmd, log_path=tmp / "redis.log") as proc:
        wait_port(port, 15, proc)
        yield f"redis://127.0.0.1:{port}/0"


@contextlib.contextmanager
def agent_in_thread(
    tmp: Path,
    *,
    tick_s: float = 0.1,
    min_ticks: int = 2,
    token: str | None = None,
    config: dict[str, object] | None = None,
    **agent_kwargs: object,
) -> Iterator[str]:
    """A real Agent (HTTP included) on its own event loop in a thread; yields its URL."""
    import asyncio
    import threading

    from kcops.agent.app import Agent
    from kcops.agent.config import parse_config

    port = free_port()
    cfg = parse_config(
        {
            "agent": {"listen": f"127.0.0.1:{port}", "state_dir": str(tmp), "tick_s": tick_s},
            **(config or {}),
        }
    )
    agent = Agent(cfg, token=token, **agent_kwargs)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_until_complete, args=(agent.run(False),), daemon=True)
    t.start()
    try:
        wait_until(
            lambda: agent.ticks_done >= min_ticks or not t.is_alive(), 20, f"{min_ticks} ticks"
        )
        if not t.is_alive():
            raise AssertionError("the agent's thread ended before its first ticks (see its log)")
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(agent.request_stop)
        t.join(10)
