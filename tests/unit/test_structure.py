"""Structure the code keeps: the gate `make lint` runs (tests/structure.py) fails on what it
should, no agent <-> worker imports, one class per name."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from tests import structure

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = ("agent", "kernels", "worker", "dashboards", "alerts", "runbooks", "kcops/cli")


def _modules() -> list[Path]:
    files = [p for d in PRODUCTION for p in (REPO / d).rglob("*.py")]
    return files + sorted((REPO / "kcops").glob("*.py"))


def _imports(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            # `from pkg import mod` counts as importing pkg.mod
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A git checkout at ``root`` tracking ``files`` (path -> text)."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(cmd, cwd=root, check=True)
    return root


def _function(lines: int) -> str:
    return "def f() -> None:\n" + "    pass\n" * (lines - 1)


def _fails(root: Path, *named: str) -> None:
    failures = structure.check(root)[1]
    for name in named:
        assert any(name in f for f in failures), (name, failures)
    assert structure.main(["--root", str(root)]) == 1


def test_the_gate_fails_on_an_agent_module_over_400_lines(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"agent/big.py": "x = 1\n" * 401, "agent/ok.py": "x = 1\n" * 400})
    _fails(root, "agent/big.py: 401 lines (agent module limit 400)")
    assert not any("agent/ok.py" in f for f in structure.check(root)[1])


def test_the_gate_fails_on_a_function_over_60_lines(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"worker/w.py": _function(61) + "\n\n" + _function(60)})
    assert structure.check(root)[1] == ["worker/w.py:1 f: 61 lines (function limit 60)"]
    _fails(root, "worker/w.py:1 f")


def test_the_gate_fails_on_any_over_8_per_1000_lines(tmp_path: Path) -> None:
    text = "from typing import Any\n\nx: Any = 1\n" + "y = 2\n" * 100
    _fails(_tree(tmp_path, {"lab/l.py": text}), "lab/: Any 9.8 per 1,000 code lines")


def test_the_gate_counts_tracked_source_lines_against_the_written_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(structure, "MAX_SOURCE_LINES", 100)
    root = _tree(tmp_path, {"dashboards/d.json": "{}\n" * 100})
    # Untracked files and symlinks are not counted: the tree is still at the limit.
    (root / "dashboards/scratch.txt").write_text("\n" * 1000)
    (root / "kcops").mkdir()
    (root / "kcops/dashboards").symlink_to("../dashboards")
    subprocess.run(["git", "add", "kcops/dashboards"], cwd=root, check=True)
    assert structure.check(root)[1] == []
    (root / "dashboards/d.json").write_text("{}\n" * 101)
    _fails(root, "source lines: 101 (limit MAX_SOURCE_LINES = 100")


def test_agent_and_worker_do_not_import_each_other() -> None:
    for folder, other in (("agent", "kcops.worker"), ("worker", "kcops.agent")):
        for path in (REPO / folder).rglob("*.py"):
            bad = {m for m in _imports(ast.parse(path.read_text())) if m.startswith(other)}
            assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_the_agent_imports_only_the_wire_format_of_kernels() -> None:
    for path in (REPO / "agent").rglob("*.py"):
        mods = _imports(ast.parse(path.read_text()))
        kernels = {m for m in mods if m.startswith("kcops.kernels")}
        assert all(m.startswith("kcops.kernels.wire") for m in kernels), (
            f"{path.relative_to(REPO)}: {sorted(kernels)}"
        )


def test_no_two_top_level_classes_share_a_name() -> None:
    """One name, one concept: a class name means one thing across agent, kcops, kernels and
    worker (two ``Coverage``s and two ``Shape``s once read as one)."""
    seen: dict[str, list[str]] = {}
    for path in _modules():
        if path.is_relative_to(REPO / "dashboards") or path.is_relative_to(REPO / "alerts"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(str(path.relative_to(REPO)))
    twice = {name: where for name, where in seen.items() if len(where) > 1}
    assert not twice, twice
