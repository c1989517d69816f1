"""The canary: one bounded synthetic completion that tells "stalled" from "slow".

It asks the engine's OpenAI-compatible API for one token (``max_tokens: 1``,
temperature 0) under a deadline, through the agent's HTTP client. It runs
rarely while progress is seen (every ``engine.canary.interval_s``, the first
one an interval after progress was first seen), at once when progress stops
(the stall watch says when: still for ``stall_after_s - deadline_s``), and
never while the engine is idle (:mod:`kcops.agent.engine.progress`); it runs in
the background, never inside a collector's tick. Its result is exported
blackbox-exporter style: ``kcops_engine_canary_success`` (1/0, the last run),
``kcops_engine_canary_duration_seconds`` (the last run) and
``kcops_engine_canary_runs_total{outcome}`` (ok, timeout, http_status,
connect, error).

The engine counts the canary among its own requests: one request with a
prompt of a few tokens and one generated token per run, in its request,
token and latency series; but no tenant's (its ``X-Request-Id`` is a
:func:`kcops.tenant.canary_id`, signed with the marker key the agent shares
with the engine), so ``kcops cost`` never bills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from enum import StrEnum

from pydantic import JsonValue

from kcops.agent.httpclient import HttpClient, HttpConnectError, HttpError, HttpTimeout
from kcops.agent.samples import Sample, label_pairs
from kcops.tenant import canary_id, tenant_key

log = logging.getLogger("kcops.agent.engine.canary")


class CanaryOutcome(StrEnum):
    OK = "ok"
    TIMEOUT = "timeout"
    HTTP_STATUS = "http_status"
    CONNECT = "connect"
    ERROR = "error"


@dataclass(frozen=True)
class CanaryConfig:
    enabled: bool = True
    interval_s: float = 60.0
    deadline_s: float = 3.0
    prompt: str = "Hi"
    model: str | None = None  # None: the first model /v1/models lists
    path: str = "/v1/completions"


@dataclass(frozen=True)
class CanaryResult:
    started_at: float  # agent clock
    duration_s: float
    outcome: CanaryOutcome
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is CanaryOutcome.OK

    def report(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {
            "outcome": self.outcome.value,
            "duration_s": round(self.duration_s, 3),
            "started_at": round(self.started_at, 3),
        }
        if self.error:
            out["error"] = self.error
        return out


class Canary:
    """Sends the canary to ``url`` (the engine's base URL) when due; one run at a time."""

    def __init__(
        self,
        url: str,
        http: HttpClient,
        config: CanaryConfig,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.http = http
        self.config = config
        self.headers = headers or {}
        self.last: CanaryResult | None = None
        self.in_flight_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._model: str | None = config.model
        self._origin: float | None = None  # the periodic clock starts at the first progress
        self._runs: dict[str, int] = {o.value: 0 for o in CanaryOutcome}

    def due(self, now: float, progress_at: float | None, still: bool) -> bool:
        """True when a run should start (none in flight). ``still``: work pending and no
        progress this tick; then at once, unless a run started since the last progress
        (again after the interval). Otherwise (progress seen) every interval, counted from
        the first progress seen; never while idle (the caller does not ask)."""
        if not self.config.enabled or self.in_flight_since is not None:
            return False
        last = self.last.started_at if self.last is not None else None
        if still and progress_at is not None and (last is None or last < progress_at):
            return True
        if self._origin is None:
            self._origin = now
        return now - (last if last is not None else self._origin) >= self.config.interval_s

    def launch(self, now: float) -> None:
        self.in_flight_since = now
        self._task = asyncio.create_task(self._run(now), name="kcops-canary")

    def failed_since(self, t: float) -> bool:
        """True when a run started at or after ``t`` has finished and failed."""
        return self.last is not None and self.last.started_at >= t and not self.last.ok

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, started_at: float) -> None:
        t0 = time.monotonic()
        try:
            outcome, error = await self._ask()
        finally:
            self.in_flight_since = None
        result = CanaryResult(started_at, time.monotonic() - t0, outcome, error)
        self.last = result
        self._runs[outcome.value] += 1
        if not result.ok:
            log.warning("canary %s after %.2fs: %s", outcome.value, result.duration_s, error)

    async def _ask(self) -> tuple[CanaryOutcome, str]:
        cfg = self.config
        deadline = time.monotonic() + cfg.deadline_s
        body: dict[str, object] = {
            "prompt": cfg.prompt,
            "max_tokens": 1,
            "temperature": 0,
            "stream": False,
        }
        try:
            model = self._model or await self._first_model(cfg.deadline_s)
            if model is not None:
                body["model"] = model
            left = max(0.05, deadline - time.monotonic())
            headers = {**self.headers, "X-Request-Id": canary_id(tenant_key())}
            resp = await self.http.request(
                "POST", self.url + cfg.path, json=body, headers=headers, timeout_s=left
            )
        except HttpTimeout:
            return CanaryOutcome.TIMEOUT, f"no answer within {cfg.deadline_s:g}s"
        except HttpConnectError as exc:
            return CanaryOutcome.CONNECT, str(exc)[:200]
        except HttpError as exc:
            return CanaryOutcome.ERROR, str(exc)[:200]
        if resp.status_code >= 300:
            return CanaryOutcome.HTTP_STATUS, f"HTTP {resp.status_code}: {resp.text[:200]}"
        return CanaryOutcome.OK, ""

    async def _first_model(self, timeout_s: float) -> str | None:
        """The first model id of ``GET /v1/models`` (asked until one is known); None if none."""
        resp = await self.http.get(
            self.url + "/v1/models", headers=self.headers, timeout_s=timeout_s
        )
        if resp.status_code != 200:
            return None
        try:
            data = resp.json().get("data") or []
            self._model = str(data[0]["id"]) if data else None
        except (ValueError, AttributeError, KeyError, TypeError, IndexError):
            return None
        return self._model

    def samples(self) -> list[Sample]:
        out = [
            Sample("kcops_engine_canary_runs_total", label_pairs({"outcome": k}), float(v))
            for k, v in self._runs.items()
        ]
        if self.last is not None:
            out.append(Sample("kcops_engine_canary_success", (), 1.0 if self.last.ok else 0.0))
            out.append(Sample("kcops_engine_canary_duration_seconds", (), self.last.duration_s))
        return out
