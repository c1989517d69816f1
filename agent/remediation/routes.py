"""Control API routes of remediation: actions, history, ladders, Alertmanager webhook.

Reads are open; running an action and the webhook need the bearer token
(or Basic auth with the token as password, as Alertmanager sends it).
Bodies are pydantic models checked strictly (``"force": "false"`` is a 422);
every bad input is a JSON 4xx. The routes talk to remediation through
:class:`RemediationAPI` alone; an answer that acknowledges something is given
only once its audit records are on disk (else 503, the record held).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from kcops.agent.jsonapi import json_dumps, read_json, read_json_model
from kcops.agent.outcome import ActionName, Outcome
from kcops.agent.remediation.records import JSONObject
from kcops.auth import TokenCheck

STATUS_OF = {
    Outcome.OK: 200,
    Outcome.DRY_RUN: 200,
    Outcome.INVALID: 422,
    Outcome.REFUSED: 409,
    Outcome.FAILED: 500,
    Outcome.TIMEOUT: 504,
}


class RunActionBody(BaseModel):
    """``POST /api/v1/actions/{name}``."""

    model_config = ConfigDict(extra="forbid")

    params: dict[str, JsonValue] | None = None
    force: bool = False
    reason: str | None = Field(None, max_length=1000)
    dry_run: bool = False


@dataclass(frozen=True)
class Answer:
    """What remediation answers one request with: a status and a JSON body."""

    status: int
    body: JSONObject


class RemediationAPI(Protocol):
    """What the routes ask of remediation (:class:`~.remediation.Remediation`)."""

    webhook: bool  # the Alertmanager webhook is served (actions.alertmanager_webhook)

    def describe(self) -> dict[str, object]:
        """Mode, the actions and their parameter schemas, the guards."""
        ...

    def knows(self, action: str) -> bool: ...

    def action_names(self) -> list[str]: ...

    async def run_asked(
        self, action: ActionName, body: RunActionBody, remote: str | None
    ) -> Answer:
        """Run one action as asked over the API; answered once its records are durable."""
        ...

    async def history(self, since: float | None, limit: int) -> list[JSONObject]:
        """The last ``limit`` audit records since ``since`` (read off the event loop)."""
        ...

    def status(self) -> JSONObject: ...

    def readiness(self) -> tuple[bool, JSONObject]:
        """Whether the engine takes work (ready, not draining), and why."""
        ...

    async def alertmanager(self, payload: object) -> Answer:
        """One webhook delivery: its alerts taken; answered once the decisions are durable."""
        ...


def build_routes(rem: RemediationAPI, auth: TokenCheck) -> list[web.RouteDef]:
    async def list_actions(_: web.Request) -> web.Response:
        return web.json_response(rem.describe())

    async def run_action(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await read_json_model(request, RunActionBody)
        if not rem.knows(name):
            return web.json_response(
                {"error": f"unknown action {name!r}", "allowed": rem.action_names()}, status=404
            )
        answer = await rem.run_asked(ActionName(name), body, request.remote)
        return web.json_response(answer.body, status=answer.status, dumps=json_dumps)

    async def history(request: web.Request) -> web.Response:
        since = request.query.get("since")
        try:
            since_f = float(since) if since else None
        except ValueError:
            since_f = float("nan")
        if since_f is not None and not 0 <= since_f < 1e11:
            return web.json_response({"error": "since must be Unix seconds"}, status=400)
        raw_limit = request.query.get("limit", "1000")
        limit = int(raw_limit) if raw_limit.isdecimal() and len(raw_limit) <= 7 else 0
        if not 1 <= limit <= 100_000:
            return web.json_response({"error": "limit must be an integer in 1..100000"}, status=400)
        recs = await rem.history(since_f, limit)
        return web.json_response({"records": recs}, dumps=json_dumps)

    async def remediation_status(_: web.Request) -> web.Response:
        return web.json_response(rem.status(), dumps=json_dumps)

    async def engine_ready(_: web.Request) -> web.Response:
        """For a load balancer or a readinessProbe: 200 only while the engine takes work
        (ready by its health checks, no restart draining it), else 503 saying why."""
        serving, body = rem.readiness()
        return web.json_response(body, status=200 if serving else 503)

    routes = [
        web.get("/api/v1/actions", list_actions),
        web.get("/api/v1/actions/history", history),
        web.get("/api/v1/remediation", remediation_status),
        web.get("/api/v1/engine/ready", engine_ready),
        web.post("/api/v1/actions/{name}", auth.require(run_action)),
    ]
    if rem.webhook:
        routes.append(web.post("/api/v1/alertmanager", auth.require(webhook(rem))))
    return routes


def webhook(rem: RemediationAPI) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``POST /api/v1/alertmanager``: Alertmanager's notifications as alert transitions."""

    async def alertmanager(request: web.Request) -> web.Response:
        answer = await rem.alertmanager(await read_json(request))
        return web.json_response(answer.body, status=answer.status, dumps=json_dumps)

    return alertmanager
