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
