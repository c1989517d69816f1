"""The ``actions:`` section: remediation mode, guards and per-action settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, StrictBool, model_validator

from kcops.agent.config.base import Section
from kcops.agent.duration import Duration
from kcops.agent.events import DEFAULT_VERIFY_S

Mode = Literal["enforce", "dry-run", "off"]
RestartMode = Literal["auto", "supervisor", "signal", "kubernetes", "off"]


class GuardsSection(Section):
    """Limits the runner applies to every action (docs/architecture.md#remediation)."""

    cooldown_s: Duration = Field(300.0, ge=0, description="per (action, target) cooldown")
    cooldown_overrides_s: dict[str, Duration] = Field(
        default_factory=dict, description="cooldown per action name, overriding cooldown_s"
    )
    budget_per_hour: int = Field(20, ge=0, description="action runs per hour, all actions")
    action_budget_per_hour: int = Field(6, ge=0, description="runs per hour of one action")
    action_budget_overrides: dict[str, int] = Field(
        default_factory=dict,
        description="runs per hour per action name, overriding action_budget_per_hour",
    )
    action_timeout_s: Duration = Field(120.0, gt=0, le=3600, description="a run past this fails")
    default_verify_s: Duration = Field(
        DEFAULT_VERIFY_S, ge=0, description="verify window of a ladder step that gives none"
    )
    retry_s: Duration = Field(
        5.0, ge=0, description="a ladder step refused as busy or starting is tried again after"
    )
    resume_grace_s: Duration = Field(
        660.0,
        ge=0,
        description="after an agent restart, a resumed ladder waits this long for its alert "
        "to be pending or firing again (cover the longest rule `for`) before it is resolved",
    )
    dedup_window_s: Duration = Field(
        600.0, ge=0, description="a cluster alert started before a local ladder ended is the same"
    )
    durable_wait_s: Duration = Field(
        10.0,
        gt=0,
        le=600,
        description="how long an action waits for its started record and the guard state it "
        "spent to reach the disk before it acts; past it the run is refused "
        "(skipped_not_durable, tried again by its ladder) and spends nothing",
    )


class EvictSection(Section):
    """The Redis KV tier that ``evict_cache`` cleans, if any."""

    redis_url: str | None = Field(None, description="redis://host:port/db of the KV tier")
    redis_prefix: str = Field("kcops:kv:", min_length=1, description="only keys under it")
    expired_idle_s: Duration = Field(
        600.0, ge=0, description="policy 'expired': keys idle at least this long"
    )
    scan_count: int = Field(500, ge=10, le=100_000, description="SCAN COUNT hint")
    batch: int = Field(500, ge=1, le=100_000, description="keys per UNLINK / IDLETIME pipeline")
    max_seconds: Duration = Field(5.0, gt=0, le=600, description="time bound of one eviction")


class TopNSection(Section):
    step: int = Field(16, ge=1, description="tokens lower_topn and raise_topn move N by")
    min: int = Field(16, ge=1, description="N is never lowered below this")
    max: int = Field(1024, ge=1, description="N is never raised above this")

    @model_validator(mode="after")
    def _order(self) -> TopNSection:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class FallbackSection(Section):
    hold_s: Duration = Field(
        300.0, ge=0, description="restore normal routing after the alert stayed resolved this long"
    )


class RestartSection(Section):
    """How ``restart_worker`` restarts, and how the supervisor treats its child.

    ``auto`` means ``supervisor`` when the agent launched the engine (``--``)
    and refuses otherwise: signalling a pid or deleting the pod must be
    configured explicitly.
    """

    mode: RestartMode = Field(
        "auto",
        description="supervisor, signal (engine.pid/pidfile), kubernetes (delete the pod) or off",
    )
    drain_deadline_s: Duration = Field(
        30.0, ge=0, le=3600, description="how long in-flight requests may finish before the stop"
    )
    grace_s: Duration = Field(10.0, ge=0, le=600, description="SIGTERM to SIGKILL")
    backoff_initial_s: Duration = Field(
        1.0, ge=0, le=600, description="first wait before respawning a crashed engine"
    )
    backoff_max_s: Duration = Field(
        60.0, ge=0, le=3600, description="the respawn wait doubles up to this"
    )
    stable_s: Duration = Field(60.0, ge=0, description="up this long resets the backoff")
    crash_loop_max: int = Field(5, ge=1, description="crashes within the window, then stop")
    crash_loop_window_s: Duration = Field(
        600.0, gt=0, description="the window crash_loop_max counts crashes in"
    )
    crash_loop: Literal["page", "evict_pod"] = Field(
        "page",
        description="after a supervised engine's crash loop (supervision stops): page, or "
        "page and evict this pod (Kubernetes: the Deployment schedules a fresh pod)",
    )
    startup_grace_s: Duration = Field(
        180.0,
        ge=0,
        description="a supervised engine not yet healthy since it was started is not restarted "
        "again within this time (a model load looks like a hang)",
    )
    beside_survivors: Literal["auto", "allow", "refuse"] = Field(
        "auto",
        description="when the old engine's processes outlive SIGKILL (stuck in the kernel, "
        "frozen): start the new one beside them (allow), or not and escalate as after a "
        "crash loop (refuse); auto refuses when the agent sees a GPU (they hold its memory) "
        "and allows on a CPU engine",
    )


class KubernetesSection(Section):
    """In-cluster API access (service account) for pod delete and scale."""

    api_url: str = Field("https://kubernetes.default.svc", description="the Kubernetes API server")
    token_file: Path = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        description="the service account token the agent calls the API with",
    )
    ca_file: Path | None = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
        description="CA bundle the API server's certificate is checked against",
    )
    namespace: str | None = Field(None, description="default: the service account's namespace")
    pod_name: str | None = Field(None, description="default: $POD_NAME, then $HOSTNAME")
    timeout_s: Duration = Field(5.0, gt=0, le=60, description="one API call's timeout")
    engine_container: str = Field(
        "engine", min_length=1, max_length=63,
        description="the engine's container in this pod, whose log an incident record keeps",
    )  # fmt: skip


