"""Regex matchers judged by the real promtool 2.42: what it accepts, and what each matches.

Every form below goes through kcops's whole path (parse_expr, the placeholder
re-parse for what promql-parser's Rust check refuses, RE2) and through
promtool. Two promtool runs in all: ``check rules`` over one rule per form
(accepted or refused must agree), and ``test rules`` with one
``promql_expr_test`` per accepted form and operator, whose expected samples
are kcops's answers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kcops.agent.promql.evaluator import Evaluator
from kcops.agent.promql.literals import quote
from kcops.agent.promql.model import RuleError
from kcops.agent.promql.parse import parse_expr
from kcops.agent.rules.promtest import series_key
from kcops.agent.store import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed"),
]

# Regexes as Go sees them (the value of the PromQL literal).
FORMS = [
    # promql-parser's Rust check refuses these; Go's RE2 syntax allows them.
    r"[\w-.]+",
    r"[\d-z]",
    r"a\056c",
    r"\141bc",
    r"\0",
    r"[[]",
    r"\Q.\E",
    r"(?i)\Qprod\E.*",
    r"(?i)\w{1000}|a",
    r"[[]a-]+|\Q]\E",
    # RE2 semantics that Python's re lacks.
    r"((?i)PRO).*",
    r"[[:alpha:]]+",
    r"a\z",
    r"(?i)k",
    r"\pL+",
    r"(?U)a.*c",
    r"[^[:space:]]+",
    r"(?s).b",
    r"a.b",
    r"\Aa",
    r"(?P<x1>a)bc",
    r"[(?<]",
    r"\Q(?<x>\E",
    r"\Q\C\E",
    # Refused by Go and by kcops.
    r"(?P<é>a)",
    r"(?P<>a)",
    r"(?P<a-b>a)",
    r"(?<x>a)",
    r"(?<=a)b",
    r"[\C]",
    r"\C",
    r"a**",
    r"(a{31}){33}",
    r"x{1001}",
    r"[[:foo:]]",
    r"\8",
    r"\Z",
    r"a(?=b)",
    r"\p{Foo}",
]
# Go accepts these; RE2 needs more than its 8 MiB program limit (docs/rules.md).
KNOWN_REFUSED = {r"\pL{1000}": "pattern too large"}

VALUES = [
    "",
    "a",
    "A",
    "abc",
    "ABC",
    "a.c",
    "aXc",
    "host-1.example",
    "a b",
    "-",
    "5",
    "z",
    "[",
    "]",
    "\x00",
    ".",
    "prod",
    "PROD-1",
    "é",
    "\u212a",  # KELVIN SIGN: (?i)k matches it in Go
    "k",
    "a\nb",
    "\\",
    "_",
    "(?<",
    "(?<x>",
    "\\C",
    "a" * 1000,
]


def _rule_file(path: Path, forms: list[str]) -> None:
    rules = [{"alert": f"R{i}", "expr": f"x{{v=~{quote(r)}}}"} for i, r in enumerate(forms)]
    path.write_text(json.dumps({"groups": [{"name": "re", "rules": rules}]}))


def _kcops_accepts(regex: str) -> bool:
    try:
        parse_expr(f"x{{v=~{quote(regex)}}}")
    except RuleError:
        return False
    return True


def test_promtool_and_kcops_accept_and_refuse_the_same_regexes(tmp_path: Path) -> None:
    forms = FORMS + list(KNOWN_REFUSED)
    _rule_file(tmp_path / "rules.yaml", forms)
    proc = subprocess.run(
        ["promtool", "check", "rules", "rules.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    refused = {int(n) for n in re.findall(r'"R(\d+)": could not parse', proc.stdout + proc.stderr)}
    promtool = {r: i not in refused for i, r in enumerate(forms)}
    assert not promtool[FORMS[-1]] and promtool[FORMS[0]], proc.stdout + proc.stderr
    kcops = {r: _kcops_accepts(r) for r in FORMS}
    assert {r: kcops[r] for r in FORMS} == {r: promtool[r] for r in FORMS}
    for regex, reason in KNOWN_REFUSED.items():
        assert promtool[regex]
        with pytest.raises(RuleError, match=reason):
            parse_expr(f"x{{v=~{quote(regex)}}}")


def _store() -> tuple[Store, list[dict[str, str]]]:
    store = Store(retention_s=1e9)
    series = []
    for i, v in enumerate(VALUES):
        text = f"x{{i={quote(str(i))},v={quote(v)}}}"
        store.append(series_key(text), 0.0, 1.0)
        series.append({"series": text, "values": "1"})
    return store, series


def _samples(store: Store, expr: str) -> list[dict[str, object]]:
    out = Evaluator(store).run(parse_expr(expr), 0.0)
    assert isinstance(out, list)
    samples: list[dict[str, object]] = []
    for e in out:
        labels = dict(e.labels)
        name = labels.pop("__name__", "")
        body = ",".join(f"{k}={quote(v)}" for k, v in sorted(labels.items()))
        samples.append({"labels": f"{name}{{{body}}}", "value": e.value})
    return samples


def test_each_regex_matches_what_promtool_matches(tmp_path: Path) -> None:
    store, series = _store()
    tests = []
    for regex in (r for r in FORMS if _kcops_accepts(r)):
        lit = quote(regex)
        for expr in (
            f"x{{v=~{lit}}}",
            f"x{{v!~{lit}}}",
            f'label_replace(x, "m", "<$0|${{1}}>", "v", {lit})',
        ):
            tests.append({"expr": expr, "eval_time": "0s", "exp_samples": _samples(store, expr)})
    matched = sum(len(t["exp_samples"]) for t in tests[::3])
    assert matched > len(tests) // 3  # the regexes do match something
    # A raw (backquoted) regex is the same regex.
    raw = "x{v=~`[\\w-.]+\\.example`}"
    tests.append({"expr": raw, "eval_time": "0s", "exp_samples": _samples(store, raw)})
    assert len(tests[-1]["exp_samples"]) == 1
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    (tmp_path / "t.yaml").write_text(json.dumps(doc))
    proc = subprocess.run(
        ["promtool", "test", "rules", "t.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
