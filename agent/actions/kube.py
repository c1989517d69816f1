"""The few Kubernetes API calls remediation needs, with the pod's service account."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from kcops.agent.config.actions import KubernetesSection
from kcops.agent.errors import ActionRejected

NS_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class KubeClient:
    def __init__(self, cfg: KubernetesSection) -> None:
        self.cfg = cfg

    def namespace(self) -> str:
        if self.cfg.namespace:
            return self.cfg.namespace
        try:
            return NS_FILE.read_text().strip()
        except OSError:
            raise ActionRejected(
                "actions.kubernetes.namespace not set and no service account namespace file",
                "unsupported",
            ) from None

    def pod_name(self) -> str:
        name = self.cfg.pod_name or os.environ.get("POD_NAME") or os.environ.get("HOSTNAME")
        if not name:
            raise ActionRejected(
                "actions.kubernetes.pod_name not set, nor $POD_NAME", "unsupported"
            )
        return name

    async def request(self, method: str, path: str, body: Any = None, ctype: str = "") -> Any:
        try:
            token = self.cfg.token_file.read_text().strip()
        except OSError as exc:
            raise ActionRejected(
                f"cannot read service account token {self.cfg.token_file}: {exc.strerror}",
                "unsupported",
            ) from None
        headers = {"Authorization": f"Bearer {token}"}
        if ctype:
            headers["Content-Type"] = ctype
        verify: Any = (
            str(self.cfg.ca_file) if self.cfg.ca_file and self.cfg.ca_file.exists() else True
        )
        async with httpx.AsyncClient(timeout=self.cfg.timeout_s, verify=verify) as client:
            content = None
            if body is not None:
                import json

                content = json.dumps(body).encode()
            resp = await client.request(
                method, self.cfg.api_url.rstrip("/") + path, content=content, headers=headers
            )
        if resp.status_code in (401, 403):
            raise ActionRejected(
                f"{method} {path}: not permitted (HTTP {resp.status_code}): {resp.text[:200]}",
                "forbidden",
            )
        if resp.status_code >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else None

    async def delete_own_pod(self) -> dict[str, Any]:
        ns, pod = self.namespace(), self.pod_name()
        await self.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}")
        return {"namespace": ns, "pod": pod}

    async def get_scale(self, deployment: str) -> int:
        ns = self.namespace()
        out = await self.request(
            "GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{deployment}/scale"
        )
        return int(out["spec"].get("replicas", 0))

    async def patch_scale(self, deployment: str, replicas: int) -> None:
        ns = self.namespace()
        await self.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{ns}/deployments/{deployment}/scale",
            {"spec": {"replicas": replicas}},
            "application/merge-patch+json",
        )
