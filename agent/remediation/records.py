"""The audit log's records, one model per ``kind``, the trigger they carry, and the
:class:`Run` of an action that writes its ``started`` and ``action`` records.

The agent writes these models (:meth:`AuditLog.append`) and ``kcops actions
history`` reads them back through the same models (:func:`parse_record`), so a
field has one name in both places. On disk a record is the JSON object of its
fields as they were set (``exclude_unset``): the same keys as records written
before these models existed, which still parse. A kind this agent does not
know (a newer agent's) parses as :class:`OtherRecord`, its fields kept.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    JsonValue,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from kcops.agent.actions.base import ActionResult, JSONObject
from kcops.agent.events import AlertTransition
from kcops.agent.outcome import RAN, ActionName, Outcome, Phase, Refusal


class _Model(BaseModel):
    # Old and newer agents' records may carry fields this one does not name.
    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _as_set(self, handler: SerializerFunctionWrapHandler) -> JSONObject:
        # Only the fields that were set, wherever the model is dumped (audit log, state
        # file, status): a trigger keeps the keys its source gave it.
        out: JSONObject = handler(self)
        keep = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in out.items() if k in keep}

    def as_json(self) -> JSONObject:
        """The fields that were set, as JSON values (what goes on disk and over HTTP)."""
        return self.model_dump(mode="json")


class Trigger(_Model):
    """What started a run or a ladder: an alert transition, the control API, or a restore.

    An alert transition sets ``t``..``source``; a run asked over HTTP sets
    ``source="api"`` and ``remote``; an automatic restore sets ``alertname``,
    ``resolved_since`` and ``hold_s``. Only the fields set are written.
    """

    t: float | None = None
    alertname: str | None = None
    labels: dict[str, str] = {}
    previous: str | None = None
    state: str | None = None
    value: float | None = None
    source: str | None = None
    remote: str | None = None
    resolved_since: float | None = None
    hold_s: float | None = None

    @classmethod
    def of(cls, ev: AlertTransition) -> Trigger:
        return cls(
            t=ev.t,
            alertname=ev.alertname,
            labels=dict(ev.labels),
            previous=ev.previous,
            state=ev.state,
            value=ev.value,
            source=ev.source,
        )

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "page")


class LadderRef(_Model):
    """Which ladder step a run is: ``step`` of ``of`` (0-based) of ladder ``id``."""

    alertname: str
    step: int = 0
    of: int = 0
    id: str = ""


class _Record(_Model):
    kind: ClassVar[str]
    ts: float

    def as_json(self) -> JSONObject:
        return {"kind": self.kind, **super().as_json()}


class ActionRecord(_Record):
    """One decided run (``kind: action``): ran, dry run or refused."""

    kind: ClassVar[str] = "action"
    run_id: str = ""
    action: ActionName
    params: JSONObject = {}
    target: str = ""
    mode: str = ""
    outcome: Outcome | None = None
    error: str | None = None
    duration_s: float = 0.0
    before: JsonValue = None
    after: JsonValue = None
    detail: str | None = None
    result: JSONObject | None = None
    trigger: Trigger | None = None
    ladder: LadderRef | None = None
    forced: bool = False
    reason: str | None = None
    refusal: Refusal | None = None


class StartedRecord(_Record):
    """A run about to act (``kind: started``), durable before it acts: a ``kill -9``
    during the run leaves it on record (a restarted agent writes its ``interrupted``
    outcome), and explains the cooldown it spent."""

    kind: ClassVar[str] = "started"
    run_id: str
    action: ActionName
    params: JSONObject = {}
    target: str = ""
    mode: str = ""
    trigger: Trigger | None = None
    ladder: LadderRef | None = None
    forced: bool = False
    reason: str | None = None


class RepeatedRecord(_Record):
    """A record that repeated (``kind: repeated``): ``count`` more times than written,
    ``first_ts``..``last_ts``; ``of`` names it (action, outcome, refusal, alert).
    ``why``: changed, ended (quiet), ongoing (long), stopping, forgotten."""

    kind: ClassVar[str] = "repeated"
    of: JSONObject = {}
    count: int
    first_ts: float
    last_ts: float
    since: float | None = None  # the record it repeats was written at this time
    why: str = ""
    error: str | None = None


class LadderRecord(_Record):
    """A ladder event (``kind: ladder``): started, climb, skipped, exhausted, resolved, ..."""

    kind: ClassVar[str] = "ladder"
    event: str
    alertname: str
    step: int = 0
    steps: list[ActionName] = []
    phase: Phase = Phase.RUN
    mode: str = ""
    trigger: Trigger = Trigger()
    why: str | None = None
    ran: list[str] | None = None
    refused: list[str] | None = None
    # Steps that were due but did not run in this ladder (cooldown: run recently).
    skipped: list[str] | None = None
    by: Trigger | None = None  # superseded: the alert that started it over


class AlertRecord(_Record):
    """What remediation decided about a cluster alert (``kind: alert``)."""

    kind: ClassVar[str] = "alert"
    event: str  # joined, deduplicated, ignored, refused, capped
    detail: str = ""
    trigger: Trigger = Trigger()


class PageRecord(_Record):
    """A page (``kind: page``): a ladder's end, or a circuit breaker that opened."""

    kind: ClassVar[str] = "page"
    message: str
    alertname: str | None = None
    scope: str | None = None
    action: ActionName | None = None
    last_exit: int | None = None  # an engine crash loop: its last exit code
    incident: str | None = None  # the open incident's record (kcops incident show ID)


