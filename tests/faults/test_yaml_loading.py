"""Config and rule files from a bad day: alias bombs, deep nesting, bad bytes, fuzz.

Every one must end in exit 2 with one line on stderr, quickly, and never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcops.agent.config import load_config
from kcops.agent.rules.loader import load_rules
from kcops.agent.rules.model import RuleError
from kcops.agent.yamlload import MAX_DEPTH, parse_yaml
from kcops.cli import cli
from kcops.errors import ConfigError

ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
        for i in range(9)
    ]
)

HOSTILE: dict[str, bytes] = {
    "alias bomb under a typed field": (ALIAS_BOMB + "\nagent:\n  listen: *j\n").encode(),
    "alias in a rules label": (
        ALIAS_BOMB + "\ngroups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n"
        "    labels: {x: *j}\n"
    ).encode(),
    "deep nesting": b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "deep block nesting": "".join(f"{'  ' * i}k{i}:\n" for i in range(200)).encode(),
    "invalid utf-8": b"agent:\n  listen: \xff\xfe\n",
    "a lone surrogate escape": b'agent:\n  listen: "\\ud800"\n',
    "a huge value": b"agent:\n  listen: " + b"x" * 1_000_000 + b"\n",
    "not a mapping": b"- 1\n- 2\n",
    "tab indentation": b"agent:\n\tlisten: x\n",
}


def _run(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(cli, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_check_config_refuses_with_exit_2_and_one_line(name: str, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(HOSTILE[name])
    code, out = _run(["agent", "check-config", str(path)])
    assert code == 2, out
    assert "Traceback" not in out
    assert len(out) < 600, out  # a short excerpt, never the whole value
    assert out.count("\n") <= 2


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_alerts_check_refuses_with_exit_2_and_one_line(name: str, tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(HOSTILE[name])
    code, out = _run(["alerts", "check", str(path)])
    assert code == 2, out
    assert "Traceback" not in out
    assert len(out) < 600, out


def test_depth_bound_allows_ordinary_nesting() -> None:
    assert parse_yaml("a: " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2), "t") is not None
    with pytest.raises(ConfigError, match="nested deeper"):
        parse_yaml("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "t")


def test_anchors_are_refused_with_the_line() -> None:
    with pytest.raises(ConfigError, match="line 1, column 4: anchors and aliases"):
        parse_yaml("a: &x 1\nb: *x\n", "t")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_fuzz_loaders_raise_only_typed_errors(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("fz") / "f.yaml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as exc:
        assert "\n" not in str(exc).strip() or str(exc).startswith(str(path))
    try:
        load_rules(path)
    except RuleError:
        pass
    except ConfigError:
        pass
