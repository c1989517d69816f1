"""Structure the code keeps: short functions, no agent <-> worker imports, no service registry."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = ("agent", "kernels", "worker", "dashboards", "alerts", "runbooks", "kcops/cli")
MAX_FUNCTION_LINES = 80


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


def test_no_production_function_is_longer_than_80_lines() -> None:
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these functions:\n" + "\n".join(long)


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
