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
from kcops.agent.promql.model import RuleError
from kcops.agent.rules.loader import load_rules
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
    # Values that reach YAML's typed constructors, then the models.
    "an impossible timestamp": b"agent: {tick_s: 2001-13-45}\ngroups: [{interval: 2001-02-30}]\n",
    "a 4400-digit integer": b"agent: {tick_s: 1" + b"0" * 4400 + b"}\n",
    "a 16000-bit hex integer": b"groups:\n- {name: g, limit: 0x" + b"f" * 4000 + b"}\n",
    "!!timestamp on text": b"agent: {tick_s: !!timestamp soon}\n",
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


# A valid document of each kind, then one node swapped for a hostile YAML value: what random
# bytes never reach (typed constructors, the models, the PromQL parser, templates).
RULES_DOC = {
    "params": {"t": 0.5, "w": "5m"},
    "groups": [
        {
            "name": "g",
            "interval": "30s",
            "rules": [
                {
                    "alert": "A",
                    "expr": "rate(x[${w}]) > ${t}",
                    "for": "1m",
                    "labels": {"severity": "page"},
                    "annotations": {"summary": "{{ $value }} above ${t}"},
                    "remediation": [
                        {"action": "evict_cache", "params": {"policy": "lru", "fraction": 0.5}},
                        {"action": "notify", "verify": "5m"},
                    ],
                },
                {"record": "job:x:rate5m", "expr": "sum by (job) (rate(x[5m]))"},
            ],
        }
    ],
}
CONFIG_DOC = {
    "agent": {"tick_s": 1, "listen": "127.0.0.1:9464"},
    "actions": {"mode": "dry-run", "guards": {"cooldown_s": "5m"}, "alertmanager_webhook": True},
    "collectors": {"nvml": {"enabled": "auto"}, "probe": {"enabled": True}},
    "rules": {"params": {"t": 0.5}},
}
HOSTILE_VALUES = [
    "2001-13-45", "2001-01-01", "1e999", ".nan", "-.inf", "[1, 2]", "{a: 1}", "null", "~", "''",
    "true", "'false'", "'yes'", "0x" + "f" * 300, "1" + "0" * 5000, "'" + "x" * 10_000 + "'",
    "'${nope}'", "'${t}${t}'", "'" + "(" * 3000 + "'", "'" + "-" * 3000 + "1'",
    "'" + "+".join(["1"] * 3000) + "'", "'{{ " + "(" * 2000 + "'", "!!binary aGVsbG8=",
    "!!timestamp x", "'1e999'", "'293y'", "'1.5m'", "-1", "0", "'\\ud800'", "!!set {a}",
]  # fmt: skip


def _paths(node: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [path] if path else []
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for k, v in items:
        out += _paths(v, (*path, k))
    return out


def _swapped(doc: dict, path: tuple[object, ...], value: str) -> str:  # type: ignore[type-arg]
    import copy

    import yaml

    d = copy.deepcopy(doc)
    node = d
    for k in path[:-1]:
        node = node[k]  # type: ignore[index]
    node[path[-1]] = "__HOSTILE__"  # type: ignore[index]
    return yaml.safe_dump(d, width=10**9).replace("__HOSTILE__", value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_paths(RULES_DOC)),
    st.sampled_from(_paths(CONFIG_DOC)),
    st.sampled_from(HOSTILE_VALUES),
)
def test_hostile_typed_values_give_one_typed_line(
    tmp_path_factory: pytest.TempPathFactory,
    rules_path: tuple[object, ...],
    config_path: tuple[object, ...],
    value: str,
) -> None:
    folder = tmp_path_factory.mktemp("sw")
    for doc, path, load in (
        (RULES_DOC, rules_path, load_rules),
        (CONFIG_DOC, config_path, load_config),
    ):
        f = folder / "f.yaml"
        f.write_text(_swapped(doc, path, value))
        try:
            load(f)
        except ConfigError as exc:  # RuleError is one
            msg = str(exc)
            assert "\n" not in msg and len(msg) < 600, msg
