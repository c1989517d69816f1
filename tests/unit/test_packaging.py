"""Packaging invariants: every package folder is packaged, the agent imports without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# Top-level folders and the import names they carry through kcops/<name> symlinks: the
# sidecar's distribution (the repository root), and the two it leaves out, each its own
# distribution (docs/architecture.md#layout: production never carries the lab or the demo).
FOLDERS = ("agent", "kernels", "worker", "alerts", "dashboards", "runbooks")
OWN_DISTRIBUTIONS = ("lab", "demo")


def test_each_folder_is_a_kcops_subpackage_through_a_symlink() -> None:
    for folder in FOLDERS + OWN_DISTRIBUTIONS:
        link = REPO / "kcops" / folder
        assert link.is_symlink(), f"kcops/{folder} must be a symlink to ../{folder}"
        assert link.resolve() == (REPO / folder).resolve()


def test_find_packages_sees_every_package_folder() -> None:
    import configparser

    from setuptools import find_packages

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    find = {k: cfg["options.packages.find"][k].split() for k in ("include", "exclude")}
    listed = set(find_packages(str(REPO), **find))
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
    carried = {p for p in listed if p.split(".")[1:2] and p.split(".")[1] in OWN_DISTRIBUTIONS}
    assert not carried, f"the sidecar's distribution would carry: {sorted(carried)}"


def test_the_lab_and_the_demo_are_their_own_distributions_of_kcops_version() -> None:
    import tomllib

    from kcops import __version__

    for folder in OWN_DISTRIBUTIONS:
        project = tomllib.loads((REPO / folder / "pyproject.toml").read_text())
        tool = project["tool"]["setuptools"]
        assert tool["package-dir"] == {f"kcops.{folder}": "."}
        found = {f"kcops.{folder}"} | {
            f"kcops.{folder}." + ".".join(init.parent.relative_to(REPO / folder).parts)
            for init in (REPO / folder).rglob("*/__init__.py")
        }
        assert set(tool["packages"]) == found, f"{folder}/pyproject.toml lists {tool['packages']}"
        assert project["project"]["version"] == __version__
        assert f"=={__version__}" in project["project"]["dependencies"][0]


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
