"""A small real HTTP server that stands in for the kcops worker's admin API.

Same routes and JSON shapes as ``kcops serve`` (issue 4 contract), served by
aiohttp on a free port of 127.0.0.1 inside the test's event loop.
"""

from __future__ import annotations

import copy
from typing import Any

from aiohttp import web

TOKEN = "test-token"


class FakeServer:
    """A fake's HTTP server on a free port of 127.0.0.1: :meth:`app` is its routes."""

    _runner: web.AppRunner | None = None
    url = ""

    def app(self) -> web.Application:
        raise NotImplementedError

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class FakeWorker(FakeServer):
    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.state: dict[str, Any] = {
            "pid": 4242,
            "model": "tiny",
            "route_mode": "normal",
            "top_n": 64,
            "top_n_bounds": [16, 256],
            "admitting": True,
            "in_flight": 0,
            "cache": {"blocks": 100, "expired_blocks": 30, "used_bytes": 100 * 4096},
            "faults": {},
        }
        self.calls: list[tuple[str, str, Any]] = []

    def snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self.state)

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _body(self, request: web.Request) -> Any:
        body = await request.json() if request.can_read_body else None
        self.calls.append((request.method, request.path, body))
        return body

    def app(self) -> web.Application:
        async def state(_: web.Request) -> web.Response:
            return web.json_response(self.state)

        async def health(_: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def evict(request: web.Request) -> web.Response:
            if not self._authorized(request):
                return web.json_response({"error": "unauthorized"}, status=401)
            body = await self._body(request)
            cache = self.state["cache"]
            before = dict(cache)
            policy = body["policy"]
            if policy == "expired":
                n = cache["expired_blocks"]
            elif policy == "lru":
                n = int(cache["blocks"] * float(body.get("fraction", 0.5)))
            else:
                n = cache["blocks"]
            cache["blocks"] -= n
            cache["expired_blocks"] = max(0, cache["expired_blocks"] - n)
            cache["used_bytes"] = cache["blocks"] * 4096
            return web.json_response(
                {
                    "policy": policy,
                    "evicted_blocks": n,
                    "freed_bytes": n * 4096,
                    "before": before,
                    "after": dict(cache),
                }
            )

        async def route(request: web.Request) -> web.Response:
            if not self._authorized(request):
                return web.json_response({"error": "unauthorized"}, status=401)
            body = await self._body(request)
            before = self.state["route_mode"]
            self.state["route_mode"] = body["mode"]
            return web.json_response({"before": before, "after": body["mode"]})

        async def attention(request: web.Request) -> web.Response:
            if not self._authorized(request):
                return web.json_response({"error": "unauthorized"}, status=401)
            body = await self._body(request)
            lo, hi = self.state["top_n_bounds"]
            n = int(body["top_n"])
            if not lo <= n <= hi:
                return web.json_response({"error": f"top_n outside [{lo}, {hi}]"}, status=400)
            before = {"top_n": self.state["top_n"]}
            self.state["top_n"] = n
            return web.json_response({"before": before, "after": {"top_n": n}})

        async def drain(request: web.Request) -> web.Response:
            if not self._authorized(request):
                return web.json_response({"error": "unauthorized"}, status=401)
            body = await self._body(request)
            self.state["admitting"] = bool(body["admit"])
            return web.json_response(
                {"admitting": self.state["admitting"], "in_flight": self.state["in_flight"]}
            )

        app = web.Application()
        app.add_routes(
            [
                web.get("/admin/state", state),
                web.get("/health", health),
                web.post("/admin/cache/evict", evict),
                web.post("/admin/route", route),
                web.post("/admin/attention", attention),
                web.post("/admin/drain", drain),
            ]
        )
        return app
