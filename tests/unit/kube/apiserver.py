"""A stand-in Kubernetes API server for the client's real request path.

No API server can run on these machines. This aiohttp server answers the few
endpoints the agent uses with response bodies shaped like the API server's
(objects with resourceVersion, ``Status`` errors), keeps optimistic
concurrency (a stale ``resourceVersion`` gets 409 Conflict), and enforces the
Role of deploy/base/rbac.yaml: a request the Role does not allow gets 403,
so the tests prove the shipped RBAC is enough and the client asks no more.
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

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"/namespaces/(?P<ns>[^/]+)/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
_VERB = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


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
