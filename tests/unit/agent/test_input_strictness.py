"""Issue 24, classes 8 and 12: strict input, one line and exit 2 for every bad token,
parameter or file.

- YAML: a repeated key is refused naming it and both lines; only ``true``/``false`` are
  booleans (YAML 1.1's ``yes``/``on``/... are text, which a boolean field refuses).
- Tokens (file or environment, agent, worker, CLI): not UTF-8, or not visible ASCII.
- ``--param`` values JSON cannot carry, and every float flag of every command: no NaN/inf.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kcops.agent.config import load_config
from kcops.agent.rules.loader import load_rules
from kcops.agent.yamlload import parse_yaml
from kcops.auth import load_token
from kcops.cli import cli
from kcops.cli.common import parse_params
from kcops.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: 1\nb: 2\na: 3\n", "line 3, column 1: duplicate key 'a' (first at line 1)"),
        ("{a: 1, a: 2}", "duplicate key 'a' (first at line 1)"),
        ("x:\n  y: 1\n  z: 2\n  y: 1\n", "line 4, column 3: duplicate key 'y' (first at line 2)"),
        ("a: 1\n'a': 2\n", "duplicate key 'a'"),
        ("1: x\n1: y\n", "duplicate key 1"),
    ],
)
def test_duplicate_keys_are_refused_naming_the_key_and_lines(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_yaml(text, "f.yaml")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_duplicate_keys_in_config_and_rule_files(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("agent:\n  tick_s: 1\n  listen: 127.0.0.1:1\n  tick_s: 60\n")
    with pytest.raises(ConfigError, match=r"line 4, column 3: duplicate key 'tick_s'"):
        load_config(cfg)
    rules = tmp_path / "r.yaml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n"
        "    labels: {severity: page, severity: ticket}\n"
    )
    with pytest.raises(ConfigError, match=r"line 6, .*duplicate key 'severity'"):
        load_rules(rules)


def test_only_true_and_false_are_booleans() -> None:
    doc = parse_yaml("a: yes\nb: no\nc: on\nd: off\ne: y\nf: True\ng: true\nh: false\n", "t")
    assert doc == {
        "a": "yes", "b": "no", "c": "on", "d": "off", "e": "y", "f": "True", "g": True,
        "h": False,
    }  # fmt: skip


def test_yaml11_booleans_are_refused_by_boolean_fields(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("actions: {alertmanager_webhook: yes}\n")
    with pytest.raises(
        ConfigError, match=r"actions.alertmanager_webhook: must be true or false; got .yes."
    ):
        load_config(cfg)
    # a collector switch takes on/off as written
    cfg.write_text("collectors: {process: {enabled: on}, nvml: {enabled: off}}\n")
    c = load_config(cfg)
    assert (c.collectors.process.enabled, c.collectors.nvml.enabled) == ("on", "off")


# -- tokens --------------------------------------------------------------------

BAD_TOKENS = {
    "not UTF-8": (b"ab\xffcd", "not UTF-8 (byte 0xff at offset 2)"),
    "latin-1": ("s\xe9cret".encode("latin-1"), "not UTF-8"),
    "a control character": (b"ab\x01cd", "visible ASCII"),
    "a space inside": (b"ab cd", "visible ASCII"),
    "non-ASCII UTF-8": ("s\xe9cret".encode(), "visible ASCII"),
}


@pytest.mark.parametrize("name", sorted(BAD_TOKENS))
def test_bad_token_file_is_one_line(name: str, tmp_path: Path) -> None:
    raw, needle = BAD_TOKENS[name]
    f = tmp_path / "token"
    f.write_bytes(raw + b"\n")
    with pytest.raises(ConfigError) as err:
        load_token(f)
    assert needle in str(err.value) and str(f) in str(err.value)


@pytest.mark.parametrize("name", sorted(BAD_TOKENS))
def test_bad_token_in_the_environment_is_one_line(name: str) -> None:
    raw, needle = BAD_TOKENS[name]
    env = {"KCOPS_TOKEN": os.fsdecode(raw)}  # how os.environ hands over undecodable bytes
    with pytest.raises(ConfigError, match="KCOPS_TOKEN: ") as err:
        load_token(None, env)
    assert needle in str(err.value)


def test_good_tokens_still_load(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("  abc-DEF_123.~+/=  \n")
    assert load_token(f) == "abc-DEF_123.~+/="
    assert load_token(None, {"KCOPS_TOKEN": " t0k "}) == "t0k"
    assert load_token(None, {}) is None


def _kcops(args: list[str], env: dict[bytes, bytes] | None = None) -> tuple[int, str]:
    full = {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}
    full[b"PYTHONPATH"] = os.fsencode(str(REPO))
    full.pop(b"KCOPS_TOKEN", None)
    full.update(env or {})
    res = subprocess.run(
        [sys.executable, "-c", "from kcops.cli import main; main()", *args],
        capture_output=True,
        env=full,
        timeout=60,
    )
    return res.returncode, res.stderr.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["file", "env"])
@pytest.mark.parametrize(
    "command",
    [
        ["agent", "run", "--listen", "127.0.0.1:0"],
        ["agent", "check-config", "/dev/null"],
        ["serve", "--model", "tiny", "--port", "0"],
        ["actions", "run", "notify", "--agent", "http://127.0.0.1:9"],
    ],
    ids=["agent run", "check-config", "worker", "actions run"],
)
def test_non_utf8_token_is_exit_2_and_one_line_in_every_command(
    command: list[str], where: str, tmp_path: Path
) -> None:
    """Real processes, as the issue found them: a traceback in the agent and the worker."""
    env: dict[bytes, bytes] = {}
    args = [*command]
    if where == "file":
        (tmp_path / "tok").write_bytes(b"ab\xffcd\n")
        args += ["--token-file", str(tmp_path / "tok")]
    else:
        env[b"KCOPS_TOKEN"] = b"ab\xffcd"
    if command[:2] == ["agent", "run"]:
        args += ["--state-dir", str(tmp_path / "state")]
    code, err = _kcops(args, env)
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert "the token is not UTF-8 (byte 0xff at offset 2)" in err, err


def test_grafana_token_is_read_by_the_same_check(tmp_path: Path) -> None:
    f = tmp_path / "tok"
    f.write_bytes(b"\xff\xfe")
    res = CliRunner().invoke(
        cli, ["dashboards", "push", "--grafana-url", "http://127.0.0.1:9", "--token-file", str(f)]
    )
    assert res.exit_code == 2, res.output
    assert "not UTF-8" in res.output and res.output.count("\n") == 1


# -- params and number flags -----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (".nan", "nan is not a finite number"),
        (".inf", "inf is not a finite number"),
        ("-.Inf", "-inf is not a finite number"),
        ("1.0e+999", "inf is not a finite number"),
        ("[1, .nan]", "nan is not a finite number"),
        ("2024-01-01", "is a date"),
        ("2024-01-01T00:00:00Z", "is a datetime"),
        ("!!binary aGk=", "is a bytes"),
        ("!!set {a}", "is a set"),
        ("{1: a}", "is a dict"),
    ],
)
def test_params_json_cannot_carry_are_refused(value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match="--param 'fraction': ") as err:
        parse_params((f"fraction={value}",))
    assert needle in str(err.value)


def test_params_that_json_carries_pass() -> None:
    got = parse_params(("a=0.25", "b=false", "c=5m", "d=", "e=[1, x]", "f={k: 1}", "g=yes"))
    assert got == {"a": 0.25, "b": False, "c": "5m", "d": "", "e": [1, "x"], "f": {"k": 1},
                   "g": "yes"}  # fmt: skip


def test_actions_run_nan_param_is_exit_2() -> None:
    # No agent listens on port 9: the parameter is refused before any request.
    res = CliRunner().invoke(
        cli, ["actions", "run", "evict_cache", "--param", "fraction=.nan", "--agent",
              "http://127.0.0.1:9"],
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert res.output == "error: --param 'fraction': nan is not a finite number\n"


def _float_options() -> list[tuple[str, str]]:
    """(command path, option) for every float-typed option of every command."""
    ctx = click.Context(cli)
    out = []

    def walk(group: click.Group, prefix: list[str]) -> None:
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if isinstance(cmd, click.Group):
                walk(cmd, [*prefix, name])
            elif cmd is not None:
                for p in cmd.params:
                    if isinstance(p, click.Option) and isinstance(
                        p.type, click.types.FloatParamType
                    ):
                        out.append((" ".join([*prefix, name]), p.opts[0]))

    walk(cli, [])
    return out


FLOAT_OPTIONS = _float_options()


def test_float_options_are_found() -> None:
    assert ("serve", "--shadow-fraction") in FLOAT_OPTIONS
    assert ("top", "--refresh") in FLOAT_OPTIONS and len(FLOAT_OPTIONS) >= 7


@pytest.mark.parametrize(("command", "option"), FLOAT_OPTIONS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_float_flag_refuses_non_finite(command: str, option: str, value: str) -> None:
    group: click.Command = cli
    ctx = click.Context(cli)
    for part in command.split():
        assert isinstance(group, click.Group)
        group = group.get_command(ctx, part)  # type: ignore[assignment]
    with pytest.raises(click.BadParameter) as err:
        group.make_context(command, [option, value], resilient_parsing=False)
    assert "not a finite number" in str(err.value) or "not in the range" in str(err.value)
