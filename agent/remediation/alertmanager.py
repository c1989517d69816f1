"""Alertmanager's webhook payload (version 4) as alert transitions.

Each alert becomes an :class:`AlertTransition` with ``source="alertmanager"``;
its fingerprint and ``startsAt`` travel in reserved annotations so the
remediation component can deduplicate it against local evaluation.

The body is input from the network: it is bounded (:data:`MAX_LABELS`,
:data:`MAX_NAME_CHARS`, :data:`MAX_VALUE_CHARS`) before anything is kept, and
read strictly in Alertmanager's own types (``template.Data``). A request over
:data:`MAX_ALERTS` is not refused whole, since Alertmanager does not retry a 4xx:
the most severe are taken and the rest counted (docs/deploy.md, "Alertmanager's
``max_alerts`` and the webhook's cap").

An alert delivered here is not necessarily about this pod (Alertmanager picks one
agent of the fleet, and its alerts aggregate across pods): :func:`addressed` reads
what the labels say and :func:`step_refusal` decides what a ladder it starts may
run here (docs/remediation.md, "Manual and cluster triggers").
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcops.agent.events import AlertTransition
from kcops.agent.remediation.records import JSONObject
from kcops.agent.samples import Sample

if TYPE_CHECKING:
    from kcops.agent.config import Config

FINGERPRINT = "__fingerprint__"
STARTS_AT = "__starts_at__"

MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_NAME_CHARS = 128
MAX_VALUE_CHARS = 2048
# Distinct alert instances (fingerprints) one remediation ladder tracks; the
# remediation component caps its per-ladder map with this.
MAX_LADDER_INSTANCES = 256


# Severity order for what is taken over the cap: page first (critical in Alertmanager's
# usual words), then ticket (warning); any other severity, or none, last.
SEVERITY_RANK = {"page": 0, "critical": 0, "ticket": 1, "warning": 1}
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)")
ZERO_TIME = datetime.fromisoformat("0001-01-01T00:00:00+00:00")
OVER_CAP = "over_cap"
TRUNCATED = "truncated_by_alertmanager"


class BadPayload(ValueError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Delivery:
    """One webhook request: the transitions taken, and what was not (by severity class)."""

    events: list[AlertTransition]
    dropped: dict[str, int] = field(default_factory=dict)  # page/ticket/other -> count
    truncated: int = 0  # alerts Alertmanager itself left out (its max_alerts)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def answer(self) -> JSONObject:
        out: JSONObject = {"accepted": len(self.events)}
        if self.dropped:
            out["dropped"] = self.dropped_total
            out["dropped_by_severity"] = dict(self.dropped)
            out["warning"] = (
                f"{self.dropped_total} alerts over the cap of {MAX_ALERTS} per request were "
                "dropped (the most severe were taken): set max_alerts in Alertmanager's "
                "webhook_config (deploy/alertmanager/)"
            )
        if self.truncated:
            out["truncated_by_alertmanager"] = self.truncated
        return out


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:60] + "..."


def _strings(raw: Any, what: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise BadPayload(f"{what} must be an object")
    if len(raw) > MAX_LABELS:
        raise BadPayload(f"{what}: {len(raw)} entries, at most {MAX_LABELS}")
    out = {}
    for k, v in raw.items():
        if not isinstance(v, str):  # Alertmanager's LabelSet/KV: string to string
            raise BadPayload(f"{what}[{_short(k)}]: must be a string, got {_short(v)}")
        if len(k) > MAX_NAME_CHARS or len(v) > MAX_VALUE_CHARS:
            raise BadPayload(
                f"{what}[{_short(k)}]: names up to {MAX_NAME_CHARS} and values up to "
                f"{MAX_VALUE_CHARS} characters"
            )
        out[k] = v
    return out


def _time(a: dict[str, Any], name: str, where: str) -> datetime | None:
    """An RFC 3339 timestamp (Go's time.Time in JSON), or None when absent."""
    v = a.get(name)
    if v is None:
        return None
    if not isinstance(v, str) or not _RFC3339.fullmatch(v):
        raise BadPayload(
            f"{where}.{name}: {_short(v)} is not an RFC 3339 timestamp "
            "(e.g. 2024-05-01T12:00:00.5Z)"
        )
    try:
        return datetime.fromisoformat(v)
    except ValueError as exc:
        raise BadPayload(f"{where}.{name}: {_short(v)} is not a real time: {exc}") from None


def _one(i: int, a: Any, now: float) -> AlertTransition:
    where = f"alerts[{i}]"
    if not isinstance(a, dict) or not isinstance(a.get("labels"), dict):
        raise BadPayload(f"{where}: needs a 'labels' object")
    labels = _strings(a["labels"], f"{where}.labels")
    name = labels.get("alertname")
    if not name:
        raise BadPayload(f"{where}: labels have no alertname")
    status = a.get("status")
    if status not in ("firing", "resolved"):
        raise BadPayload(f"{where}: status {_short(status)}; allowed: firing, resolved")
    annotations = _strings(a.get("annotations") or {}, f"{where}.annotations")
    starts, ends = _time(a, "startsAt", where), _time(a, "endsAt", where)
    if starts is not None and starts == ZERO_TIME:
        raise BadPayload(f"{where}.startsAt: the zero time; an alert has started")
    if starts is not None and ends is not None and ends != ZERO_TIME and ends < starts:
        raise BadPayload(f"{where}: endsAt {a['endsAt']!r} is before startsAt {a['startsAt']!r}")
    for key in ("generatorURL", "fingerprint"):
        if key in a and not isinstance(a[key], str):
            raise BadPayload(f"{where}.{key}: must be a string, got {_short(a[key])}")
    for key, fld in ((FINGERPRINT, "fingerprint"), (STARTS_AT, "startsAt")):
        v = a.get(fld)
        if v:
            if len(v) > MAX_NAME_CHARS:
                raise BadPayload(f"{where}.{fld}: a string up to {MAX_NAME_CHARS} chars")
            annotations[key] = v
    firing = status == "firing"
    return AlertTransition(
        alertname=name,
        labels=labels,
        previous="inactive" if firing else "firing",
        state="firing" if firing else "inactive",
        t=now,
        annotations=annotations,
        source="alertmanager",
    )


def _severity(a: Any) -> str:
    labels = a.get("labels") if isinstance(a, dict) else None
    sev = labels.get("severity") if isinstance(labels, dict) else None
    rank = SEVERITY_RANK.get(sev, 2) if isinstance(sev, str) else 2
    return ("page", "ticket", "other")[rank]


def _rank(a: Any) -> tuple[int, int]:
    """Sort key over the cap: severity class, then firing before resolved."""
    firing = isinstance(a, dict) and a.get("status") == "firing"
    return (("page", "ticket", "other").index(_severity(a)), 0 if firing else 1)


def parse_webhook(payload: Any, now: float) -> Delivery:
    """A webhook body as a :class:`Delivery`; raises BadPayload naming what is wrong.

    Over :data:`MAX_ALERTS` alerts, the most severe are taken and the rest counted (only
    what is taken is validated: one bad alert that is not taken fails nothing).
    """
    if not isinstance(payload, dict):
        raise BadPayload("body must be a JSON object")
    version = payload.get("version")
    if version != "4":
        raise BadPayload(f"unsupported webhook version {_short(version)}; allowed: '4'")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise BadPayload("'alerts' must be a list")
    truncated = payload.get("truncatedAlerts", 0)
    if not isinstance(truncated, int) or isinstance(truncated, bool) or truncated < 0:
        raise BadPayload(f"truncatedAlerts: {_short(truncated)} is not a count")
    dropped: dict[str, int] = {}
    taken = list(range(len(alerts)))
    if len(alerts) > MAX_ALERTS:
        order = sorted(taken, key=lambda i: _rank(alerts[i]))  # stable: their order within
        taken = sorted(order[:MAX_ALERTS])
        for i in order[MAX_ALERTS:]:
            sev = _severity(alerts[i])
            dropped[sev] = dropped.get(sev, 0) + 1
    events = [_one(i, alerts[i], now) for i in taken]
    return Delivery(events, dropped, truncated)


def transitions(payload: Any, now: float) -> list[AlertTransition]:
    """The transitions a webhook body carries (see :func:`parse_webhook`)."""
    return parse_webhook(payload, now).events


def dropped_samples(counts: Mapping[str, int]) -> list[Sample]:
    """``kcops_webhook_alerts_dropped_total{reason}``: over the cap, or truncated upstream."""
    return [
        Sample.of("kcops_webhook_alerts_dropped_total", counts.get(r, 0), {"reason": r})
        for r in (OVER_CAP, TRUNCATED)
    ]


# -- scope policy --------------------------------------------------------------

NS_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
HERE = "here"
UNNAMED = "unnamed"
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class Identity:
    """What names this agent in an alert's labels, and whether it is one of a fleet."""

    pod: str | None
    namespace: str | None
    instances: frozenset[str]  # "host:port" values of Prometheus' instance label
    in_fleet: bool


def in_fleet(config: Config) -> bool:
    """One agent of several: a fleet lease, or pods that Kubernetes replicates."""
    a = config.actions
    return a.scale.lease.backend != "none" or a.restart.mode == "kubernetes" or bool(a.scale.hpa)


def identity_of(config: Config, env: dict[str, str] | None = None) -> Identity:
    """This agent's names: pod (actions.kubernetes.pod_name, $POD_NAME, $HOSTNAME),
    namespace (actions.kubernetes.namespace, $POD_NAMESPACE, the service account's),
    and ``host:port`` of its listen port under each of its host names and $POD_IP."""
    env = dict(os.environ) if env is None else env
    k = config.actions.kubernetes
    pod = k.pod_name or env.get("POD_NAME") or env.get("HOSTNAME") or None
    namespace = k.namespace or env.get("POD_NAMESPACE")
    if namespace is None:
        try:
            namespace = NS_FILE.read_text().strip() or None
        except OSError:
            namespace = None
    host, port = config.agent.host_port()
    hosts = {socket.gethostname(), *_LOOPBACK}
    hosts |= {h for h in (pod, env.get("POD_IP"), env.get("HOSTNAME")) if h}
    if host not in ("", "0.0.0.0", "::"):
        hosts.add(host)
    instances = frozenset(f"{h}:{port}" for h in hosts)
    return Identity(pod, namespace, instances, in_fleet(config))


def addressed(labels: dict[str, str], me: Identity) -> str:
    """``here`` (the labels name this agent), ``unnamed`` (no pod, no instance), or
    a description of the other pod or instance they name."""
    pod = labels.get("pod")
    if pod:
        ns = labels.get("namespace")
        if pod == me.pod and (ns is None or me.namespace is None or ns == me.namespace):
            return HERE
        return f"pod {ns + '/' if ns else ''}{pod}"
    instance = labels.get("instance")
    if instance:
        return HERE if instance in me.instances else f"instance {instance}"
    return UNNAMED


def step_refusal(scope: str, where: str, me: Identity, lease_backend: str) -> str | None:
    """Why a step of ``scope`` may not run here for an alert ``where`` (see
    :func:`addressed`) delivered by Alertmanager; None: it may."""
    if scope == "fleet":
        if me.in_fleet and lease_backend == "none":
            return (
                "a fleet step from Alertmanager runs only under the fleet lease, and "
                "actions.scale.lease.backend is none"
            )
        return None
    if where == HERE or (where == UNNAMED and not me.in_fleet):
        return None
    this = f"pod {me.pod}" if me.pod else "this agent"
    if where == UNNAMED:
        return (
            f"the alert names no pod or instance and {this} is one of a fleet: pod steps "
            "run in the pods whose own rules fire"
        )
    return f"the alert is about {where}, not {this}: that pod runs it from its own rules"


class Addressed:
    """Where each Alertmanager instance of each ladder points (:func:`addressed`),
    persisted with the remediation state; what :func:`step_refusal` is asked about."""

    def __init__(self, me: Identity) -> None:
        self.me = me
        self.where: dict[str, dict[str, str]] = {}  # alertname -> fingerprint -> verdict

    def note(self, alertname: str, fp: str, labels: dict[str, str]) -> str:
        where = addressed(labels, self.me)
        if alertname not in self.where and len(self.where) >= MAX_LADDER_INSTANCES:
            return where  # bounded: an unknown name past the cap is judged, not kept
        inst = self.where.setdefault(alertname, {})
        if fp in inst or len(inst) < MAX_LADDER_INSTANCES:
            inst[fp] = where
        return where

    def drop(self, alertname: str, fp: str) -> None:
        self.where.get(alertname, {}).pop(fp, None)

    def forget(self, alertname: str) -> None:
        self.where.pop(alertname, None)

    def here(self, alertname: str, instances: Mapping[str, str]) -> bool:
        """Whether a ladder with these instances is about this agent: one of them is
        local (this agent's own rules fire) or an Alertmanager one naming it."""
        marks = self.where.get(alertname, {})
        return any(src == "local" or marks.get(fp) == HERE for fp, src in instances.items())

    def refusal(
        self, alertname: str, instances: Mapping[str, str], scope: str, lease_backend: str
    ) -> str | None:
        if self.here(alertname, instances):
            return None
        marks = self.where.get(alertname, {})
        verdicts = [marks.get(fp, UNNAMED) for fp in instances] or [UNNAMED]
        # several foreign instances: any verdict refuses alike; name the first
        return step_refusal(scope, verdicts[0], self.me, lease_backend)

    def to_json(self) -> dict[str, dict[str, str]]:
        return {k: dict(v) for k, v in self.where.items() if v}

    def load(self, data: Mapping[str, Mapping[str, str]]) -> None:
        """From the validated state file."""
        self.where = {str(k): dict(v) for k, v in data.items()}
