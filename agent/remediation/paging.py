"""Paging: tell a human. A page is audited, logged and sent to the notify webhook;
a ticket (the end of a ladder of an alert that is not a page) is a record only.

Pages count in ``kcops_action_runs_total{action="page",outcome=sent|failed|logged}``
(:attr:`Pager.sent`), published beside the runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

from kcops.agent.actions.notify import send as send_notify
from kcops.agent.clock import Clock
from kcops.agent.config.actions import NotifySection
from kcops.agent.outcome import PAGE, ActionName
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.records import EscalationRecord, PageRecord

Paged = Literal["sent", "failed", "logged"]
log = logging.getLogger("kcops.agent.actions")


class Pager:
    def __init__(
        self,
        notify: NotifySection,
        audit: AuditLog,
        clock: Clock,
    ) -> None:
        self.notify = notify
        self.audit = audit
        self.clock = clock
        self.sent: dict[Paged, int] = {}  # pages by how they went out
        self.pages = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.incident: Callable[[], str | None] = lambda: None  # the open incident's id

    def page(
        self,
        message: str,
        *,
        alertname: str | None = None,
        scope: str | None = None,
        action: ActionName | None = None,
        last_exit: int | None = None,
    ) -> None:
        """Audit, log, and post to the notify webhook when one is configured (off the tick).

        What the page is about (an alert, a breaker's scope and action, an engine's last
        exit code) goes into the record and the webhook's payload when given.
        """
        now = self.clock()
        self.pages += 1
        incident = self.incident()
        named: dict[str, str | int | None] = dict(
            alertname=alertname, scope=scope, action=action, last_exit=last_exit, incident=incident
        )
        context = {k: v for k, v in named.items() if v is not None}
        # The same page again (a crash loop that pages each crash) is counted, and summed
        # up in a ``kind: repeated`` record; the webhook still gets every one.
        self.audit.append(
            PageRecord(ts=now, message=message, **context),
            stream=(PAGE, alertname or "", scope or "", action or ""),
            key=(message,),
            of={"kind": "page", "message": message[:200], **context},
        )
        log.error("PAGE: %s", message)
        cfg = self.notify
        if not cfg.url:
            self._count("logged")
            return

        async def _send() -> None:
            payload: dict[str, str | int | float] = {
                "source": "kcops",
                "severity": "page",
                "message": message,
                "t": now,
                **context,
            }
            if incident:
                payload["incident_command"] = f"kcops incident show {incident}"
            try:
                await send_notify(cfg, payload)
                self._count("sent")
            except Exception as exc:
                self._count("failed")
                log.error("page webhook failed: %s", exc)

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a page from a thread): logged and audited only
            self._count("failed")
            return
        task = loop.create_task(_send())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _count(self, how: Paged) -> None:
        self.sent[how] = self.sent.get(how, 0) + 1

    def ticket(self, message: str, severity: str, alertname: str, now: float) -> None:
        """An alert that is not a page ends its ladder with a record, never a page."""
        self.audit.append(
            EscalationRecord(ts=now, severity=severity, message=message, alertname=alertname)
        )
        log.warning("%s (%s)", message, severity)

    async def stop(self) -> None:
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)
