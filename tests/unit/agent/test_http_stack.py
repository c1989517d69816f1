"""An agent that does not export pays for no OTLP: its modules load no SDK exporter,
no protobuf and no second HTTP stack (its own HTTP is aiohttp's)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("httpx", "requests", "opentelemetry.sdk", "opentelemetry.exporter", "google.protobuf")


def loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    mods = json.loads(out.stdout.splitlines()[-1])
    return [m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_an_agent_without_otlp_loads_no_exporter_nor_second_http_stack() -> None:
    code = (
        "from kcops.agent.app import Agent\n"
        "from kcops.agent.config import parse_config\n"
        "from kcops.agent.telemetry import build_tracer_provider\n"
        "import kcops.agent.actions.notify\n"
        "build_tracer_provider(parse_config({}).exporters.otlp)"
    )
    assert loaded_after(code) == []


def test_an_exporting_agent_loads_the_sdk_exporters() -> None:
    code = (
        "from kcops.agent.config import parse_config\n"
        "from kcops.agent.telemetry import build_tracer_provider\n"
        "cfg = parse_config({'exporters': {'otlp': {'endpoint': 'http://127.0.0.1:9'}}})\n"
        "build_tracer_provider(cfg.exporters.otlp).shutdown()"
    )
    loaded = loaded_after(code)
    assert "opentelemetry.exporter.otlp.proto.http.trace_exporter" in loaded
    assert "opentelemetry.sdk.resources" in loaded
