"""The recommender: the live K(C) budget recommendation, on a schedule and on demand.

Every ``recommendation.interval_s`` (and on ``GET /api/v1/kc/recommendation?refresh=1``,
which needs the token: a recomputation reads every K(C) series of the window, so callers
that ask together share one) it reads the window's K(C) buckets from the store, asks the
engine for its current budget (the admin state, where the engine has one; else
``kcops_attention_topn``), and builds the document (:mod:`.compute`, :mod:`.capacity`).
Its gauges are written every tick from the last document, so they stay fresh for the
exporter and the rules; a document that recommends nothing removes them (staleness
markers): unknown is absent.

While there is no recommendation yet (no data, too few samples), it looks every
``READY_CHECK_S`` whether every layer now has its ``min_samples``, and recomputes as soon
as they do: the first figure comes when it can exist, not an interval later.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kcops.agent.kcrec.calibration import coverage_for
from kcops.agent.kcrec.capacity import capacity
from kcops.agent.kcrec.compute import (
    INSUFFICIENT,
    OK,
    P_MISMATCH,
    Coverage,
    Inputs,
    progress,
    recommend,
    refuse,
    resolve_over,
    resolve_p,
    sized_for,
    topn_coverage,
)
from kcops.agent.kcrec.window import (
    int_layers,
    latest_each,
    latest_max,
    latest_sum,
    layer_counts,
    window_buckets,
)
from kcops.agent.samples import SeriesKey
from kcops.errors import KcopsError

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext
    from kcops.agent.engine import Engine
    from kcops.agent.store import Store

log = logging.getLogger("kcops.agent.kcrec")

ROUTE = "/api/v1/kc/recommendation"
ENGINE_TIMEOUT_S = 3.0
RETENTION_MARGIN_S = 300.0  # the window stays this far inside the store's retention
LOOKBACK_S = 300.0  # a gauge older than this (Prometheus's lookback) is not "now"
MISMATCH_BELOW, MISMATCH_ABOVE = "below", "above"
ABOVE_RATIO = 4.0
READY_CHECK_S = 5.0  # while nothing is recommended: how often the samples are counted
REFRESH_MIN_S = 1.0  # a document computed this recently answers ?refresh=1


class Recommender:
    name = "recommendation"

    def __init__(self, ctx: AgentContext, engine: Engine | None) -> None:
        self.ctx = ctx
        self.cfg = ctx.config.recommendation
        self.engine = engine
        self.doc: dict[str, Any] | None = None
        self.due = 0.0
        self.task: asyncio.Task[dict[str, Any]] | None = None
        self.written: set[SeriesKey] = set()
        self.runs = 0
        self.ready_check_at = 0.0
        self.refreshed_at = -math.inf  # loop time of the last computation a caller waited for

    async def start(self) -> None:
        # A calibration that cannot be read refuses the start, with its file and reason.
        for model in self.cfg.calibration:
            coverage_for(self.cfg, model)

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def tick(self, now: float) -> None:
        if not self.cfg.enabled:
            return
        idle = self.task is None or self.task.done()
        if idle and (now >= self.due or self._first_can_exist(now)):
            self.due = now + self.cfg.interval_s
            self.task = asyncio.create_task(self.scheduled(now))
        self.write(now)

    def _first_can_exist(self, now: float) -> bool:
        """No recommendation yet, and every layer has its samples now (looked at every
        ``READY_CHECK_S``, from the store alone: the engine is asked when it is computed)."""
        if (self.doc is not None and self.doc.get("status") == OK) or now < self.ready_check_at:
            return False
        self.ready_check_at = now + READY_CHECK_S
        return self.compute(now, None)["status"] == OK

    # -- computing ---------------------------------------------------------------

    async def engine_state(self) -> tuple[dict[str, Any] | None, str | None]:
        """The engine's admin state, or why there is none."""
        if self.engine is None or self.ctx.config.engine.url is None:
            return None, "no engine url configured"
        try:
            got = await asyncio.wait_for(self.engine.state_doc(), ENGINE_TIMEOUT_S)
        except TimeoutError:
            return None, f"the engine's state did not answer in {ENGINE_TIMEOUT_S:g}s"
        except (KcopsError, OSError) as exc:
            return None, str(exc)[:200]
        return dict(got), None

    async def scheduled(self, now: float) -> dict[str, Any]:
        """A scheduled refresh: a bug is logged (the last document stays), never raised."""
        try:
            return await self.refresh(now)
        except Exception:
            log.exception("the live K(C) recommendation failed")
            return self.doc or {}

    async def refreshed(self) -> None:
        """A recomputation, shared: whoever asks while one runs (the schedule's or another
        caller's) waits for that one, and one that ended under ``REFRESH_MIN_S`` ago is
        fresh enough, so callers cost at most one computation a second however many."""
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done():
            if self.doc is not None and loop.time() - self.refreshed_at < REFRESH_MIN_S:
                return
            self.task = asyncio.create_task(self.scheduled(self.ctx.clock()))
        await asyncio.shield(self.task)
        self.refreshed_at = loop.time()

    async def refresh(self, now: float | None = None) -> dict[str, Any]:
        state, why = await self.engine_state()
        at = self.ctx.clock() if now is None else max(now, self.ctx.clock())
        doc = self.compute(at, state, why)
        self.doc = doc
        self.runs += 1
        self.write(at)
        return doc

    def window_s(self) -> float:
        return max(60.0, min(self.cfg.window_s, self.ctx.store.retention_s - RETENTION_MARGIN_S))

    def compute(
        self, now: float, state: dict[str, Any] | None, state_error: str | None = None
    ) -> dict[str, Any]:
        store, cfg = self.ctx.store, self.cfg
        window = self.window_s()
        start = now - window
        configured = self.configured(now, state, state_error)
        model = cfg.model or configured.get("model") or served_model(store)
        kc = window_buckets(store, "kcops_kc_tokens", "layer", start, now)
        topn = window_buckets(store, "kcops_topn_mass_ratio", "n", start, now)
        dense = configured.get("dense_layers")
        inp = Inputs(kc, topn, frozenset(dense) if dense is not None else None)
        over = resolve_over(cfg.uniform_over, kc, inp.dense_layers)
        measured = latest_each(store, "kcops_probe_kc_mass", now, window)
        p, p_source, p_refused = resolve_p(cfg.p, measured)
        try:  # the calibration matched over the layers this uniform N covers
            cov = coverage_for(cfg, model, over, inp.dense_layers, p)
        except KcopsError as exc:  # a calibration file changed under a running agent
            cov = Coverage(p, cfg.quantile, False, "default", (f"calibration: {exc}",))
        rec = recommend(inp, cov, min_samples=cfg.min_samples, uniform_over=over)
        if p_refused is not None:
            rec = refuse(rec, P_MISMATCH, p_refused)
        uni = rec["uniform"]
        n_rec = uni["tokens"] if rec["status"] == OK and uni else None
        layer_ids = int_layers(kc)
        n_layers = len(layer_ids) or len(kc)
        dense_set = set(dense or ()) & set(layer_ids.values())
        n_now = configured.get("effective_top_n")
        doc: dict[str, Any] = {
            "computed_at": round(now, 3),
            "window_s": window,
            "window_start": round(start, 3),
            "interval_s": cfg.interval_s,
            **sized_for(model, cov, p_source, cfg.min_samples),
            **rec,
            "configured": configured,
            "topn_mass": topn_coverage(topn, cov.p),
            "capacity": capacity(
                context=window_buckets(store, "kcops_context_tokens", None, start, now).get(""),
                layers=n_layers,
                dense_now=len(dense_set) if n_now is not None else 0,
                n_now=n_now,
                long_threshold=float(configured.get("long_threshold") or 0),
                n_rec=n_rec,
                dense_rec=len(dense_set) if rec["uniform_over"] == "non_dense" else 0,
                kv_bytes=latest_sum(store, "kcops_kv_cache_bytes", now, LOOKBACK_S),
                kv_usage=latest_max(store, "kcops_kv_cache_usage_ratio", now, LOOKBACK_S),
                running=latest_sum(store, "kcops_requests_running", now, LOOKBACK_S),
                kv_tokens=kv_cache_tokens(store, now),
            ),
        }
        doc["comparison"] = compare(n_now, n_rec)
        if rec["status"] == INSUFFICIENT:
            doc["progress"] = self.progress(rec["layers"], start, now)
        return doc

    def progress(self, layers: list[dict[str, Any]], start: float, now: float) -> dict[str, Any]:
        """Too few samples: when a first figure comes, and at which sampling rate."""
        store = self.ctx.store
        arrivals = layer_counts(store, "kcops_kc_tokens_count", start, now)
        calls = layer_counts(store, "kcops_attention_calls_total", start, now)
        return progress(layers, arrivals, calls, self.cfg.min_samples, now - start)

    def configured(
        self, now: float, state: dict[str, Any] | None, state_error: str | None
    ) -> dict[str, Any]:
        """The engine's current budget: its admin state, else its exported top-N gauge."""
        out: dict[str, Any] = {
            "source": None,
            "top_n": None,
            "dense_layers": None,
            "route_mode": None,
            "long_threshold": None,
            "model": None,
            "engine_state_error": state_error,
        }
        if state is not None:
            top_n = state.get("top_n")
            dense = state.get("dense_layers")
            out.update(
                source="engine admin state",
                top_n=top_n if isinstance(top_n, int) else None,
                dense_layers=sorted(int(x) for x in dense) if isinstance(dense, list) else None,
                route_mode=state.get("route_mode"),
                long_threshold=state.get("long_threshold"),
                model=state.get("model") if isinstance(state.get("model"), str) else None,
            )
        else:
            got = latest_max(self.ctx.store, "kcops_attention_topn", now, LOOKBACK_S)
            if got is not None and math.isfinite(got):
                out.update(source="kcops_attention_topn", top_n=int(got))
        # fallback mode sends everything to full attention: no budget is in force
        fallback = out["route_mode"] == "fallback"
        out["effective_top_n"] = None if fallback else out["top_n"]
        return out

    # -- gauges ------------------------------------------------------------------

    def write(self, now: float) -> None:
        store = self.ctx.store
        doc = self.doc
        keys: dict[SeriesKey, float] = {}
        if doc is not None and doc.get("status") == OK:
            for row in doc["layers"]:
                if "tokens" in row:
                    key = SeriesKey.of("kcops_kc_recommended_tokens", {"layer": row["layer"]})
                    keys[key] = float(row["tokens"])
            keys[SeriesKey.of("kcops_kc_recommended_n")] = float(doc["uniform"]["tokens"])
            cap = doc["capacity"]
            if cap.get("kv_ratio_at_recommended") is not None:
                keys[SeriesKey.of("kcops_kc_recommended_kv_ratio")] = cap["kv_ratio_at_recommended"]
            if cap.get("more_sequences") is not None:
                key = SeriesKey.of("kcops_kc_recommended_more_sequences")
                keys[key] = float(cap["more_sequences"])
        for key, value in keys.items():
            store.append(key, now, value)
        for key in self.written - keys.keys():
            store.mark_stale(key, now)
        self.written = set(keys)

    # -- API ---------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        doc = self.doc
        if not self.cfg.enabled:
            return {"healthy": True, "summary": "disabled"}
        if doc is None:
            return {"healthy": True, "summary": "not computed yet"}
        n = doc["uniform"]["tokens"] if doc.get("uniform") else None
        return {
            "healthy": True,
            "summary": f"{doc['status']}: N={n} ({doc['calibration']['status']}), "
            f"{self.runs} run(s)",
        }

    def routes(self) -> list[web.RouteDef]:
        @self.ctx.auth.require
        async def refresh(_: web.Request) -> web.Response:
            await self.refreshed()
            return web.json_response(self.doc)

        async def get(request: web.Request) -> web.StreamResponse:
            if not self.cfg.enabled:
                return web.json_response({"status": "disabled"})
            if request.query.get("refresh", "") not in ("", "0", "false"):
                return await refresh(request)
            if self.doc is None:
                await self.refreshed()
            return web.json_response(self.doc)

        return [web.get(ROUTE, get)]


