"""``python -m kcops.kernels.run -- CMD``: the probe in a child process without code changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kcops.kernels import run


def test_prepare_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    env = run.prepare_env({"PYTHONPATH": "/x"})
    assert env["KCOPS_PROBE"] == "1"
    first, rest = env["PYTHONPATH"].split(os.pathsep, 1)
    assert rest == "/x"
    folder = Path(first)
    assert folder.parent == tmp_path and folder.name.startswith("kcops-autoload-")
    assert folder.stat().st_mode & 0o777 == 0o700  # private, and new every run
    assert (folder / "sitecustomize.py").is_file()
    second = run.prepare_env({})["PYTHONPATH"]
    assert second != first


def test_usage_without_command() -> None:
    assert run.main([]) == 2
    assert run.main(["--"]) == 2


@pytest.mark.slow
def test_child_process_is_instrumented(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["KCOPS_PROBE_SOCKET"] = str(tmp_path / "probe.sock")
    env["KCOPS_PROBE_INTEGRATIONS"] = "torch_sdpa"
    code = (
        "import torch, kcops.kernels as k; p = k.get_probe(); q = torch.ones(1, 1, 2, 4);"
        "torch.nn.functional.scaled_dot_product_attention(q, q, q);"
        "p.resolve_pending(); print(dict(p.aggregator.calls))"
    )
    out = subprocess.run(
        [sys.executable, "-m", "kcops.kernels.run", "--", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'unknown': 1}"
