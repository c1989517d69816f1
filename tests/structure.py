"""Structure figures of the tree: module sizes, `Any` density (kernels/ on its own too),
functions over 60 lines, untyped dicts at module boundaries, and the tests' wait helpers
and fixed sleeps.

    PYTHONPATH=. .venv/bin/python -m tests.structure [--check]

Every figure is read from the code's AST, so a string that happens to contain
"Any" or "sleep(" is not counted. With --check the command exits 1 when a
figure is over its goal (issue 23's acceptance lines), naming which.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Code outside tests: what ships, in the sidecar's wheel and in the lab's and the demo's.
SHIPPED = ("agent", "kernels", "worker", "kcops", "dashboards", "alerts", "lab", "demo")
# Folders inside those that hold tests or generated data, not code.
NOT_CODE = ("alerts/tests",)
MAX_AGENT_MODULE_LINES = 400
MAX_ANY_PER_1000 = 8.0
# Functions (def to its last line) over LONG_FUNCTION_LINES: at most MAX_LONG_FUNCTIONS in
# the production code (LONG_FUNCTION_FOLDERS); the lab's and the demo's are listed too.
LONG_FUNCTION_LINES = 60
MAX_LONG_FUNCTIONS = 7
LONG_FUNCTION_FOLDERS = ("agent", "kcops", "kernels", "worker")
BOUNDARY_PACKAGES = ("agent/actions", "agent/rules")
SHARED_WAIT_MODULE = "tests/services.py"
MAX_FIXED_SLEEP_S = 1.0


def _py_files(folder: str) -> Iterator[Path]:
    base = ROOT / folder
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        # kcops/agent etc. are symlinks to the top-level folders: count each file once.
        if folder == "kcops" and path.resolve().parent != (ROOT / rel).parent.resolve():
            continue
        if folder == "kcops" and any(
            rel.startswith(f"kcops/{s}/") for s in SHIPPED if s != "kcops"
        ):
            continue
        if any(rel.startswith(n + "/") for n in NOT_CODE):
            continue
        yield path


def _code_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def _any_uses(tree: ast.AST) -> int:
    """`Any` used as a name or as `typing.Any`; imports are not uses."""
    n = 0
    for node in ast.walk(tree):
        if (isinstance(node, ast.Name) and node.id == "Any") or (
            isinstance(node, ast.Attribute) and node.attr == "Any"
        ):
            n += 1
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "Any" in node.value
            and len(node.value) < 200
        ):
            # string annotations ("dict[str, Any]") count like written ones
            try:
                inner = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue
            n += _any_uses(inner)
    return n


def _annotation_text(node: ast.expr | None) -> str:
    return "" if node is None else ast.unparse(node)


def _untyped_dict(text: str) -> bool:
    compact = text.replace(" ", "")
    return any(f"{t}[str,Any]" in compact for t in ("dict", "Mapping", "MutableMapping", "Dict"))


def _public_boundary_dicts(tree: ast.Module, rel: str) -> list[str]:
    """Public functions and methods whose signature takes or returns dict[str, Any]."""
    found: list[str] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name.startswith("_"):
                    continue
                args = node.args
                annots = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                annots += [args.vararg.annotation if args.vararg else None]
                annots += [args.kwarg.annotation if args.kwarg else None]
                annots.append(node.returns)
                if any(_untyped_dict(_annotation_text(a)) for a in annots):
                    found.append(f"{rel}:{node.lineno} {prefix}{node.name}")

    visit(tree.body, "")
    return found


def _long_functions(tree: ast.Module, rel: str) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > LONG_FUNCTION_LINES:
                found.append((f"{rel}:{node.lineno} {node.name}", n))
    return found


def _is_sleep(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "sleep") or (
        isinstance(f, ast.Name) and f.id == "sleep"
    )


def _wait_helpers(tree: ast.Module, rel: str) -> list[str]:
    """Functions that poll: a loop that sleeps, named like a wait (not a test)."""
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if node.name.startswith("test_") or "wait" not in node.name.lower():
            continue
        loops = [n for n in ast.walk(node) if isinstance(n, ast.While | ast.For)]
        if any(isinstance(c, ast.Call) and _is_sleep(c) for lp in loops for c in ast.walk(lp)):
            found.append(f"{rel}:{node.lineno} {node.name}")
    return found


def _fixed_sleeps(tree: ast.Module, rel: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_sleep(node) and node.args:
            arg = node.args[0]
            if (
                isinstance(arg, ast.Constant)
                and isinstance(arg.value, int | float)
                and arg.value > MAX_FIXED_SLEEP_S
            ):
                found.append(f"{rel}:{node.lineno} sleep({arg.value})")
    return found


@dataclass
class Figures:
    code_lines: int = 0
    any_uses: int = 0
    any_by_folder: dict[str, tuple[int, int]] = field(default_factory=dict)
    big_agent_modules: list[str] = field(default_factory=list)
    long_functions: list[tuple[str, int]] = field(default_factory=list)
    boundary_dicts: list[str] = field(default_factory=list)
    wait_helpers: list[str] = field(default_factory=list)
    fixed_sleeps: list[str] = field(default_factory=list)

    @property
    def any_per_1000(self) -> float:
        return 1000.0 * self.any_uses / max(1, self.code_lines)


def measure() -> Figures:
    fig = Figures()
    for folder in SHIPPED:
        uses = lines = 0
        for path in _py_files(folder):
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text, filename=rel)
            n_lines = _code_lines(text)
            lines += n_lines
            uses += _any_uses(tree)
            if rel.startswith("agent/"):
                total = len(text.splitlines())
                if total > MAX_AGENT_MODULE_LINES:
                    fig.big_agent_modules.append(f"{rel} {total}")
            if rel.startswith(BOUNDARY_PACKAGES):
                fig.boundary_dicts += _public_boundary_dicts(tree, rel)
            fig.long_functions += _long_functions(tree, rel)
        fig.any_by_folder[folder] = (uses, lines)
        fig.any_uses += uses
        fig.code_lines += lines
    for path in sorted((ROOT / "tests").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "tests/structure.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        if rel != SHARED_WAIT_MODULE:
            fig.wait_helpers += _wait_helpers(tree, rel)
        fig.fixed_sleeps += _fixed_sleeps(tree, rel)
    return fig


def report(fig: Figures) -> list[str]:
    """Print the figures; return the goals that are missed."""
    missed: list[str] = []
    print(
        f"Any outside tests: {fig.any_uses} uses in {fig.code_lines} code lines, "
        f"{fig.any_per_1000:.1f} per 1,000 (goal < {MAX_ANY_PER_1000:g})"
    )
    for folder, (uses, lines) in fig.any_by_folder.items():
        print(
            f"  {folder + '/':<12} {uses:>4} in {lines:>6} lines "
            f"({1000.0 * uses / max(1, lines):.1f} per 1,000)"
        )
    if fig.any_per_1000 >= MAX_ANY_PER_1000:
        missed.append("Any per 1,000 lines")
    k_uses, k_lines = fig.any_by_folder.get("kernels", (0, 1))
    if 1000.0 * k_uses / max(1, k_lines) > MAX_ANY_PER_1000:
        missed.append("Any per 1,000 lines in kernels/")
    production = [(f, n) for f, n in fig.long_functions if f.split("/")[0] in LONG_FUNCTION_FOLDERS]
    print(
        f"functions over {LONG_FUNCTION_LINES} lines in {', '.join(LONG_FUNCTION_FOLDERS)}: "
        f"{len(production)} (goal <= {MAX_LONG_FUNCTIONS}); lab and demo: "
        f"{len(fig.long_functions) - len(production)}"
    )
    for f, n in sorted(fig.long_functions, key=lambda x: -x[1]):
        print(f"  {f} ({n} lines)")
    if len(production) > MAX_LONG_FUNCTIONS:
        missed.append("functions over 60 lines")
    print(f"agent/ modules over {MAX_AGENT_MODULE_LINES} lines: {len(fig.big_agent_modules)}")
    for line in fig.big_agent_modules:
        print(f"  {line}")
    if fig.big_agent_modules:
        missed.append("agent/ module size")
    print(
        f"public signatures with dict[str, Any] in {', '.join(BOUNDARY_PACKAGES)}: "
        f"{len(fig.boundary_dicts)}"
    )
    for line in fig.boundary_dicts:
        print(f"  {line}")
    if fig.boundary_dicts:
        missed.append("dict[str, Any] at module boundaries")
    print(f"wait helpers in tests outside {SHARED_WAIT_MODULE}: {len(fig.wait_helpers)}")
    for line in fig.wait_helpers:
        print(f"  {line}")
    if fig.wait_helpers:
        missed.append("wait helpers")
    print(f"fixed sleeps over {MAX_FIXED_SLEEP_S:g} s in tests: {len(fig.fixed_sleeps)}")
    for line in fig.fixed_sleeps:
        print(f"  {line}")
    if fig.fixed_sleeps:
        missed.append("fixed sleeps")
    return missed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = ap.parse_args(argv)
    missed = report(measure())
    if args.check and missed:
        print("missed: " + "; ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
