from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kcops.agent.collectors import build, tick_histogram
from kcops.agent.config import parse_config
from kcops.agent.store import Store
from kcops.errors import ConfigError


def built(data: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Collector names, and the attributes build() added to the context (none: no
    service registry, dependencies are passed in)."""
    ctx = SimpleNamespace(config=parse_config(data), store=Store())
    before = set(vars(ctx))
    cs = build(ctx, tick_histogram())  # type: ignore[arg-type]
    return [c.name for c in cs], {k: v for k, v in vars(ctx).items() if k not in before}


def test_defaults_without_an_engine() -> None:
    names, services = built({})
    assert names == ["self", "probe", "nvml"]
    assert services == {}  # no service registry: dependencies are passed in


def test_engine_url_with_auto_adapter_enables_everything() -> None:
    names, services = built({"engine": {"url": "http://127.0.0.1:8000"}})
    assert names == [
        "self",
        "probe",
        "nvml",
        "process",
        "engine_events",
        "device_memory_cpu",
        "engine_scrape",
        "engine_health",
    ]
    assert services == {}


def test_with_an_engine_the_stall_watch_runs_between_scrape_and_health() -> None:
    from kcops.agent.engine import Engine

    cfg = parse_config({"engine": {"url": "http://127.0.0.1:8000"}})
    ctx = SimpleNamespace(config=cfg, store=Store())
    names = [c.name for c in build(ctx, tick_histogram(), Engine(cfg.engine.url))]  # type: ignore[arg-type]
    assert names[-3:] == ["engine_scrape", "engine_progress", "engine_health"]


def test_vllm_by_url_only_has_no_process_collectors() -> None:
    names, _ = built({"engine": {"url": "http://127.0.0.1:8000", "adapter": "vllm"}})
    assert "process" not in names and "engine_scrape" in names


def test_pid_or_command_enables_process_collectors() -> None:
    assert "process" in built({"engine": {"pid": 123}})[0]
    assert "device_memory_cpu" in built({"engine": {"command": ["kcops", "serve"]}})[0]


def test_switches() -> None:
    names, _ = built(
        {
            "collectors": {
                "probe": {"enabled": False},
                "nvml": {"enabled": "off"},
                "process": {"enabled": "on"},
            }
        }
    )
    assert names == ["self", "process", "engine_events"]
    with pytest.raises(ConfigError, match=r"needs engine\.url"):
        built({"collectors": {"scrape": {"enabled": "on"}}})


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"collectors": {"nvml": {"bogus": 1}}}, "unknown key"),
        ({"collectors": {"nvml": {"process_interval_s": 0.1}}}, "process_interval_s"),
        ({"collectors": {"probe": {"max_processes": 0}}}, "max_processes"),
        ({"collectors": {"nvml": {"enabled": "maybe"}}}, "enabled"),
        ({"engine": {"url": "127.0.0.1:8000"}}, "http://"),
        ({"engine": {"metrics_path": "metrics"}}, "starting with '/'"),
        ({"engine": {"timeout_s": 0}}, "timeout_s"),
    ],
)
def test_bad_config_is_refused_naming_the_field(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_config(data)
