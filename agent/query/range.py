"""``GET|POST /api/v1/query_range``: a PromQL expression over a time range, Prometheus's shape.

The same evaluator as ``/api/v1/query``, stepped over ``start..end`` inside
the agent, so a report of 240 points is one request per line instead of 240.
Open read; at most ``MAX_POINTS`` steps and ``MAX_QUERY_CHARS`` characters,
and all steps together under one evaluation budget (budget.py): a range query
costs what its steps cost, so it fails (422) where a query of the same work
would.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from aiohttp import web
from multidict import MultiMapping

from kcops.agent.promql.budget import ITEM_UNITS
from kcops.agent.promql.evaluator import Evaluator
from kcops.agent.promql.gofmt import go_float
from kcops.agent.promql.model import RuleError
from kcops.agent.promql.parse import parse_expr
from kcops.agent.promql.regex import query_bounds
from kcops.agent.query.form import (
    MAX_QUERY_CHARS,
    FormError,
    error_response,
    failure_response,
    query_params,
)
from kcops.agent.query.gate import QueryGate

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext

MAX_POINTS = 11_000  # Prometheus's own limit on points per series


class RangeError(ValueError):
    pass


def _float_param(params: MultiMapping[str], name: str) -> float:
    raw = params.get(name)
    if raw is None:
        raise RangeError(f"missing parameter {name!r}")
    try:
        v = float(raw)
    except ValueError:
        raise RangeError(f"parameter {name!r} must be a number, got {raw[:40]!r}") from None
    if not math.isfinite(v):
        raise RangeError(f"parameter {name!r} must be finite, got {raw[:40]!r}")
    return v


def evaluate_range(
    ctx: AgentContext,
    text: str,
    start: float,
    end: float,
    step: float,
    deadline: float | None = None,
) -> dict[str, object]:
    """Prometheus ``data`` of resultType matrix; raises RuleError, EvalError or RangeError."""
    if len(text) > MAX_QUERY_CHARS:
        raise RuleError(f"query is {len(text)} characters; at most {MAX_QUERY_CHARS}")
    if step <= 0:
        raise RangeError(f"step must be > 0 seconds, got {step}")
    if end < start:
        raise RangeError(f"end ({end}) is before start ({start})")
    n = int((end - start) / step) + 1
    if n > MAX_POINTS:
        raise RangeError(f"{n} points; at most {MAX_POINTS}: raise step or shorten the range")
    node = parse_expr(text)
    series: dict[tuple[tuple[str, str], ...], list[list[float | str]]] = {}
    ev = Evaluator(ctx.store)
    budget = ev.begin(deadline)  # one budget for all steps
    budget.require(n * (ITEM_UNITS + ev.min_work(node)), f"a range query of {n} steps")
    budget.charge(n * ITEM_UNITS)
    for i in range(n):
        t = start + i * step
        value = ev.eval(node, t)
        if isinstance(value, str):
            raise RangeError("a string expression has no range")
        rows = [((), value)] if isinstance(value, float) else [(e.labels, e.value) for e in value]
        budget.charge(len(rows) * ITEM_UNITS)
        for labels, v in rows:
            series.setdefault(tuple(labels), []).append([t, go_float(v)])
    return {
        "resultType": "matrix",
        "result": [{"metric": dict(k), "values": vals} for k, vals in sorted(series.items())],
    }


def range_routes(ctx: AgentContext, gate: QueryGate) -> list[web.RouteDef]:
    """The routes (GET and POST), served by the query component beside ``/api/v1/query``;
    ``gate``: the query API's bounds, shared with it (gate.py)."""

    async def handler(request: web.Request) -> web.Response:
        try:
            with gate.slot():
                params = await query_params(request)
                text = params.get("query", "").strip()
                if not text:
                    raise RangeError("missing parameter 'query'")
                start = _float_param(params, "start")
                end = _float_param(params, "end")
                step = _float_param(params, "step")
                with gate.evaluation() as deadline, query_bounds(deadline):
                    data = evaluate_range(ctx, text, start, end, step, deadline)
        except (RangeError, FormError) as exc:
            return error_response("bad_data", str(exc))
        except Exception as exc:  # never a bare 500: Prometheus's error shape
            return failure_response(exc)
        return web.json_response({"status": "success", "data": data})

    return [web.get("/api/v1/query_range", handler), web.post("/api/v1/query_range", handler)]