class EscalationRecord(_Record):
    """The end of a ladder of an alert that is not a page (``kind: escalation``)."""

    kind: ClassVar[str] = "escalation"
    severity: str
    message: str
    alertname: str


class FleetRecord(_Record):
    """A fleet event (``kind: fleet``): a scale_out hold that ended."""

    kind: ClassVar[str] = "fleet"
    event: str
    min_replicas: int


class OtherRecord(_Record):
    """A record of a kind this agent does not know (its fields kept as they were)."""

    kind: ClassVar[str] = "?"
    ts: float = 0.0

    def as_json(self) -> JSONObject:
        return _Model.as_json(self)


AuditRecord = (
    ActionRecord
    | StartedRecord
    | RepeatedRecord
    | LadderRecord
    | AlertRecord
    | PageRecord
    | EscalationRecord
    | FleetRecord
    | OtherRecord
)

KINDS: dict[str, type[_Record]] = {
    m.kind: m
    for m in (
        ActionRecord,
        StartedRecord,
        RepeatedRecord,
        LadderRecord,
        AlertRecord,
        PageRecord,
        EscalationRecord,
        FleetRecord,
    )
}


def parse_record(raw: JSONObject) -> AuditRecord:
    """The model of ``raw``'s kind; an unknown kind, or one that does not fit, as OtherRecord.

    Raises ValidationError only when ``ts`` itself is not a number.
    """
    kind = raw.get("kind")
    model = KINDS.get(kind) if isinstance(kind, str) else None
    if model is not None:
        try:
            rec = model.model_validate({k: v for k, v in raw.items() if k != "kind"})
        except ValidationError:
            pass
        else:
            assert isinstance(rec, AuditRecord)  # one of the union's models
            return rec
    return OtherRecord.model_validate(raw)


# -- one run, as the runner decides and executes it, and what it writes ---------------


@dataclass
class Run:
    id: str
    action: ActionName
    params: JSONObject
    target: str
    mode: str
    t: float
    trigger: Trigger | None = None
    ladder: LadderRef | None = None
    forced: bool = False
    reason: str | None = None
    outcome: Outcome | None = None
    error: str | None = None
    # Why it was refused, as a code (unsupported, not_configured, at_bound, ...).
    refusal: Refusal | None = None
    result: ActionResult | None = None
    duration_s: float = 0.0
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def _asked(self) -> JSONObject:
        """What was asked: the fields its started record and its outcome record share."""
        return {
            "ts": self.t, "run_id": self.id, "action": self.action, "params": self.params,
            "target": self.target, "mode": self.mode, "forced": self.forced,
            "reason": self.reason,
        }  # fmt: skip

    def started(self) -> StartedRecord:
        """The record written (durably) before the run acts."""
        return StartedRecord(**self._asked(), trigger=self.trigger, ladder=self.ladder)

    @property
    def stream(self) -> tuple[str, str, str, str]:
        """What a repeat of this run's decision is counted against (:mod:`.auditrepeat`)."""
        alert = (self.ladder.alertname if self.ladder else None) or (
            self.trigger.alertname if self.trigger else None
        )
        return ("action", self.action, self.target, alert or "")

    def repeat_key(self) -> tuple[str, ...] | None:
        """A decision that did not act and may repeat while its cause lasts (a refusal
        of a ladder step, a restore, a retry); None: written every time (a run that
        acted, or anything asked by hand or over the API)."""
        if self.outcome is None or self.outcome in RAN:
            return None
        if self.trigger is None or self.trigger.source == "api":
            return None  # asked by hand: every answer acknowledges its own record
        return (self.outcome, self.refusal or "", self.mode)

    def record(self) -> ActionRecord:
        res = self.result
        return ActionRecord(
            **self._asked(),
            trigger=self.trigger,
            ladder=self.ladder,
            outcome=self.outcome,
            error=self.error,
            duration_s=round(self.duration_s, 6),
            before=res.before if res else None,
            after=res.after if res else None,
            detail=res.detail if res else None,
            result=res.data if res else None,
            refusal=self.refusal,
        )
