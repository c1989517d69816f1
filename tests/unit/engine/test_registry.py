"""The built-in engine kinds, and everything that reads the registry for its names."""

from __future__ import annotations

import pytest

from kcops.agent.config import parse_config
from kcops.agent.engine.kinds import Capabilities, builtin_kinds
from kcops.agent.engine.kinds.kind import EVICT_POLICIES
from kcops.errors import ConfigError


def test_builtin_kinds_capabilities_follow_from_their_routes() -> None:
    caps = {k.name: k.capabilities for k in builtin_kinds()}
    assert caps == {
        # The reference worker has the whole admin API.
        "kcops": Capabilities(
            evict=frozenset(EVICT_POLICIES), drain=True, route=True, topn=True, state=True
        ),
        # A whole-cache reset; vLLM may also drop running requests' blocks (pause: probed).
        "vllm": Capabilities(evict=frozenset({"all"}), drop_running=True),
        "sglang": Capabilities(evict=frozenset({"all"})),
        "tgi": Capabilities(),
        "triton": Capabilities(),
    }


def test_detection_order_and_probes() -> None:
    reg = builtin_kinds()
    assert reg.names() == ("kcops", "sglang", "vllm", "tgi", "triton")
    assert [(k.name, p) for k, p in reg.probes()] == [
        ("kcops", "/admin/state"),
        ("sglang", "/get_server_info"),
        ("vllm", "/version"),
    ]
    assert reg.sigterm_drain_s(["vllm", "serve", "m", "--shutdown-timeout=30"]) == 30
    assert reg.sigterm_drain_s(["python", "-m", "sglang.launch_server"]) is None


def test_config_and_cli_accept_exactly_the_registry_kinds() -> None:
    from kcops.cli.agent_cmd import ADAPTERS

    assert tuple(ADAPTERS) == builtin_kinds().choices()
    for name in builtin_kinds().choices():
        assert parse_config({"engine": {"adapter": name}}, "<t>").engine.adapter == name
    # The configuration knows no engine kind (it stands below the engine in the agent's
    # layers): preflight, where the two meet, refuses a name the registry lacks.
    from kcops.agent.preflight import preflight

    unknown = parse_config({"engine": {"adapter": "ollama"}}, "<t>")
    with pytest.raises(ConfigError, match="unknown engine kind 'ollama'; allowed: auto, kcops"):
        preflight(unknown, token="t")
    with pytest.raises(ConfigError, match=r"engine\.adapter"):
        parse_config({"engine": {"adapter": "Not a kind!"}}, "<t>")


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (["vllm", "serve", "Qwen/Qwen3-0.6B", "--shutdown-timeout", "30"], "vllm"),
        (["/usr/bin/python3", "-u", "-m", "vllm.entrypoints.openai.api_server"], "vllm"),
        (["python", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
        (["/opt/venv/bin/kcops", "serve", "--model", "tiny"], "kcops"),
        (["text-generation-launcher", "--model-id", "m"], "tgi"),
        (["tritonserver", "--model-repository", "/models"], "triton"),
        (["bash", "run-vllm.sh"], None),  # a wrapper script: /metrics or the probe decide
        (["python", "serve.py", "-m", "vllm"], None),  # -m of the script, not python's
        ([], None),
    ],
)
def test_detection_by_command_line(argv: list[str], kind: str | None) -> None:
    found = builtin_kinds().detect_command(argv)
    assert (found.name if found is not None else None) == kind


def test_a_supervised_engine_is_known_from_its_command() -> None:
    from kcops.agent.config.actions import RestartSection
    from kcops.agent.engine import Engine
    from kcops.agent.engine.supervisor import Supervisor

    cfg = RestartSection()
    auto = Engine("http://127.0.0.1:1", "auto")
    Supervisor(["vllm", "serve", "m"], cfg, clock=lambda: 0.0, engine=auto)
    assert auto.adapter == "vllm"
    configured = Engine("http://127.0.0.1:1", "kcops")  # what is configured wins
    Supervisor(["vllm", "serve", "m"], cfg, clock=lambda: 0.0, engine=configured)
    assert configured.adapter == "kcops"
    wrapped = Engine("http://127.0.0.1:1", "auto")
    Supervisor(["bash", "run.sh"], cfg, clock=lambda: 0.0, engine=wrapped)
    assert wrapped.adapter is None
