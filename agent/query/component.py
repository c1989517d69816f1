"""``GET|POST /api/v1/query``: evaluate a PromQL expression over the agent's store.

The same evaluator as the rules, answering in Prometheus's HTTP API shape so
tools that speak to Prometheus (and ``kcops runbook``) can ask the agent
directly, without Prometheus. Open read; at most ``MAX_QUERY_CHARS`` long.

Errors map as Prometheus maps them: a parse error is ``bad_data`` (400), an
evaluation error or a query over the work budget (budget.py) ``execution`` (422),
one past its deadline ``timeout`` (503), and one past the query API's share of
the loop (gate.py) ``unavailable`` (503). Sample values are strings as Go
formats a float64 (``"NaN"``, ``"+Inf"``), so the body never holds a bare NaN; a
vector keeps the evaluator's order, as Prometheus's instant queries do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from kcops.agent.promql.evaluator import Evaluator
from kcops.agent.promql.gofmt import go_float
from kcops.agent.promql.model import RuleError, Value
from kcops.agent.promql.parse import parse_expr
from kcops.agent.promql.regex import query_bounds
from kcops.agent.query.form import (
    MAX_QUERY_CHARS,
    FormError,
    error_response,
    failure_response,
    parse_time,
    query_params,
)
from kcops.agent.query.gate import QueryGate, QueryUnavailable
from kcops.agent.query.range import range_routes
from kcops.agent.samples import SeriesKey

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext


def _fmt(v: float) -> str:
    # Sample values travel as strings, formatted as Go formats a float64.
    return go_float(v)


def to_api(value: Value, t: float) -> dict[str, object]:
    """Prometheus API ``data`` for one instant result."""
    if isinstance(value, float):
        return {"resultType": "scalar", "result": [t, _fmt(value)]}
    if isinstance(value, str):
        return {"resultType": "string", "result": [t, value]}
    return {
        "resultType": "vector",
        "result": [{"metric": dict(e.labels), "value": [t, _fmt(e.value)]} for e in value],
    }


class QueryComponent:
    """Serves the query route; does nothing on ticks."""

    name = "query"

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.evaluator = Evaluator(ctx.store)
        self.gate = QueryGate()
        self.served = 0

    async def start(self) -> None:
        return None

    async def tick(self, now: float) -> None:
        """The gate's bound and refusals as series (catalogued in signals.py)."""
        store = self.ctx.store
        store.append(
            SeriesKey.of("kcops_query_max_concurrent", {}), now, float(self.gate.max_concurrent)
        )
        for reason, n in self.gate.refused.items():
            key = SeriesKey.of("kcops_query_refused_total", {"reason": reason})
            store.append(key, now, float(n))

    async def stop(self) -> None:
        return None

    def status(self) -> dict[str, object]:
        refused = sum(self.gate.refused.values())
        return {
            "healthy": True,
            "summary": f"{self.served} queries served, {refused} refused (busy)",
            "refused": dict(self.gate.refused),
        }

    def query(
        self, text: str, t: float | None = None, deadline: float | None = None
    ) -> dict[str, object]:
        """Evaluate ``text`` at ``t`` (default now); raises RuleError / EvalError.
        ``deadline``: the query API's share of the loop (gate.py)."""
        if len(text) > MAX_QUERY_CHARS:
            raise RuleError(f"query is {len(text)} characters; at most {MAX_QUERY_CHARS}")
        node = parse_expr(text)
        at = self.ctx.clock() if t is None else t
        # A fresh evaluator per query: its selector cache is keyed by node identity.
        value = Evaluator(self.ctx.store).run(node, at, deadline)
        self.served += 1
        return to_api(value, at)

    def routes(self) -> list[web.RouteDef]:
        async def handler(request: web.Request) -> web.Response:
            try:
                with self.gate.slot():
                    return await answer(request)
            except QueryUnavailable as exc:
                return failure_response(exc)

        async def answer(request: web.Request) -> web.Response:
            try:
                params = await query_params(request)
            except FormError as exc:
                return error_response("bad_data", str(exc))
            text = params.get("query", "").strip()
            if not text:
                return error_response("bad_data", "missing parameter 'query'")
            t = None
            if "time" in params:
                t = parse_time(params["time"])
                if t is None:
                    return error_response(
                        "bad_data",
                        f"parameter 'time' must be finite Unix seconds, got "
                        f"{params['time'][:40]!r}",
                    )
            try:
                with self.gate.evaluation() as deadline, query_bounds(deadline):
                    data = self.query(text, t, deadline)
            except Exception as exc:
                return failure_response(exc)
            return web.json_response({"status": "success", "data": data})

        return [
            web.get("/api/v1/query", handler),
            web.post("/api/v1/query", handler),
            *range_routes(self.ctx, self.gate),
        ]
