"""The package data (alerts, runbooks) is found through importlib.resources from a wheel too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import importlib.resources as r, kcops, kcops.alerts, kcops.agent
print(kcops.agent.__file__)
print(r.files('kcops.alerts').joinpath('rules.yaml').is_file())
print(any(p.name.endswith('.md') for p in r.files('kcops.runbooks').iterdir()))
"""


def _run_check(pythonpath: str | None, cwd: Path) -> list[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_package_data_found_in_editable_install(tmp_path: Path) -> None:
    agent_file, rules, runbooks = _run_check(None, tmp_path)
    # kcops/agent is a symlink to agent/: either path is the checkout.
    assert Path(agent_file).resolve().is_relative_to(REPO / "agent")
    assert rules == "True" and runbooks == "True"


@pytest.mark.slow
def test_package_data_found_from_built_wheel(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(dist.glob("kcops-*.whl"))
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    agent_file, rules, runbooks = _run_check(str(target), tmp_path)
    assert agent_file.startswith(str(target)), "imported the checkout, not the wheel"
    assert rules == "True" and runbooks == "True"
