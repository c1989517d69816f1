"""A stand-in Kubernetes API server for the client's real request path.

No API server can run on these machines. This aiohttp server answers the few
endpoints the agent uses with response bodies shaped like the API server's
(objects with resourceVersion, ``Status`` errors), keeps optimistic
concurrency (a stale ``resourceVersion`` gets 409 Conflict), and enforces the
Role of deploy/base/rbac.yaml: a request the Role does not allow gets 403,
so the tests prove the shipped RBAC is enough and the client asks no more.
It also checks what a real server would refuse of the agent's writes: a
Lease's MicroTime fields must carry six fraction digits (400 otherwise), and
an Eviction is answered 429 while ``evictions_allowed`` is False, as the
server does when the PodDisruptionBudget allows no disruption.
Every request is recorded (verb, path, content type, token, body).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "deploy" / "base" / "rbac.yaml"
LEASE = REPO / "deploy" / "base" / "lease.yaml"
# metav1.MicroTime's wire form (RFC3339Micro): exactly six fraction digits.
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"/namespaces/(?P<ns>[^/]+)/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
_VERB = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def shipped_lease() -> dict[str, Any]:
    """The Lease object deploy/ applies (deploy/base/lease.yaml)."""
    return dict(yaml.safe_load(LEASE.read_text()))


def load_role_rules() -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all(ROLE.read_text()))
    role = next(d for d in docs if d["kind"] == "Role")
    return list(role["rules"])


@dataclass
class Request:
    verb: str
    path: str
    content_type: str
    token: str
    body: Any


@dataclass
class ApiServer:
    token: str
    rules: list[dict[str, Any]] = field(default_factory=load_role_rules)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    evictions_allowed: bool = True
    _rv: itertools.count = field(default_factory=lambda: itertools.count(100))
    _runner: web.AppRunner | None = None

    # -- fixtures ---------------------------------------------------------------

    def put(self, path: str, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))
        self.objects[path] = obj

    # -- RBAC ---------------------------------------------------------------------

    def allowed(self, verb: str, group: str, resource: str, name: str | None) -> bool:
        for r in self.rules:
            if group not in r["apiGroups"] or resource not in r["resources"]:
                continue
            if verb not in r["verbs"]:
                continue
            names = r.get("resourceNames")
            if names and (name is None or name not in names):
                continue
            return True
        return False

    # -- HTTP -----------------------------------------------------------------------

    @staticmethod
    def status(code: int, reason: str, message: str) -> web.Response:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
        return web.json_response(body, status=code)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        auth = request.headers.get("Authorization", "")
        self.requests.append(
            Request(request.method, request.path, request.content_type, auth, body)
        )
        if auth != f"Bearer {self.token}":
            return self.status(401, "Unauthorized", "Unauthorized")
        m = _PATH.match(request.path)
        if not m:
            return self.status(404, "NotFound", f"no route {request.path}")
        group = "" if m["core"] else m["group"]
        resource = m["resource"] + (f"/{m['sub']}" if m["sub"] else "")
        verb = _VERB[request.method]
        if not self.allowed(verb, group, resource, m["name"]):
            return self.status(
                403,
                "Forbidden",
                f'{resource} "{m["name"]}" is forbidden: cannot {verb} in group "{group}"',
            )
        bad = self.bad_micro_time(m["resource"], body)
        if bad:
            return self.status(400, "BadRequest", bad)
        if request.method == "POST" and m["sub"] == "eviction":
            return self.evict(request.path.rsplit("/", 1)[0])
        if request.method == "POST":
            path = f"{request.path}/{body['metadata']['name']}"
            if path in self.objects:
                return self.status(409, "AlreadyExists", "already exists")
            self.put(path, body)
            return web.json_response(self.objects[path], status=201)
        obj = self.objects.get(request.path)
        if obj is None:
            return self.status(404, "NotFound", f'{resource} "{m["name"]}" not found')
        if request.method == "GET":
            return web.json_response(obj)
        if request.method == "DELETE":
            del self.objects[request.path]
            return web.json_response({"kind": "Status", "status": "Success"})
        sent_rv = (body.get("metadata") or {}).get("resourceVersion")
        if sent_rv is not None and sent_rv != obj["metadata"]["resourceVersion"]:
            return self.status(409, "Conflict", "the object has been modified")
        new = body if request.method == "PUT" else merge(copy.deepcopy(obj), body)
        new.setdefault("metadata", {}).pop("resourceVersion", None)
        self.put(request.path, new)
        return web.json_response(self.objects[request.path])

    @staticmethod
    def bad_micro_time(resource: str, body: Any) -> str | None:
        if resource != "leases" or not isinstance(body, dict):
            return None
        spec = body.get("spec") or {}
        for name in ("acquireTime", "renewTime"):
            v = spec.get(name)
            if v is not None and not MICRO_TIME.match(str(v)):
                return (
                    f'Lease in version "v1" cannot be handled: spec.{name}: {v!r}: not RFC3339Micro'
                )
        return None

    def evict(self, pod_path: str) -> web.Response:
        if pod_path not in self.objects:
            return self.status(404, "NotFound", "pod not found")
        if not self.evictions_allowed:
            return self.status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )
        del self.objects[pod_path]
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}, status=201
        )

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (what a strategic merge does for maps and scalars)."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = merge(target.get(k), v)
    return target