_K8S_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class LeaseSection(Section):
    """The lock a fleet action (scale_out) takes first, so one agent of the fleet acts."""

    backend: Literal["none", "kubernetes", "redis"] = Field(
        "none",
        description="kubernetes: a coordination.k8s.io Lease; redis: a fenced Redis lock; "
        "none: this agent acts alone (a single replica)",
    )
    name: str = Field("kcops-fleet-scale-out", pattern=_K8S_NAME, description="lease name")
    redis_url: str | None = Field(None, description="redis://host:port/db (backend redis)")
    duration_s: Duration = Field(
        30.0, ge=1, le=3600, description="a holder that stops renewing loses it after this"
    )
    holder: str | None = Field(None, description="this agent's identity (default: $POD_NAME)")
    cooldown_s: Duration | None = Field(
        None,
        ge=0,
        le=86400,
        description="fleet-wide time between two fleet actions (default: the action's "
        "guard cooldown, which each agent also applies to itself)",
    )


class ScaleSection(Section):
    min_replicas: int = Field(1, ge=0, description="replicas never asked below this")
    max_replicas: int = Field(10, ge=1, description="replicas never asked above this")
    step: int = Field(1, ge=1, description="replicas added by one scale_out")
    deployment: str | None = Field(
        None,
        pattern=_K8S_NAME,
        description="the Deployment whose current replicas scale_out reads",
    )
    hpa: str | None = Field(
        None,
        pattern=_K8S_NAME,
        description="raise this HPA's minReplicas (never patch replicas under an HPA)",
    )
    hpa_reads_gauge: StrictBool = Field(
        False,
        description="an HPA scales on kcops_desired_replicas (prometheus-adapter): publishing "
        "the gauge is the scale-out; with none of deployment, hpa, this or a fleet lease, "
        "scale_out has no scaler and is refused",
    )
    hold_s: Duration = Field(
        1800.0, ge=0, le=7 * 86400, description="then minReplicas goes back to what it was"
    )
    lease: LeaseSection = Field(default_factory=LeaseSection)

    @model_validator(mode="after")
    def _order(self) -> ScaleSection:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) > max_replicas")
        return self


class NotifySection(Section):
    url: str | None = Field(None, description="webhook that receives notify and page messages")
    timeout_s: Duration = Field(5.0, gt=0, le=60, description="one webhook call's timeout")
    headers: dict[str, str] = Field(
        default_factory=dict, description="HTTP headers sent with each call (an auth token)"
    )


class ActionsSection(Section):
    mode: Mode = Field(
        "dry-run", description="enforce acts; dry-run records what it would do; off does neither"
    )
    guards: GuardsSection = Field(default_factory=GuardsSection)
    evict: EvictSection = Field(default_factory=EvictSection)
    topn: TopNSection = Field(default_factory=TopNSection)
    fallback: FallbackSection = Field(default_factory=FallbackSection)
    restart: RestartSection = Field(default_factory=RestartSection)
    scale: ScaleSection = Field(default_factory=ScaleSection)
    kubernetes: KubernetesSection = Field(default_factory=KubernetesSection)
    notify: NotifySection = Field(default_factory=NotifySection)
    alertmanager_webhook: StrictBool = Field(True, description="serve POST /api/v1/alertmanager")


def warnings(actions: ActionsSection) -> list[str]:
    """Settings that make ladder steps refuse (not errors: the agent runs, those steps skip)."""
    out = []
    if not actions.notify.url:
        out.append(
            "actions.notify.url is not set: notify steps are refused "
            "(no applicable remediation) and pages are only logged and audited"
        )
    scale = actions.scale
    if (
        not (scale.deployment or scale.hpa or scale.hpa_reads_gauge)
        and scale.lease.backend == "none"
    ):
        out.append(
            "actions.scale has no scaler (deployment, hpa, hpa_reads_gauge or a fleet lease): "
            "scale_out steps are refused"
        )
    return out
