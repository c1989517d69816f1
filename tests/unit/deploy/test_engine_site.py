"""The vLLM overlay's init container: a fresh Python finds kcops's plugin entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kcops.agent.engine_site import install, main


def test_copy_is_importable_and_announces_the_vllm_plugin(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site)
    install(site)  # a second run (pod restart) replaces the copy
    assert len(list(site.glob("kcops-*.dist-info"))) == 1
    code = (
        "import importlib.metadata as md, kcops.kernels.wire as w;"
        "eps = md.entry_points(group='vllm.general_plugins');"
        "print(w.__file__); print(sorted(e.name + '=' + e.value for e in eps))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    # -S: no site-packages, so the only kcops it can see is the copy.
    res = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    wire_file, eps = res.stdout.splitlines()
    assert Path(wire_file).is_relative_to(site)
    assert "kcops_probe=kcops.kernels.integrations.vllm_plugin:register" in eps


def test_unwritable_target_exits_1(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([str(blocker / "site")]) == 1