def served_model(store: Store) -> str | None:
    """The one model the engine's request series name (vLLM's probe: its served model
    name), or None when they name none or several."""
    names = {dict(k.labels).get("model") for k in store.keys("kcops_request_context_tokens_count")}
    names.discard(None)
    names.discard("unknown")
    return names.pop() if len(names) == 1 else None


def kv_cache_tokens(store: Store, now: float) -> float | None:
    """The tokens the engine's KV cache holds when full (its blocks times their size), or
    None when the engine does not say (only vLLM does)."""
    blocks = latest_sum(store, "kcops_kv_cache_blocks", now, LOOKBACK_S)
    size = latest_max(store, "kcops_kv_cache_block_tokens", now, LOOKBACK_S)
    return None if blocks is None or size is None else blocks * size


def compare(n_now: int | None, n_rec: int | None) -> dict[str, Any]:
    """The configured N against the recommended one (the rule KcopsBudgetMismatch's test)."""
    if n_now is None or n_rec is None:
        return {"ratio": None, "verdict": None}
    ratio = n_now / n_rec
    verdict = "ok"
    if n_now < n_rec:
        verdict = MISMATCH_BELOW
    elif n_now > ABOVE_RATIO * n_rec:
        verdict = MISMATCH_ABOVE
    return {"ratio": round(ratio, 3), "verdict": verdict}
