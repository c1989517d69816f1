"""The real-vLLM suite (`make test-vllm`): one agent supervising one `vllm serve` for the
whole session, started cold, under a light load for the first five minutes (the soak).

Order matters and is fixed here: the cost check at two sample rates first, on stacks of
its own while the machine is otherwise idle; tests that only observe run during the soak;
the soak's verdict comes next; tests that act on the engine (evict, ladder, restart, stall)
run after it, the two that restart it last. Without the vLLM install these tests are skipped with a
reason that says how to run them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kcops.kernels.integrations.vllm_requests import HANG_FILE_ENV
from tests.engines.vllm.harness import (
    POLL_S,
    Load,
    Stack,
    Watch,
    shm_entries,
    supervised_vllm,
    ttft_p99,
)
from tests.services import wait_until

HERE = Path(__file__).resolve().parent
ORDER = (
    "test_cost_sampled.py",
    "test_probe.py",
    "test_adapter.py",
    "test_kc_recommend.py",
    "test_soak.py",
    "test_tenants.py",
    "test_kc.py",
    "test_evict.py",
    "test_ladder.py",
    "test_restart.py",
    "test_stall.py",
    "test_incident.py",
)
SOAK_S = 300.0
# The TTFT page (KcopsP99LatencyHigh) counts only once the engine has been ready for a
# whole rate window before the current one and through it: ~10 min after each start,
# longer than the soak. So the soak evaluates the alert's own expression without that
# guard, over its steady part (the last STEADY_S: after the cold start's first slow
# requests), beside the same requests' time to first chunk as the load's client saw it
# (test_soak.py).
STEADY_S = 180
STEADY_WINDOW = f"{STEADY_S}s"
TTFT_COUNT = f"sum by (engine) (increase(kcops_ttft_seconds_count[{STEADY_WINDOW}]))"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [i for i in items if Path(str(i.fspath)).resolve().parent == HERE]
    if not mine:
        return
    missing = [v for v in ("KCOPS_VLLM_VENV", "KCOPS_VLLM_MODEL") if not os.environ.get(v)]
    if missing:
        skip = pytest.mark.skip(
            reason=f"real vLLM suite: run `make test-vllm` (it builds .venv-vllm and sets "
            f"{', '.join(missing)})"
        )
        for item in mine:
            item.add_marker(skip)
        return
    rank = {name: k for k, name in enumerate(ORDER)}
    ids = {id(i) for i in mine}
    mine.sort(key=lambda i: rank.get(Path(str(i.fspath)).name, len(ORDER)))
    items[:] = [i for i in items if id(i) not in ids] + mine


@dataclass
class Soak:
    """Five minutes of light load on the engine from its cold start: what was seen."""

    stack: Stack
    watch: Watch
    load: Load
    ends_at: float
    verdict: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def finish(self) -> dict[str, Any]:
        """Wait until the soak window has passed (its length is what is tested), stop the
        load and the watch, and return what they saw. Idempotent."""
        with self._lock:
            if not self.verdict:
                threading.Event().wait(max(0.0, self.ends_at - time.time()))
                ttft = {
                    "ttft_p99_steady_s": _one(self.stack.query(ttft_p99(STEADY_WINDOW))),
                    "ttft_requests_steady": _one(self.stack.query(TTFT_COUNT)),
                    "ttft_p99_whole_soak_s": _one(self.stack.query(ttft_p99("5m"))),
                    # The client's seconds to first chunk of the requests whose first
                    # chunk came in the steady window, sorted.
                    "ttft_client_steady_s": sorted(
                        secs for at, secs in self.load.first_chunks if at >= time.time() - STEADY_S
                    ),
                    "ttft_bucket_bounds": sorted(
                        float(r["metric"]["le"])
                        for r in self.stack.query("sum by (le) (kcops_ttft_seconds_bucket)")
                        if r["metric"].get("le") not in (None, "+Inf")
                    ),
                    "loadavg": Path("/proc/loadavg").read_text().split()[:3],
                }
                self.load.stop()
                self.watch.stop()
                self.verdict = {
                    **ttft,
                    "pages": self.watch.pages(),
                    "firing": sorted(self.watch.firing),
                    "polls": self.watch.polls,
                    "actions": self.stack.audit("action"),
                    "page_records": self.stack.audit("page"),
                    "load_ok": self.load.ok,
                    "load_errors": list(self.load.errors),
                    "seconds": round(time.time() - self.stack.started_at),
                }
            return self.verdict


def _one(result: list[dict[str, Any]]) -> float | None:
    """The value of a one-series instant result (None when there is none)."""
    if len(result) != 1:
        return None
    return float(result[0]["value"][1])


@pytest.fixture(scope="session")
def soak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Soak]:
    tmp = tmp_path_factory.mktemp("vllm")
    with supervised_vllm(tmp) as (stack, watch):
        load = Load(stack.engine_url)
        load.start()
        s = Soak(stack, watch, load, ends_at=time.time() + SOAK_S)
        try:
            yield s
        finally:
            s.load.stop()
            s.watch.stop()
    # The agent and its engine are gone: /dev/shm must hold what it held before.
    wait_until(
        lambda: not (shm_entries() - stack.pre_shm),
        60,
        "/dev/shm back to its state before vLLM started",
        lambda: f"left: {sorted(shm_entries() - stack.pre_shm)[:20]}",
        interval_s=POLL_S,
    )


@pytest.fixture
def stack(soak: Soak) -> Stack:
    return soak.stack


@pytest.fixture
def after_soak(soak: Soak) -> Stack:
    """The engine, once the soak is over (tests that act on it must not disturb it)."""
    soak.finish()
    return soak.stack


@pytest.fixture(autouse=True, scope="session")
def hang_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The plugin's test-only hang, armed in the vLLM this session starts (autouse: set
    before the soak starts it): its engine core hangs while this file exists
    (test_incident.py); absent, the cost is one ``os.path.exists`` per step."""
    path = tmp_path_factory.mktemp("fault") / "hang"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HANG_FILE_ENV, str(path))
        yield path
        path.unlink(missing_ok=True)


@pytest.fixture
def quiet(soak: Soak) -> Stack:
    """The engine with the soak's load stopped. The suite runs the tests that use it last
    (ORDER), after the soak's verdict; run alone, they skip the five minutes of soak."""
    soak.load.stop()
    soak.watch.stop()
    return soak.stack
