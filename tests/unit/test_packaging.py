"""Packaging invariants: every package folder is packaged, the agent imports without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# Top-level folders and the import names they carry through kcops/<name> symlinks.
FOLDERS = ("agent", "kernels", "worker", "alerts", "dashboards", "runbooks")


def test_each_folder_is_a_kcops_subpackage_through_a_symlink() -> None:
    for folder in FOLDERS:
        link = REPO / "kcops" / folder
        assert link.is_symlink(), f"kcops/{folder} must be a symlink to ../{folder}"
        assert link.resolve() == (REPO / folder).resolve()


def test_find_packages_sees_every_package_folder() -> None:
    from setuptools import find_packages

    listed = set(find_packages(str(REPO), include=["kcops", "kcops.*"]))
    found = {"kcops"}
    for folder in FOLDERS:
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            parts = [] if str(rel) == "." else list(rel.parts)
            if any(p.startswith((".", "__")) or p == "tests" for p in parts):
                continue
            found.add(".".join(["kcops", folder, *parts]))
    missing = found - listed
    assert not missing, f"setuptools would leave out: {sorted(missing)}"


def test_agent_and_cli_import_without_torch() -> None:
    # torch blocked outright: any import of it from the agent side fails loudly.
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "import kcops.agent.app, kcops.cli, kcops.kernels, kcops.kernels.wire\n"
        "from kcops.cli import cli\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
