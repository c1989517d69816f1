"""``notify``: post a message to the configured webhook. Pages go the same way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, JsonValue

from kcops.agent.actions.base import (
    ActionContext,
    ActionResult,
    ActionSpec,
    Check,
    JSONObject,
    Params,
)
from kcops.agent.config.actions import NotifySection
from kcops.agent.httpclient import HttpClient
from kcops.agent.outcome import ActionName, ActionRejected, Refusal


class NotifyParams(Params):
    message: str = Field("kcops remediation notice", max_length=4000)
    severity: Literal["info", "ticket", "warning", "page"] = "info"


async def send(cfg: NotifySection, payload: Mapping[str, JsonValue]) -> int:
    """POST ``payload`` as JSON; returns the HTTP status. Raises on transport errors
    (:class:`~kcops.agent.httpclient.HttpError`) and on an HTTP error status."""
    if not cfg.url:
        raise ActionRejected("actions.notify.url is not configured", Refusal.NOT_CONFIGURED)
    client = HttpClient(cfg.timeout_s, trust_env=True)
    try:
        resp = await client.request("POST", cfg.url, json=payload, headers=cfg.headers)
    finally:
        await client.aclose()
    if resp.status_code >= 400:
        raise RuntimeError(f"notify webhook answered HTTP {resp.status_code}: {resp.text[:200]}")
    return resp.status_code


def has_url(check: Check, _: Params) -> None:
    if not check.config.actions.notify.url:
        raise ActionRejected("actions.notify.url is not configured", Refusal.NOT_CONFIGURED)


async def notify(ctx: ActionContext, p: NotifyParams) -> ActionResult:
    payload: JSONObject = {
        "source": "kcops",
        "severity": p.severity,
        "message": p.message,
        "target": ctx.target,
        "t": ctx.now,
    }
    incident = ctx.engine.incidents.current() if ctx.engine.incidents else None
    if incident:
        payload.update(incident=incident, incident_command=f"kcops incident show {incident}")
    status = await send(ctx.config.actions.notify, payload)
    return ActionResult(detail=f"webhook answered {status}", data={"payload": payload})


SPEC = ActionSpec(
    ActionName.NOTIFY,
    notify,
    NotifyParams,
    "Post a message to the notify webhook.",
    precheck=has_url,
    target="notify",
)
