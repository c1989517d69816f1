"""The agent's own RSS and CPU, read from the kernel without psutil, agree with psutil."""

from __future__ import annotations

import os

import psutil
import pytest

from kcops.agent.collectors.selfmetrics import SelfCollector, tick_histogram
from kcops.agent.store import Store
from kcops.errors import CollectorUnavailable
from tests.unit.collectors.helpers import value


def test_own_rss_and_cpu_agree_with_psutil() -> None:
    c = SelfCollector(tick_histogram(), store=Store())
    me = psutil.Process(os.getpid())
    sum(i * i for i in range(200_000))  # some CPU time to read
    out = list(c.collect(0.0))
    ref_rss, ref_cpu = me.memory_info().rss, sum(me.cpu_times()[:2])
    rss = value(out, "kcops_process_resident_memory_bytes", process="agent")
    cpu = value(out, "kcops_process_cpu_seconds_total", process="agent")
    assert rss is not None and abs(rss - ref_rss) < 8 << 20
    assert cpu is not None and 0 < cpu <= ref_cpu + 0.05 and ref_cpu - cpu < 0.5
    assert c.proc is None  # on Linux psutil was not needed


def test_an_explicit_psutil_process_is_still_used() -> None:
    me = psutil.Process(os.getpid())
    out = list(SelfCollector(tick_histogram(), proc=me).collect(0.0))
    assert (value(out, "kcops_process_resident_memory_bytes", process="agent") or 0) > 1 << 20


def test_no_descriptor_left_is_unavailable_not_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """EMFILE on /proc/self/statm was taken for "no /proc": psutil, whose import failed
    too, and a traceback every tick (issue 24: fd exhaustion). Now one line, unavailable."""
    import builtins
    import errno

    def no_fd(*args: object, **kw: object) -> object:
        raise OSError(errno.EMFILE, "Too many open files")

    c = SelfCollector(tick_histogram(), store=Store())
    monkeypatch.setattr(builtins, "open", no_fd)
    with pytest.raises(CollectorUnavailable, match="Too many open files") as exc:
        c.collect(0.0)
    assert exc.value.reason == "read" and c.proc is None


def test_the_regex_cache_bound_and_use_are_exported() -> None:
    from kcops.agent.promql.regex import CACHE, compile_anchored
    from kcops.agent.signals import SIGNALS

    compile_anchored("exported|regex")
    out = list(SelfCollector(tick_histogram(), store=Store(), regex_cache=CACHE).collect(0.0))
    assert value(out, "kcops_regex_cache_max_bytes") == CACHE.max_bytes
    assert value(out, "kcops_regex_cache_entries") == len(CACHE) >= 1
    assert 0 < (value(out, "kcops_regex_cache_bytes") or 0) <= CACHE.max_bytes
    assert value(out, "kcops_regex_cache_evictions_total") == CACHE.evictions
    assert all(s.name in SIGNALS for s in out if s.name.startswith("kcops_regex"))
