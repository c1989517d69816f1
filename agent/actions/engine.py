"""The engine's admin API as actions see it, per adapter.

The kcops worker has the full admin API (cache, route, top-N, drain, state);
vLLM and SGLang only a cache reset. Anything an adapter cannot do raises
:class:`~kcops.agent.errors.ActionRejected` with reason ``unsupported``.
"""

from __future__ import annotations

from typing import Any

import httpx

from kcops.agent.errors import ActionRejected

# Cache reset route of engines without the kcops admin API.
RESET_ROUTES = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}


class EngineAdmin:
    """Async client of one engine. ``adapter="auto"`` is resolved on first use."""

    def __init__(
        self,
        url: str | None,
        adapter: str = "auto",
        *,
        token: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.url = url.rstrip("/") if url else None
        self.adapter = adapter
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(timeout=timeout_s)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _need_url(self) -> str:
        if not self.url:
            raise ActionRejected("engine.url is not configured", "unsupported")
        return self.url

    async def resolve(self) -> str:
        """The adapter name; ``auto`` probes the kcops admin API, then SGLang, then vLLM."""
        if self.adapter != "auto":
            return self.adapter
        base = self._need_url()
        probes = (("kcops", "/admin/state"), ("sglang", "/get_server_info"), ("vllm", "/version"))
        for name, path in probes:
            try:
                resp = await self._client.get(base + path)
            except httpx.HTTPError:
                continue
            if resp.status_code == 200:
                self.adapter = name
                return name
        raise ActionRejected(f"cannot tell which engine answers at {base}", "unsupported")

    async def require_kcops(self, what: str) -> None:
        adapter = await self.resolve()
        if adapter != "kcops":
            raise ActionRejected(
                f"{what} needs the kcops admin API; engine is {adapter}", "unsupported"
            )

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One admin call; HTTP >= 400 raises ActionRejected (400) or RuntimeError."""
        base = self._need_url()
        resp = await self._client.request(method, base + path, json=body, headers=self._headers)
        if resp.status_code == 400:
            raise ActionRejected(f"{method} {path}: engine refused: {resp.text[:300]}", "refused")
        if resp.status_code >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text[:300]

    async def state(self) -> dict[str, Any]:
        await self.require_kcops("reading engine state")
        out = await self.call("GET", "/admin/state")
        if not isinstance(out, dict):
            raise RuntimeError(f"GET /admin/state: not a JSON object: {out!r}")
        return out

    async def evict(self, policy: str, fraction: float) -> dict[str, Any]:
        adapter = await self.resolve()
        if adapter == "kcops":
            out = await self.call(
                "POST", "/admin/cache/evict", {"policy": policy, "fraction": fraction}
            )
            return out if isinstance(out, dict) else {"response": out}
        route = RESET_ROUTES.get(adapter)
        if route is None:
            raise ActionRejected(f"engine {adapter} has no cache reset", "unsupported")
        # These engines reset the whole prefix cache, whatever the policy.
        await self.call("POST", route)
        return {"policy": "all", "route": route}

    async def set_route(self, mode: str) -> dict[str, Any]:
        await self.require_kcops("route switch")
        out = await self.call("POST", "/admin/route", {"mode": mode})
        return out if isinstance(out, dict) else {"response": out}

    async def set_topn(self, top_n: int) -> dict[str, Any]:
        await self.require_kcops("top-N change")
        out = await self.call("POST", "/admin/attention", {"top_n": top_n})
        return out if isinstance(out, dict) else {"response": out}

    async def drain(self, admit: bool) -> dict[str, Any] | None:
        """Stop (or resume) admitting; None when the engine has no drain endpoint."""
        try:
            adapter = await self.resolve()
        except ActionRejected:
            return None
        if adapter != "kcops":
            return None
        out = await self.call("POST", "/admin/drain", {"admit": admit})
        return out if isinstance(out, dict) else None
