"""Rendered deploy/ overlays, shared by the manifest tests (kubectl renders once per run)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
OVERLAYS = ("vllm", "kcops-worker")


def kustomize(folder: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (its built-in kustomize renders deploy/)")
    res = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, f"kubectl kustomize {folder} failed: {res.stderr[-2000:]}"
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: kustomize(DEPLOY / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(scope="session")
def cluster_scoped() -> list[dict[str, Any]]:
    """deploy/cluster: what is applied once per cluster (the admission policy)."""
    return kustomize(DEPLOY / "cluster")


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]
