"""Paging: tell a human. A page is audited, logged and sent to the notify webhook;
a ticket (the end of a ladder of an alert that is not a page) is a record only.

Pages count in ``kcops_action_runs_total{action="page",outcome=sent|failed|logged}``,
in the runner's counts, so they are published with the runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine

from kcops.agent.actions.audit import AuditLog
from kcops.agent.actions.notify import send as send_notify
from kcops.agent.actions.records import EscalationRecord, PageRecord
from kcops.agent.clock import Clock
from kcops.agent.config.actions import NotifySection

log = logging.getLogger("kcops.agent.actions")


class Pager:
    def __init__(
        self,
        notify: NotifySection,
        audit: AuditLog,
        clock: Clock,
        count: Callable[[str, str], None],
    ) -> None:
        self.notify = notify
        self.audit = audit
        self.clock = clock
        self.count = count  # (action, outcome) -> one more
        self.pages = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def page(
        self,
        message: str,
        *,
        alertname: str | None = None,
        scope: str | None = None,
        action: str | None = None,
        last_exit: int | None = None,
    ) -> None:
        """Audit, log, and post to the notify webhook when one is configured (off the tick).

        What the page is about (an alert, a breaker's scope and action, an engine's last
        exit code) goes into the record and the webhook's payload when given.
        """
        now = self.clock()
        self.pages += 1
        named: dict[str, str | int | None] = {
            "alertname": alertname,
            "scope": scope,
            "action": action,
            "last_exit": last_exit,
        }
        context = {k: v for k, v in named.items() if v is not None}
        # The same page again (a crash loop that pages each crash) is counted, and summed
        # up in a ``kind: repeated`` record; the webhook still gets every one.
        self.audit.append(
            PageRecord(ts=now, message=message, **context),
            stream=("page", alertname or "", scope or "", action or ""),
            key=(message,),
            of={"kind": "page", "message": message[:200], **context},
        )
        log.error("PAGE: %s", message)
        cfg = self.notify
        if not cfg.url:
            self.count("page", "logged")
            return

        async def _send() -> None:
            payload: dict[str, str | int | float] = {
                "source": "kcops",
                "severity": "page",
                "message": message,
                "t": now,
                **context,
            }
            try:
                await send_notify(cfg, payload)
                self.count("page", "sent")
            except Exception as exc:
                self.count("page", "failed")
                log.error("page webhook failed: %s", exc)

        try:
            self.spawn(_send())
        except RuntimeError:
            self.count("page", "failed")

    def ticket(self, message: str, severity: str, alertname: str, now: float) -> None:
        """An alert that is not a page ends its ladder with a record, never a page."""
        self.audit.append(
            EscalationRecord(ts=now, severity=severity, message=message, alertname=alertname)
        )
        log.warning("%s (%s)", message, severity)

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        """Run ``coro`` off the tick, awaited (for a while) at stop. RuntimeError: no loop."""
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            raise
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)
