"""Shared fixtures: real services on free ports of 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import redis_server

# The longest files first (`--durations` of make test): under `-n 2 --dist loadfile` a
# long file scheduled last runs alone at the end while the other worker idles.
LONG_FIRST = (
    "integration/test_cost_sampled.py", "integration/test_kc_calibration_smollm2.py",
    "integration/test_promtool_differential.py", "integration/test_demo.py",
    "faults/test_flood.py",
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda it: not it.nodeid.split("::")[0].endswith(LONG_FIRST))  # stable
    try:
        import pynvml

        pynvml.nvmlInit()
        has_gpu = pynvml.nvmlDeviceGetCount() > 0
        pynvml.nvmlShutdown()
    except Exception:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU/driver on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _point_at(mp: pytest.MonkeyPatch, home: Path) -> None:
    """The probe socket and the state dir under ``home``."""
    mp.setenv("KCOPS_PROBE_SOCKET", str(home / "probe.sock"))
    mp.setenv("XDG_STATE_HOME", str(home / "state"))


@pytest.fixture(autouse=True, scope="session")
def _session_paths(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The private variables exist for the whole session, so each test's own values
    replace them and never delete them: a thread that outlives its test (a load, a watch)
    and iterates os.environ (httpx does, for proxies) would get a KeyError on a key
    deleted under it."""
    with pytest.MonkeyPatch.context() as mp:
        _point_at(mp, tmp_path_factory.mktemp("session"))
        yield


@pytest.fixture(autouse=True)
def _private_paths(
    _session_paths: None, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each test gets its own probe socket and state dir, so tests run in parallel
    (pytest-xdist) without two agents binding one default path."""
    _point_at(monkeypatch, tmp_path_factory.mktemp("h"))


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as url:
        yield url
