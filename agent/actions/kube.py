"""The Kubernetes API calls remediation needs, through ``kubernetes_asyncio``.

What the agent does in a cluster: evict its own pod (``restart_worker``,
through the Eviction API so the PodDisruptionBudget is honoured),
read the Deployment's scale, read and patch the one HPA it may raise
(``scale_out``), hold a ``coordination.k8s.io`` Lease (fleet actions), and read
the engine container's last log lines (incident records).

Errors: 401/403 become ``ActionRejected(reason="forbidden")`` naming the
request; 429 on an eviction becomes ``busy`` (a refusal that passes by itself);
anything else the API refuses is :class:`KubeError` with its status.

The client is configured from ``actions.kubernetes`` (by default the in-cluster
files), not ``load_incluster_config()``: the same settings then point it at a
test server, and the token file is reread when the kubelet rotates it
(``_Token``), which the client's own loader does only for its synchronous twin.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcops.agent.config.actions import KubernetesSection
from kcops.agent.outcome import ActionRejected, Refusal

NS_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LOG_BYTES = 64 * 1024  # a container log's tail: what an incident record keeps of it


class KubeError(RuntimeError):
    """The API server refused a request; ``status`` is its HTTP status (0: no answer)."""

    def __init__(self, what: str, status: int, body: str = "") -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:300]}")
        self.status = status


@dataclass
class _Token:
    """The bearer token file, reread when its mtime or size changes (kubelet rotation)."""

    path: Path
    stamp: tuple[int, int] = (0, -1)
    value: str = ""

    def read(self) -> str:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self.stamp:
                self.value = self.path.read_text().strip()
                self.stamp = stamp
        except OSError as exc:
            raise ActionRejected(
                f"cannot read service account token {self.path}: {exc.strerror}",
                Refusal.UNSUPPORTED,
            ) from None
        if not self.value:
            raise ActionRejected(f"service account token {self.path} is empty", Refusal.UNSUPPORTED)
        return self.value


class KubeClient:
    """One API client per use: ``async with KubeClient(cfg) as kube: ...``.

    Each method names the object it touches; the Role in deploy/base/rbac.yaml
    grants exactly these verbs on these objects.
    """

    def __init__(self, cfg: KubernetesSection) -> None:
        self.cfg = cfg
        self._token = _Token(cfg.token_file)
        self._api: Any = None

    # -- identity -------------------------------------------------------------

    def namespace(self) -> str:
        if self.cfg.namespace:
            return self.cfg.namespace
        try:
            return NS_FILE.read_text().strip()
        except OSError:
            raise ActionRejected(
                "actions.kubernetes.namespace not set and no service account namespace file",
                Refusal.UNSUPPORTED,
            ) from None

    def pod_name(self) -> str:
        name = self.cfg.pod_name or os.environ.get("POD_NAME") or os.environ.get("HOSTNAME")
        if not name:
            raise ActionRejected(
                "actions.kubernetes.pod_name not set, nor $POD_NAME", Refusal.UNSUPPORTED
            )
        return name

    # -- client ---------------------------------------------------------------

    def _client(self) -> Any:
        if self._api is not None:
            return self._api
        try:
            from kubernetes_asyncio import client
        except ImportError:
            raise ActionRejected(
                "the Kubernetes client is not installed: pip install 'kcops[kubernetes]'",
                Refusal.UNSUPPORTED,
            ) from None
        conf = client.Configuration(host=self.cfg.api_url.rstrip("/"))
        if self.cfg.ca_file is not None:
            if not self.cfg.ca_file.is_file():
                # Never fall back to the system CAs for the API server's certificate.
                raise ActionRejected(
                    f"actions.kubernetes.ca_file {self.cfg.ca_file} does not exist "
                    "(set it to the cluster CA, or null for the system CAs)",
                    Refusal.UNSUPPORTED,
                )
            conf.ssl_ca_cert = str(self.cfg.ca_file)
        token = self._token

        def refresh(c: Any, *_: Any) -> None:
            c.api_key["BearerToken"] = "Bearer " + token.read()

        refresh(conf)
        conf.refresh_api_key_hook = refresh
        self._api = client.ApiClient(conf)
        return self._api

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, what: str, coro_fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one generated-client call; map its ApiException to our errors."""
        from kubernetes_asyncio.client.exceptions import ApiException

        kwargs.setdefault("_request_timeout", self.cfg.timeout_s)
        try:
            return await coro_fn(*args, **kwargs)
        except ApiException as exc:
            status = int(exc.status or 0)
            body = str(exc.body or exc.reason or "")
            if status in (401, 403):
                raise ActionRejected(
                    f"{what}: not permitted (HTTP {status}): {body[:200]}", Refusal.FORBIDDEN
                ) from None
            raise KubeError(what, status, body) from None

    def apis(self) -> Any:
        from kubernetes_asyncio import client

        api = self._client()
        return _Apis(
            core=client.CoreV1Api(api),
            apps=client.AppsV1Api(api),
            autoscaling=client.AutoscalingV2Api(api),
            coordination=client.CoordinationV1Api(api),
        )

    # -- the calls remediation makes ------------------------------------------

    async def evict_own_pod(self) -> dict[str, str]:
        """Evict this agent's pod (``create pods/eviction``): the Deployment replaces
        it, and the PodDisruptionBudget decides whether it may go now."""
        from kubernetes_asyncio import client

        ns, pod = self.namespace(), self.pod_name()
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=ns))
        what = f"evict pod {ns}/{pod}"
        try:
            await self.call(what, self.apis().core.create_namespaced_pod_eviction, pod, ns, body)
        except KubeError as exc:
            if exc.status == 429:
                raise ActionRejected(
                    f"{what}: the PodDisruptionBudget allows no disruption now "
                    "(another serving pod is down); retried later",
                    Refusal.BUSY,
                ) from None
            raise
        finally:
            await self.close()
        return {"namespace": ns, "pod": pod}

    async def get_scale(self, deployment: str) -> int:
        ns = self.namespace()
        out = await self.call(
            f"get deployments/scale {ns}/{deployment}",
            self.apis().apps.read_namespaced_deployment_scale,
            deployment,
            ns,
        )
        return int(out.spec.replicas or 0)

    async def patch_scale(self, deployment: str, replicas: int) -> None:
        """Set a Deployment's replicas. Only for a Deployment no HPA owns (scale_out
        raises the HPA's minReplicas instead when there is one)."""
        ns = self.namespace()
        await self.call(
            f"patch deployments/scale {ns}/{deployment}",
            self.apis().apps.patch_namespaced_deployment_scale,
            deployment,
            ns,
            {"spec": {"replicas": replicas}},
            _content_type="application/merge-patch+json",
        )

    async def container_log(self, container: str, tail_lines: int) -> list[str]:
        """The last ``tail_lines`` lines (at most ``LOG_BYTES``) a container of this pod
        wrote (``get pods/log``). Raises :class:`KubeError` with the HTTP status, 403 too
        (the Role lacks ``pods/log``): the caller records why it has no log; 0: no answer
        within ``timeout_s``. ``ActionRejected`` where no client can be built (no pod
        name, token or ``kubernetes_asyncio``)."""
        from aiohttp import ClientError

        ns, pod = self.namespace(), self.pod_name()
        what = f"get pods/log {ns}/{pod} container {container}"
        try:  # raw: the generated client would parse a log that happens to be JSON
            resp = await self.apis().core.read_namespaced_pod_log(
                pod, ns, container=container, tail_lines=tail_lines, limit_bytes=LOG_BYTES,
                _preload_content=False, _request_timeout=self.cfg.timeout_s,
            )  # fmt: skip
            async with resp:
                body = (await resp.read()).decode(errors="replace")
        except (TimeoutError, OSError, ClientError) as exc:
            raise KubeError(what, 0, str(exc) or type(exc).__name__) from None
        if not 200 <= resp.status < 300:
            raise KubeError(what, resp.status, body)
        return body.splitlines()


@dataclass
class _Apis:
    core: Any
    apps: Any
    autoscaling: Any
    coordination: Any
