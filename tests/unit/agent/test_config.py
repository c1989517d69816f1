"""Configuration: defaults, and each kind of bad input refused with the key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcops.agent.config import Config, load_config, parse_config
from kcops.errors import ConfigError


def test_defaults_are_useful() -> None:
    cfg = load_config(None)
    assert cfg.agent.listen == "127.0.0.1:9464"
    assert cfg.agent.tick_s == 1.0
    assert cfg.actions.mode == "dry-run"
    assert isinstance(cfg, Config)


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("")
    assert load_config(p).agent.tick_s == 1.0


def test_wrong_type_names_field_and_value(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("agent:\n  tick_s: fast\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert "agent.tick_s" in msg and "'fast'" in msg and str(p) in msg


def test_unknown_key_lists_allowed_keys() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"agent": {"tik_s": 1}})
    msg = str(ei.value)
    assert "agent.tik_s" in msg and "unknown key" in msg and "tick_s" in msg


def test_unknown_top_level_section() -> None:
    with pytest.raises(ConfigError, match="agnet: unknown key"):
        parse_config({"agnet": {}})


def test_out_of_range_interval() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"agent": {"tick_s": 0.001}})
    assert "agent.tick_s" in str(ei.value) and "greater than or equal to 0.05" in str(ei.value)


def test_bad_listen_and_enum() -> None:
    with pytest.raises(ConfigError, match=r"agent\.listen"):
        parse_config({"agent": {"listen": "nohost"}})
    with pytest.raises(ConfigError, match=r"actions\.mode"):
        parse_config({"actions": {"mode": "yolo"}})


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("agent: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    p.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(p)


@pytest.mark.parametrize(
    "data",
    [
        {"actions": {"alertmanager_webhook": "yes"}},
        {"rules": {"enabled": "false"}},
        {"collectors": {"self_metrics": 1}},
        {"exporters": {"otlp": {"metrics": "true"}}},
        {"actions": {"scale": {"hpa_reads_gauge": "on"}}},
    ],
)
def test_booleans_are_strict(data: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match="must be true or false; got"):
        parse_config(data)


def test_yaml_booleans_and_switches_read_as_written(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(
        "rules: {enabled: false}\ncollectors: {nvml: {enabled: off}, process: {enabled: on}}\n"
    )
    cfg = load_config(p)
    assert cfg.rules.enabled is False
    assert (cfg.collectors.nvml.enabled, cfg.collectors.process.enabled) == ("off", "on")
    # Booleans are true/false only (issue 24, class 12): YAML 1.1's yes/no/on/off are text.
    for word in ("no", "yes", "on", "off", "n", "Y", "False", "TRUE"):
        p.write_text(f"rules: {{enabled: {word}}}\n")
        with pytest.raises(
            ConfigError, match=f"rules.enabled: must be true or false; got '{word}'"
        ):
            load_config(p)


def test_lengths_of_time_take_numbers_or_prometheus_durations() -> None:
    cfg = parse_config(
        {
            "agent": {"tick_s": "500ms"},
            "actions": {"guards": {"cooldown_s": "5m", "cooldown_overrides_s": {"notify": "1h"}}},
            "engine": {"timeout_s": 0.25},
        }
    )
    assert cfg.agent.tick_s == 0.5 and cfg.engine.timeout_s == 0.25
    assert cfg.actions.guards.cooldown_s == 300.0
    assert cfg.actions.guards.cooldown_overrides_s == {"notify": 3600.0}
    for bad, needle in (
        ("1.5m", "not a duration: '1.5m'"),
        ("293y", "out of range"),
        (float("inf"), "finite"),
        (-1, ">= 0"),
        (True, "boolean"),
    ):
        with pytest.raises(ConfigError, match=f"actions.guards.cooldown_s: .*{needle}"):
            parse_config({"actions": {"guards": {"cooldown_s": bad}}})
    with pytest.raises(ConfigError, match="less than or equal to 60"):
        parse_config({"agent": {"tick_s": "2m"}})


def test_rule_params_must_be_finite_numbers_or_strings() -> None:
    for bad in (float("nan"), {"a": 1}, True):
        with pytest.raises(ConfigError, match=r"rules\.params\.x: a parameter must be"):
            parse_config({"rules": {"params": {"x": bad}}})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "agent: {tick_s: 2001-13-45}\n",
            "line 1, column 17: not a valid !!timestamp '2001-13-45'",
        ),
        ("agent: {tick_s: 1" + "0" * 5000 + "}\n", "more than 4300 digits"),
        ("agent: {tick_s: 0x" + "f" * 4000 + "}\n", "integer out of range"),
        ("agent: {tick_s: !!float abc}\n", "not a valid !!float 'abc'"),
        ("agent:\n  ? " + "k" * 200_000 + "\n  : 1\n", "agent.kkkk"),
        ("agent: {tick_s: x, listen: y}\nstore: {max_series: 1}\n", "(and 2 more problems)"),
    ],
)
def test_every_bad_file_is_one_short_line(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg and len(msg) < 400, msg
