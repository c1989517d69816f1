"""Run Locust headless against an engine, watch the agent's alerts, read Locust's own stats.

Locust runs as a subprocess of this Python (``python -m locust``) with the
package's locustfile; its ``--csv`` stats file is the source of every number
printed: the aggregated p99 and error rate, and the ``TTFT`` entries' p99.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kcops.errors import ConfigError

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def locust_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("locust") is not None


@dataclass
class AlertEvent:
    alertname: str
    state: str
    at: float


@dataclass
class AlertWatch:
    """Polls an agent's ``/api/v1/alerts`` in a thread; keeps each (alert, state) first seen."""

    agent_url: str
    every_s: float = 2.0
    events: list[AlertEvent] = field(default_factory=list)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="alert-watch")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def poll(self, client: httpx.Client) -> None:
        try:
            alerts = client.get(self.agent_url.rstrip("/") + "/api/v1/alerts").json()["alerts"]
        except (httpx.HTTPError, ValueError, KeyError):
            self.errors += 1
            return
        seen = {(e.alertname, e.state) for e in self.events}
        now = time.time()
        for a in alerts:
            key = (a["alertname"], a["state"])
            if key not in seen:
                self.events.append(AlertEvent(a["alertname"], a["state"], now))
                seen.add(key)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                self.poll(client)
                self._stop.wait(self.every_s)


@dataclass
class Stats:
    """Locust's own numbers, read from its ``_stats.csv``."""

    rows: list[dict[str, str]]

    def requests(self) -> int:
        return sum(int(r["Request Count"]) for r in self.served())

    def failures(self) -> int:
        return sum(int(r["Failure Count"]) for r in self.served())

    def error_rate(self) -> float:
        n = self.requests()
        return self.failures() / n if n else math.nan

    def served(self) -> list[dict[str, str]]:
        """Request rows (the TTFT entries are measurements, not requests)."""
        return [r for r in self.rows if r["Type"] not in ("", "TTFT")]

    @staticmethod
    def p99s_ms(rows: list[dict[str, str]]) -> dict[str, float]:
        """Each entry's p99 by name, where it served any and Locust wrote a number."""
        out = {}
        for r in rows:
            with contextlib.suppress(ValueError):
                if int(r["Request Count"]) > 0 and math.isfinite(v := float(r["99%"])):
                    out[r["Name"]] = v
        return out

    def latency_p99_ms(self) -> float:
        """The largest p99 of the entries (Locust keeps per-entry percentiles, not merged ones)."""
        return max(self.p99s_ms(self.served()).values(), default=math.nan)

    def ttft_p99_ms(self) -> float:
        """The worst TTFT p99 of the prompt classes (short, long)."""
        return max(self.ttft_p99_by_class_ms().values(), default=math.nan)

    def ttft_p99_by_class_ms(self) -> dict[str, float]:
        """TTFT p99 of each prompt class, as Locust keeps it (one entry per class)."""
        return self.p99s_ms([r for r in self.rows if r["Type"] == "TTFT"])


def read_stats(csv_prefix: Path) -> Stats:
    path = Path(f"{csv_prefix}_stats.csv")
    if not path.exists():
        raise ConfigError(f"Locust wrote no stats at {path}")
    with path.open(newline="") as fh:
        return Stats(list(csv.DictReader(fh)))


@dataclass
class LocustRun:
    """One headless Locust process; ``stop()`` ends it early and lets it write its stats."""

    host: str
    csv_prefix: Path
    users: int = 8
    spawn_rate: float = 2.0
    run_time_s: float = 60.0
    max_tokens: int = 16
    log_path: Path | None = None
    mode_file: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # more of the locustfile's settings
    proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "--host", self.host, "-u", str(self.users), "-r", str(self.spawn_rate),
            "-t", f"{max(1, round(self.run_time_s))}s", "--csv", str(self.csv_prefix),
            "--only-summary", "--stop-timeout", "10", "--exit-code-on-error", "0",
        ]  # fmt: skip

    def start(self) -> None:
        if not locust_available():
            raise ConfigError("Locust is not installed: pip install 'kcops[load]'")
        self.csv_prefix.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "KCOPS_LOAD_MAX_TOKENS": str(self.max_tokens)}
        if self.mode_file is not None:
            env["KCOPS_LOAD_MODE_FILE"] = str(self.mode_file)
        log = open(self.log_path or os.devnull, "wb")  # noqa: SIM115 (owned by the child)
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()

    def wait(self, timeout_s: float | None = None) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def stop(self) -> int:
        """SIGTERM: Locust stops its users and writes its stats; SIGKILL after 30 s."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def stats(self) -> Stats:
        return read_stats(self.csv_prefix)


def summary_lines(stats: Stats, alerts: list[AlertEvent], t0: float) -> list[str]:
    """What ``kcops load`` prints: Locust's table by entry, the three numbers, the alerts."""
    lines = [f"{'type':<6} {'name':<16} {'reqs':>6} {'fails':>5} {'p50 ms':>8} {'p99 ms':>8}"]
    for r in stats.rows:
        if r["Name"] == "Aggregated":
            continue
        lines.append(
            f"{r['Type']:<6} {r['Name']:<16} {r['Request Count']:>6} {r['Failure Count']:>5} "
            f"{r['50%']:>8} {r['99%']:>8}"
        )
    by_class = ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(stats.ttft_p99_by_class_ms().items()))
    lines += [
        f"p99 latency   {stats.latency_p99_ms():.0f} ms (worst entry)",
        f"TTFT p99      {stats.ttft_p99_ms():.0f} ms (worst class: {by_class or 'none'})",
        f"error rate    {stats.error_rate():.2%} of {stats.requests()} requests",
    ]
    if alerts:
        lines.append("agent alerts during the run:")
        lines += [f"  +{e.at - t0:5.0f}s  {e.alertname} {e.state}" for e in alerts]
    return lines


def as_json(stats: Stats, alerts: list[AlertEvent], t0: float) -> dict[str, object]:
    def clean(v: float) -> float | None:
        return v if math.isfinite(v) else None

    return {
        "latency_p99_ms": clean(stats.latency_p99_ms()),
        "ttft_p99_ms": clean(stats.ttft_p99_ms()),
        "ttft_p99_ms_by_class": stats.ttft_p99_by_class_ms(),
        "error_rate": clean(stats.error_rate()),
        "requests": stats.requests(),
        "entries": stats.rows,
        "alerts": [{"alertname": e.alertname, "state": e.state, "at": e.at} for e in alerts],
        "started_at": t0,
    }
