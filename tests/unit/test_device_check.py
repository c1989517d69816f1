"""tests/gpu/device_check.sh --dry-run: what a GPU machine would run, checked with none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_names_each_check_and_the_wheels() -> None:
    run = subprocess.run(
        ["bash", str(REPO / "tests/gpu/device_check.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stderr
    checks = dict(
        line.split(": ", 1) for line in run.stdout.splitlines() if line.startswith("check ")
    )
    assert list(checks) == [
        f"check {c}" for c in ("install", "cuda", "gpu-tests", "nvml", "kc-cuda", "overhead")
    ]
    assert "--no-index --find-links build/gpu-wheels kcops" in checks["check install"]
    assert "-m gpu" in checks["check gpu-tests"] and "test_gpu.py" in checks["check gpu-tests"]
    assert "tests/gpu/test_nvml_device.py" in checks["check nvml"]
    assert "--device cuda --modes nvtx" in checks["check overhead"]
    (wheels,) = [line for line in run.stdout.splitlines() if line.startswith("wheels: ")]
    # Built (make gpu-wheels) or not, the list names kcops and its runtime dependencies.
    assert "pydantic" in run.stdout and ("MiB" in wheels or "pydantic" in wheels)
