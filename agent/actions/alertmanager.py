"""Alertmanager's webhook payload (version 4) as alert transitions.

Each alert becomes an :class:`AlertTransition` with ``source="alertmanager"``;
its fingerprint and ``startsAt`` travel in reserved annotations so the
remediation component can deduplicate it against local evaluation.

The body is input from the network: it is bounded before anything is kept —
at most :data:`MAX_ALERTS` alerts per request (413 beyond: set ``max_alerts``
in Alertmanager's webhook_config), :data:`MAX_LABELS` labels or annotations
per alert, names up to :data:`MAX_NAME_CHARS` and values up to
:data:`MAX_VALUE_CHARS` characters (400 beyond, naming the alert).

**Scope policy.** Alertmanager hands a notification to one agent of the fleet
(through a Service: an arbitrary one), and the alerts it evaluates aggregate
across pods, so an alert delivered here is not necessarily about this pod.
:func:`addressed` reads what the labels say about that (``pod`` and
``namespace``, else ``instance``); :func:`step_refusal` decides what a ladder
started by such an alert may run here:

- a **pod** step (restart, evict, fallback, topn, notify) runs only when the
  alert names this agent's pod or instance, or when the agent is alone (not
  in a fleet: no fleet lease, no Kubernetes restart or HPA) and the alert
  names no pod at all. Otherwise it is refused (``not_this_pod``, naming what
  the labels say): the pod it concerns runs it from its own rules;
- a **fleet** step (scale_out) runs in a fleet only under the fleet lease
  (``actions.scale.lease.backend``), which the action takes itself; a lone
  agent runs it as it would from its own rules.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcops.agent.events import AlertTransition

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


class BadPayload(ValueError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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
        if isinstance(v, dict | list) or v is None:
            raise BadPayload(f"{what}[{_short(k)}]: values must be strings")
        value = str(v)
        if len(k) > MAX_NAME_CHARS or len(value) > MAX_VALUE_CHARS:
            raise BadPayload(
                f"{what}[{_short(k)}]: names up to {MAX_NAME_CHARS} and values up to "
                f"{MAX_VALUE_CHARS} characters"
            )
        out[str(k)] = value
    return out


def _one(i: int, a: Any, now: float) -> AlertTransition:
    if not isinstance(a, dict) or not isinstance(a.get("labels"), dict):
        raise BadPayload(f"alerts[{i}]: needs a 'labels' object")
    labels = _strings(a["labels"], f"alerts[{i}].labels")
    name = labels.get("alertname")
    if not name:
        raise BadPayload(f"alerts[{i}]: labels have no alertname")
    status = a.get("status")
    if status not in ("firing", "resolved"):
        raise BadPayload(f"alerts[{i}]: status {_short(status)}; allowed: firing, resolved")
    annotations = _strings(a.get("annotations") or {}, f"alerts[{i}].annotations")
    for key, field in ((FINGERPRINT, "fingerprint"), (STARTS_AT, "startsAt")):
        v = a.get(field)
        if v:
            if not isinstance(v, str) or len(v) > MAX_NAME_CHARS:
                raise BadPayload(f"alerts[{i}].{field}: a string up to {MAX_NAME_CHARS} chars")
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


def transitions(payload: Any, now: float) -> list[AlertTransition]:
    """Parse a webhook body; raises BadPayload naming what is wrong (and its HTTP status)."""
    if not isinstance(payload, dict):
        raise BadPayload("body must be a JSON object")
    version = payload.get("version", "")
    if not isinstance(version, str | int) or str(version) != "4":
        raise BadPayload(f"unsupported webhook version {_short(version)}; allowed: '4'")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise BadPayload("'alerts' must be a list")
    if len(alerts) > MAX_ALERTS:
        raise BadPayload(
            f"{len(alerts)} alerts in one request, at most {MAX_ALERTS}: set max_alerts in "
            "Alertmanager's webhook_config",
            status=413,
        )
    return [_one(i, a, now) for i, a in enumerate(alerts)]


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
