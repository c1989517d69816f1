"""The engine container's last log lines (``get pods/log``) through kubernetes_asyncio's
real request path, against the stand-in API server that enforces the shipped Role."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

pytest.importorskip("kubernetes_asyncio", reason="pip install 'kcops[kubernetes]'")

from kcops.agent.actions.kube import LOG_BYTES, KubeClient, KubeError
from kcops.agent.config.actions import KubernetesSection
from tests.unit.kube.apiserver import ApiServer
from tests.unit.kube.test_kube_client import NS, kube_section

POD = "llm-serving-7d9f-abcde"
LOG_PATH = f"/api/v1/namespaces/{NS}/pods/{POD}/log"
# A vLLM engine's last words, one of them a JSON document (the raw text must come back).
ENGINE_LOG = (
    "INFO 12-07 04:35:12 [core.py:72] Initializing a V1 LLM engine\n"
    '{"level": "warning", "msg": "no progress"}\n'
    "ERROR 12-07 04:35:40 [core.py:410] EngineCore hung\n"
)


@dataclass
class LogServer(ApiServer):
    """The stand-in server, answering a container's log as the API server does:
    text/plain, ``tailLines`` and ``limitBytes`` honoured, 400 for an unknown container."""

    logs: dict[str, str] = field(default_factory=dict)

    async def handle(self, request: web.Request) -> web.Response:
        resp = await super().handle(request)  # the token, the Role and the pod's existence
        if request.path != LOG_PATH or resp.status != 200:
            return resp
        container = request.query.get("container", "")
        if container not in self.logs:
            msg = f"container {container} is not valid for pod {POD}"
            return self.status(400, "BadRequest", msg)
        lines = self.logs[container].splitlines(keepends=True)
        text = "".join(lines[-int(request.query.get("tailLines", len(lines))) :])
        limit = int(request.query.get("limitBytes", len(text)))
        return web.Response(text=text[:limit], content_type="text/plain")


def with_logs(
    tmp_path: Path,
    rules: list[dict[str, object]] | None,
    test: Callable[[KubeClient], Awaitable[None]],
    log: str = ENGINE_LOG,
) -> LogServer:
    async def main() -> LogServer:
        token = tmp_path / "token"
        token.write_text("sa-token-1\n")
        api = LogServer(token="sa-token-1", logs={"engine": log})
        if rules is not None:
            api.rules = rules
        api.put(LOG_PATH, {"kind": "Pod"})  # the pod exists: its log subresource answers
        url = await api.start()
        kube = KubeClient(KubernetesSection.model_validate(kube_section(url, token)))
        try:
            await test(kube)
        finally:
            await kube.close()
            await api.stop()
        return api

    return asyncio.run(main())


def test_the_engine_containers_last_lines_with_the_shipped_role(tmp_path: Path) -> None:
    async def body(kube: KubeClient) -> None:
        assert kube.cfg.engine_container == "engine"  # deploy/'s container name
        lines = await kube.container_log(kube.cfg.engine_container, 2)
        assert lines == [
            '{"level": "warning", "msg": "no progress"}',
            "ERROR 12-07 04:35:40 [core.py:410] EngineCore hung",
        ]

    api = with_logs(tmp_path, None, body)
    (req,) = api.requests
    assert (req.verb, req.path) == ("GET", LOG_PATH)


def test_a_role_without_pods_log_is_a_403_the_caller_can_name(tmp_path: Path) -> None:
    async def body(kube: KubeClient) -> None:
        with pytest.raises(KubeError) as err:
            await kube.container_log("engine", 200)
        assert err.value.status == 403 and "pods/log" in str(err.value)

    with_logs(tmp_path, [], body)


def test_an_unknown_container_and_no_answer_carry_their_status(tmp_path: Path) -> None:
    async def body(kube: KubeClient) -> None:
        with pytest.raises(KubeError) as err:
            await kube.container_log("vllm", 200)
        assert err.value.status == 400 and "not valid" in str(err.value)
        kube.cfg = kube.cfg.model_copy(update={"api_url": "http://127.0.0.1:9", "timeout_s": 1})
        kube._api = None
        with pytest.raises(KubeError) as err:
            await kube.container_log("engine", 200)
        assert err.value.status == 0

    with_logs(tmp_path, None, body)


def test_the_tail_is_bounded_in_bytes(tmp_path: Path) -> None:
    async def body(kube: KubeClient) -> None:
        lines = await kube.container_log("engine", 10_000)
        assert len(lines) > 100 and len("\n".join(lines)) <= LOG_BYTES

    with_logs(tmp_path, None, body, log=("y" * 99 + "\n") * 5000)


@pytest.mark.parametrize(("rules", "first"), [(None, "INFO 12-07"), ([], "# not captured: RBAC")])
def test_an_incident_keeps_the_engine_containers_log_or_says_why_not(
    tmp_path: Path, rules: list[dict[str, object]] | None, first: str
) -> None:
    """A sidecar's incident record: the engine's log through the API, or the reason."""
    from kcops.agent.config import parse_config
    from kcops.agent.incidents.output import engine_output

    async def body(kube: KubeClient) -> None:
        section = kube.cfg.model_dump(mode="json")
        cfg = parse_config({"actions": {"restart": {"mode": "kubernetes"}, "kubernetes": section}})
        lines = await engine_output(cfg, None)(2.0)
        assert lines[0].startswith(first), lines

    with_logs(tmp_path, rules, body)
