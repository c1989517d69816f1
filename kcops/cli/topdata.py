"""What ``kcops top`` shows, read from a running agent's HTTP API.

Everything comes from the agent's own routes: PromQL through ``/api/v1/query``
(the rule engine's evaluator), alert states from ``/api/v1/alerts``, the audit
log's tail from ``/api/v1/actions/history`` and health from ``/api/v1/status``.
A value the agent does not have stays ``None`` (shown as ``-``), never 0.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from kcops.cli.common import Doc, one_line, retry_unavailable
from kcops.errors import ConfigError, KcopsError, Unreachable

# One PromQL expression per number on the screen: (key, expression).
HQ = "histogram_quantile({q}, sum by (le) (rate({m}_bucket[1m])))"
GAUGES: tuple[tuple[str, str], ...] = (
    ("ttft_p50", HQ.format(q=0.5, m="kcops_ttft_seconds")),
    ("ttft_p99", HQ.format(q=0.99, m="kcops_ttft_seconds")),
    ("itl_p50", HQ.format(q=0.5, m="kcops_inter_token_latency_seconds")),
    ("itl_p99", HQ.format(q=0.99, m="kcops_inter_token_latency_seconds")),
    ("latency_p99", HQ.format(q=0.99, m="kcops_request_latency_seconds")),
    ("rps", "sum(rate(kcops_request_latency_seconds_count[1m]))"),
    # Decoded tokens/s: one inter-token interval per token after each request's first.
    (
        "tokens_s",
        "sum(rate(kcops_inter_token_latency_seconds_count[1m]))"
        " + sum(rate(kcops_ttft_seconds_count[1m]))",
    ),
    ("running", "sum(kcops_requests_running)"),
    ("waiting", "sum(kcops_requests_waiting)"),
    ("kv_usage", "max(kcops_kv_cache_usage_ratio)"),
    (
        "prefix_hit",
        "sum(rate(kcops_prefix_cache_hits_total[5m]))"
        " / sum(rate(kcops_prefix_cache_queries_total[5m]))",
    ),
    ("mem_used", "max(kcops_device_memory_used_bytes)"),
    ("mem_total", "max(kcops_device_memory_total_bytes)"),
    ("engine_up", "max(kcops_engine_up)"),
    ("route_fallback", "max(kcops_route_fallback)"),
    ("topn", "max(kcops_attention_topn)"),
    ("shadow", "min(kcops_shadow_agreement_ratio)"),
    ("kc_p50", HQ.format(q=0.5, m="kcops_kc_tokens")),
    ("kappa_p50", HQ.format(q=0.5, m="kcops_kc_ratio")),
    ("attn_errors", "sum(increase(kcops_attention_errors_total[5m]))"),
)
# The engine's lifecycle state: the one series of the one-hot kcops_engine_state at 1.
ENGINE_STATE = "max by (state) (kcops_engine_state) == 1"
# Per-layer views: K(C) by layer (kcops_kc_tokens with its layer label) and attention
# calls by layer, which every probe labels.
# Not layers: no label or layer="unknown" (an older probe's all-layers histogram)
# and layer="other" (the layers past the agent's cap, summed).
NOT_LAYERS = ("unknown", "other")
KC_BY_LAYER = "histogram_quantile(0.5, sum by (le, layer) (rate(kcops_kc_tokens_bucket[5m])))"
CALLS_BY_LAYER = "sum by (layer) (rate(kcops_attention_calls_total[1m]))"
# Sparklines: these few, sampled back in time at the start, then one point per refresh.
HISTORY_KEYS = ("latency_p99", "ttft_p99", "kv_usage", "mem_used", "kc_p50", "rps")
HISTORY_POINTS = 20
MAX_LAYERS_SHOWN = 64


@dataclass
class Snapshot:
    """One frame's data. ``values`` maps GAUGES keys to a number or None."""

    agent_url: str
    taken_at: float
    status: Doc
    values: dict[str, float | None]
    engine_state: str | None  # starting, ready, stalled, hung, down; None when the agent has none
    kc_by_layer: list[tuple[str, float]]
    calls_by_layer: list[tuple[str, float]]
    alerts: list[Doc]
    rules: list[Doc]
    actions: list[Doc]
    history: dict[str, list[float | None]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


CHUNK_STEPS = 120  # steps of one range query request (the agent bounds each request's work)
# A one-step range query the evaluation budget refused is asked once more after this
# pause (it may have found the loop share part spent). A query turned away unevaluated
# (503 ``unavailable``) is asked again by every GET (kcops.cli.common.retry_unavailable).
BUSY_WAIT_S = 1.0


class QueryRefused(KcopsError):
    """The agent's evaluation budget refused a query (Prometheus's 422 ``execution`` or
    503 ``timeout``): the same question in smaller pieces may pass."""


class QueryBusy(QueryRefused):
    """The agent turned a query away unevaluated (503 ``unavailable``: too many queries at
    once, or the query API's share of the loop spent): the same question, later, may pass."""


def _error_type(resp: httpx.Response) -> str | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    return body.get("errorType") if isinstance(body, dict) else None


# An answer past this is refused as it arrives (a query API's answer is a few MiB at most).
MAX_ANSWER_BYTES = 64 << 20
Rows = list[tuple[dict[str, str], list[tuple[float, float]]]]


class AgentClient:
    """A small synchronous client of the agent's read API (and the action route), or of
    any Prometheus-compatible query API.

    Each GET is read whole within ``timeout_s`` of wall-clock time (httpx's timeout bounds
    each read only: a server that trickles a byte every few seconds would hold it forever)
    and, with ``deadline_s``, within that much time since the client was made (a command's
    total); past either it raises :class:`Unreachable`."""

    def __init__(
        self, agent_url: str, timeout_s: float = 5.0, deadline_s: float | None = None
    ) -> None:
        self.url = agent_url.rstrip("/")
        self.timeout_s = timeout_s
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self.http = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        """The answer's JSON (None on 404); a refusal for the moment is waited out first.
        An answer that is no JSON, or over :data:`MAX_ANSWER_BYTES`, is a KcopsError."""
        resp = retry_unavailable(lambda: self._fetch(path, params))
        if resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            msg = f"GET {path}: HTTP {resp.status_code}: {one_line(resp.text[:200])}"
            kind = _error_type(resp)
            if resp.status_code == 503 and kind == "unavailable":
                raise QueryBusy(msg)
            if resp.status_code in (422, 503) and kind in ("execution", "timeout"):
                raise QueryRefused(msg)
            raise KcopsError(msg)
        try:
            return resp.json()
        except ValueError:
            raise KcopsError(
                f"GET {path}: {self.url} answered no JSON: {one_line(resp.text[:80])!r}"
            ) from None

    def _fetch(self, path: str, params: dict[str, str] | None) -> httpx.Response:
        # Read on a daemon thread and wait for it: the wait is the one bound on the time
        # to connect, to get the headers and to get the body, however slowly they come.
        wait_s = self.timeout_s
        if self.deadline is not None:
            wait_s = min(wait_s, self.deadline - time.monotonic())
        box: list[httpx.Response | BaseException] = []
        reader = threading.Thread(target=self._read, args=(path, params, box), daemon=True)
        reader.start()
        reader.join(max(0.0, wait_s))
        if not box:
            raise Unreachable(f"GET {path}: no whole answer from {self.url} in time")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _read(
        self, path: str, params: dict[str, str] | None, box: list[httpx.Response | BaseException]
    ) -> None:
        try:
            with self.http.stream("GET", self.url + path, params=params) as resp:
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        raise KcopsError(
                            f"GET {path}: the answer from {self.url} is over "
                            f"{MAX_ANSWER_BYTES >> 20} MiB"
                        )
            # Decoded already: the headers without the encoding, for .json() to read.
            headers = [(k, v) for k, v in resp.headers.multi_items() if k != "content-encoding"]
            box.append(httpx.Response(resp.status_code, headers=headers, content=bytes(body)))
        except httpx.InvalidURL as exc:
            box.append(ConfigError(f"{self.url!r}: not a valid URL: {exc}"))
        except httpx.HTTPError as exc:
            box.append(Unreachable(f"cannot reach the agent at {self.url}: {exc}"))
        except BaseException as exc:  # handed to the caller's thread, raised there
            box.append(exc)

    def _rows(self, path: str, params: dict[str, str], kinds: tuple[str, ...]) -> Rows:
        """A query answer's series as (labels, [(t, value)]), NaN and Inf dropped; [] on
        404. An answer of another shape (not a ``success`` of one of ``kinds``, a value
        that is not a number) is a KcopsError: never read as "no data"."""
        body = self.get(path, params)
        if body is None:
            return []
        try:
            if body["status"] != "success":
                raise ValueError(f"status {body['status']!r}")
            kind, result = body["data"]["resultType"], body["data"]["result"]
            if kind not in kinds:
                raise ValueError(f"resultType {kind!r}")
            if kind == "scalar":
                result = [{"metric": {}, "value": result}]
            out: Rows = []
            for r in result:
                pts = [
                    (float(t), float(v))
                    for t, v in (r["values"] if kind == "matrix" else [r["value"]])
                ]
                labels = {str(k): str(v) for k, v in r["metric"].items()}
                out.append((labels, [(t, v) for t, v in pts if math.isfinite(v)]))
            return out
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise KcopsError(
                f"GET {path}: {self.url} answered no query result "
                f"({type(exc).__name__}: {one_line(exc)[:80]})"
            ) from None

    def vector(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query's samples, NaN and Inf dropped; [] when the agent has none."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        rows = self._rows("/api/v1/query", params, ("vector", "scalar"))
        return [(labels, pts[0][1]) for labels, pts in rows if pts]

    def matrix(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[tuple[dict[str, str], dict[float, float]]]:
        """A range query's series as (labels, {t: value}); NaN and Inf dropped.

        Asked in pieces of at most ``CHUNK_STEPS`` steps, and a piece the agent's
        evaluation budget refuses (its 422 or 503) is asked again in halves: the budget
        bounds one request, so a long report never needs one expensive request. A query
        turned away unevaluated (503 ``unavailable``) has been asked again by :meth:`get`.
        """
        total = max(1, round((end - start) / step_s) + 1)
        merged: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], dict[float, float]]] = {}
        done, chunk, single_retried = 0, CHUNK_STEPS, False
        while done < total:
            n = min(chunk, total - done)
            first = start + done * step_s
            try:
                rows = self._matrix(expr, first, first + (n - 1) * step_s, step_s)
            except QueryBusy:
                raise  # get() has waited for the loop share already
            except QueryRefused:
                if n > 1:
                    chunk = max(1, n // 2)
                    continue
                # one step: it may have found the loop share part spent; once more, refilled
                if single_retried:
                    raise
                single_retried = True
                time.sleep(BUSY_WAIT_S)
                continue
            single_retried = False
            for labels, pts in rows:
                merged.setdefault(tuple(sorted(labels.items())), (labels, {}))[1].update(pts)
            done += n
        return list(merged.values())

    def _matrix(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[tuple[dict[str, str], dict[float, float]]]:
        params = {
            "query": expr,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step_s:.3f}",
        }
        rows = self._rows("/api/v1/query_range", params, ("matrix",))
        return [(labels, {round(t, 3): v for t, v in pts}) for labels, pts in rows]

    def scalar(self, expr: str, at: float | None = None) -> float | None:
        rows = self.vector(expr, at)
        return rows[0][1] if rows else None

    def run_action(self, name: str, headers: dict[str, str], reason: str) -> Doc:
        """POST an action through the agent's guards; the audit record (or error) back."""
        try:
            resp = self.http.post(
                f"{self.url}/api/v1/actions/{name}",
                json={"params": {}, "reason": reason},
                headers=headers,
                timeout=180.0,
            )
        except httpx.HTTPError as exc:
            raise Unreachable(f"cannot reach the agent at {self.url}: {exc}") from None
        try:
            data = resp.json()
        except ValueError:
            data = {"error": resp.text[:200]}
        if not isinstance(data, dict):
            data = {"error": str(data)[:200]}
        data.setdefault("http_status", resp.status_code)
        return data


def by_label(
    rows: list[tuple[dict[str, str], float]], label: str, skip: tuple[str, ...] = ()
) -> list[tuple[str, float]]:
    """(label value, value) of the rows that carry ``label`` (not in ``skip``), in layer order."""
    out = [(m[label], v) for m, v in rows if m.get(label) and m[label] not in skip]
    out.sort(key=lambda kv: _layer_order(kv[0]))
    return out[:MAX_LAYERS_SHOWN]


def _layer_order(name: str) -> tuple[int, str]:
    # "model.layers.10.self_attn" after "model.layers.9.self_attn": numeric parts as numbers.
    digits = "".join(ch if ch.isdigit() else " " for ch in name).split()
    return (int(digits[-1]) if digits else 1 << 30, name)


def history(
    client: AgentClient, now: float, span_s: float = 300.0
) -> dict[str, list[float | None]]:
    """The HISTORY_KEYS sampled at HISTORY_POINTS instants over the last ``span_s``."""
    exprs = dict(GAUGES)
    step = span_s / (HISTORY_POINTS - 1)
    times = [now - span_s + i * step for i in range(HISTORY_POINTS)]
    return {k: [client.scalar(exprs[k], t) for t in times] for k in HISTORY_KEYS}


def as_json(s: Snapshot) -> dict[str, object]:
    """One frame's data for scripts (``kcops top --once --json``): raw numbers, Unix times."""
    active = [a for a in s.alerts if a.get("state") in ("pending", "firing")]
    names = {a["alertname"] for a in active}
    return {
        "agent": s.agent_url,
        "taken_at": s.taken_at,
        "engine_state": s.engine_state,
        "values": s.values,
        "kc_by_layer": dict(s.kc_by_layer),
        "attention_calls_by_layer": dict(s.calls_by_layer),
        "alerts": active,
        "inactive_alerts": sorted(
            r["name"] for r in s.rules if r.get("type") == "alerting" and r["name"] not in names
        ),
        "actions": s.actions,
        "history": s.history,
        "errors": s.errors,
    }


def snapshot(client: AgentClient, with_history: bool = False, actions_shown: int = 8) -> Snapshot:
    """Read everything for one frame. Unreachable propagates; a missing route is empty."""
    now = time.time()
    status = client.get("/api/v1/status") or {}
    values = {key: client.scalar(expr) for key, expr in GAUGES}
    alerts = (client.get("/api/v1/alerts") or {}).get("alerts", [])
    rules = (client.get("/api/v1/rules") or {}).get("rules", [])
    hist = client.get("/api/v1/actions/history", {"limit": str(actions_shown)}) or {}
    states = [m["state"] for m, _ in client.vector(ENGINE_STATE) if m.get("state")]
    snap = Snapshot(
        agent_url=client.url,
        taken_at=now,
        status=status,
        values=values,
        engine_state=states[0] if len(states) == 1 else None,
        kc_by_layer=by_label(client.vector(KC_BY_LAYER), "layer", NOT_LAYERS),
        calls_by_layer=by_label(client.vector(CALLS_BY_LAYER), "layer"),
        alerts=alerts,
        rules=rules,
        actions=list(hist.get("records", []))[-actions_shown:],
    )
    if with_history:
        snap.history = history(client, now)
    return snap
