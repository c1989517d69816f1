"""Packaging invariants: every package folder is listed, the agent imports without torch."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _cfg() -> configparser.ConfigParser:
    cp = configparser.ConfigParser()
    cp.read(REPO / "setup.cfg")
    return cp


def test_every_package_folder_is_listed_in_setup_cfg() -> None:
    cp = _cfg()
    mapping = {}
    for line in cp["options"]["package_dir"].strip().splitlines():
        name, _, folder = (p.strip() for p in line.partition("="))
        mapping[name] = folder
    listed = set(cp["options"]["packages"].split())
    found = set()
    for name, folder in mapping.items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            parts = [] if str(rel) == "." else list(rel.parts)
            if any(p.startswith((".", "__")) or p == "tests" for p in parts):
                continue
            found.add(".".join([name, *parts]))
    missing = found - listed
    assert not missing, f"add to setup.cfg [options] packages: {sorted(missing)}"


def test_agent_and_cli_import_without_torch() -> None:
    # torch blocked outright: any import of it from the agent side fails loudly.
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "import kcops.agent.app, kcops.agent.cli, kcops.kernels, kcops.kernels.wire\n"
        "from kcops.agent.cli import cli\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
