"""Every family a collector exports is in the catalogue (agent/signals.py), with its type."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kcops.agent.collectors import promtext
from kcops.agent.collectors.cpumem import CpuDeviceMemoryCollector
from kcops.agent.collectors.nvml import Nvml, NvmlCollector
from kcops.agent.collectors.probe import ProbeReceiver
from kcops.agent.collectors.process import EngineEventsCollector, ProcessCollector
from kcops.agent.collectors.procwatch import EngineWatch
from kcops.agent.engine.kinds import builtin_kinds
from kcops.agent.engine.pid import EnginePid
from kcops.agent.samples import Sample
from kcops.agent.signals import SIGNALS
from kcops.kernels import wire
from tests.unit.collectors.fake_pynvml import FakeNvmlModule, ProcessInfo
from tests.unit.collectors.helpers import collect

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def family(name: str) -> tuple[str, str]:
    if name in SIGNALS:
        return name, SIGNALS[name].type
    for suf in ("_bucket", "_sum", "_count"):
        if name.endswith(suf) and name[: -len(suf)] in SIGNALS:
            return name[: -len(suf)], SIGNALS[name[: -len(suf)]].type
    raise AssertionError(f"{name} is not in agent/signals.py")


def check(samples: list[Sample]) -> None:
    for s in samples:
        fam, typ = family(s.name)
        if typ == "counter":
            assert s.name.endswith("_total"), s.name
        if typ == "histogram":
            assert s.name != fam, s.name


def test_every_exported_family_is_catalogued() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        fake = FakeNvmlModule(gpus=1)
        fake.gpus[0].procs = [ProcessInfo(p.pid, 5)]
        fake.xid(0, 48)
        watch = EngineWatch(EnginePid(pid=p.pid), kmsg_path=None)
        check(collect(NvmlCollector(Nvml(fake), engine_pids=watch.pid_set), 0.0))
        check(collect(ProcessCollector(watch), 0.0))
        check(collect(EngineEventsCollector(watch), 0.0))
        check(collect(CpuDeviceMemoryCollector(watch), 0.0))
    finally:
        p.kill()
        p.wait()
    r = ProbeReceiver("/nonexistent")
    h = {n: wire.Histogram.of(n) for n in wire.PLAIN_HISTOGRAMS}
    f = wire.Frame(
        1,
        "p",
        0,
        calls_by_layer={"0": 1},
        errors={"nan": 1},
        histograms=h,
        topn_mass={16: wire.Histogram.of(wire.TOPN_MASS)},
    )
    r.feed(wire.encode(f))
    r.feed(b"not a frame")  # kcops_probe_frames_refused_total{reason="bad_magic"}
    check(collect(r))
    for name, a in ((k.name, k.adapter) for k in builtin_kinds()):
        # every canonical family an adapter can produce
        for m in a.maps:
            suffix = {"gauge": "", "counter": "_total", "histogram": "_bucket", "count": "_total"}[
                m.kind
            ]
            family(m.target + suffix)
        if name == "vllm":
            text = (FIXTURES / "vllm_metrics.txt").read_text()
            check(a.map(promtext.parse(text, a.wanted())))
    for n in (
        "kcops_engine_up",
        "kcops_engine_last_healthy_age_seconds",
        "kcops_engine_health_checks_total",
    ):
        family(n)


def test_no_two_signals_share_a_family_name() -> None:
    # A counter's family drops `_total`, a histogram's series add `_bucket`/`_sum`/`_count`:
    # a gauge named like either would be a second family of one name (the exposition and
    # OTLP then mix them up; a gauge kcops_probe_connections beside the counter
    # kcops_probe_connections_total did).
    seen: dict[str, str] = {}
    for name, meta in SIGNALS.items():
        fam = name.removesuffix("_total") if meta.type == "counter" else name
        names = {fam}
        if meta.type == "histogram":
            names |= {fam + s for s in ("_bucket", "_sum", "_count")}
        for n in names:
            assert n not in seen, f"{name} and {seen[n]} share the name {n}"
            seen[n] = name
