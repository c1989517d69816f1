from __future__ import annotations

import asyncio
import logging

import pynvml
import pytest

from kcops.agent.collectors.nvml import UNKNOWN, Nvml, NvmlCollector, NvmlUnavailable
from kcops.cli.status import format_status
from tests.unit.collectors import fake_pynvml
from tests.unit.collectors.fake_pynvml import FakeNvmlModule, ProcessInfo
from tests.unit.collectors.helpers import collect, latest, runner, value


def test_fake_matches_the_real_pynvml_interface() -> None:
    fake = FakeNvmlModule()
    for fn in [n for n in dir(fake) if n.startswith("nvml") and callable(getattr(fake, n))]:
        assert hasattr(pynvml, fn), fn
    for struct in ("c_nvmlMemory_t", "c_nvmlUtilization_t", "c_nvmlEventData_t"):
        real = [f for f, _ in getattr(pynvml, struct)._fields_]
        mine = list(getattr(fake_pynvml, struct).__dataclass_fields__)
        assert mine == real, struct
    for name in (
        "NVMLError_NotSupported",
        "NVMLError_Timeout",
        "NVMLError_LibraryNotFound",
        "NVMLError_DriverNotLoaded",
        "NVMLError_NoPermission",
        "NVMLError_GpuIsLost",
    ):
        assert hasattr(pynvml, name) and hasattr(fake_pynvml, name), name
    for const in (
        "NVML_ERROR_NOT_SUPPORTED",
        "NVML_ERROR_TIMEOUT",
        "NVML_ERROR_DRIVER_NOT_LOADED",
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        "NVML_TEMPERATURE_GPU",
        "nvmlEventTypeXidCriticalError",
    ):
        assert getattr(pynvml, const) == getattr(fake_pynvml, const), const
    # the error constructor returns the subclass, as pynvml's does
    assert type(fake_pynvml.NVMLError(3)).__name__ == "NVMLError_NotSupported"
    assert type(pynvml.NVMLError(3)).__name__ == "NVMLError_NotSupported"


def test_every_field_is_exported_with_device_and_uuid_labels() -> None:
    fake = FakeNvmlModule(gpus=2)
    fake.gpus[1].used, fake.gpus[1].util, fake.gpus[1].temp, fake.gpus[1].power_mw = (
        5 << 30,
        97,
        81,
        312_500,
    )
    out = collect(NvmlCollector(Nvml(fake)))
    for g in fake.gpus:
        lab = {"device": str(g.index), "uuid": g.uuid}
        assert value(out, "kcops_device_memory_used_bytes", **lab) == g.used
        assert value(out, "kcops_device_memory_total_bytes", **lab) == g.total
        assert value(out, "kcops_gpu_utilization_ratio", **lab) == pytest.approx(g.util / 100)
        assert value(out, "kcops_gpu_temperature_celsius", **lab) == g.temp
        assert value(out, "kcops_gpu_power_watts", **lab) == pytest.approx(g.power_mw / 1000)
    assert len(out) == 10
    assert fake.registered == {0, 1}


def test_xid_event_increments_its_counter_without_waiting() -> None:
    fake = FakeNvmlModule(gpus=2)
    c = NvmlCollector(Nvml(fake))
    out = collect(c, 1.0)
    assert not [s for s in out if s.name == "kcops_gpu_xid_errors_total"]
    fake.xid(1, 79)
    out = collect(c, 2.0)
    lab = {"device": "1", "uuid": fake.gpus[1].uuid, "xid": "79"}
    assert value(out, "kcops_gpu_xid_errors_total", **lab) == 1
    fake.xid(1, 79)
    fake.xid(0, 13)
    out = collect(c, 3.0)
    assert value(out, "kcops_gpu_xid_errors_total", **lab) == 2
    assert (
        value(out, "kcops_gpu_xid_errors_total", device="0", uuid=fake.gpus[0].uuid, xid="13") == 1
    )


def test_not_supported_field_stays_absent_never_zero(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvmlModule(gpus=1)
    fake.gpus[0].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"}
    c = NvmlCollector(Nvml(fake))
    with caplog.at_level(logging.INFO, "kcops.agent.collectors.nvml"):
        out = collect(c, 1.0)
        collect(c, 2.0)
    names = {s.name for s in out}
    assert "kcops_gpu_power_watts" not in names and "kcops_gpu_temperature_celsius" not in names
    assert "kcops_device_memory_used_bytes" in names
    logged = [r for r in caplog.records if "nvmlDeviceGetPowerUsage" in r.getMessage()]
    assert len(logged) == 1  # once, not every tick


def test_query_helper_maps_errors() -> None:
    fake = FakeNvmlModule(gpus=1)
    nv = Nvml(fake)
    assert nv.query("nvmlDeviceGetCount") == 1
    assert nv.query("nvmlNoSuchFunction") is UNKNOWN
    assert nv.query("nvmlEventSetWait", object(), 0) is None  # timeout: no event
    assert not UNKNOWN


def test_no_driver_reports_unavailable_and_exports_no_gpu_series() -> None:
    fake = FakeNvmlModule(driver=False)
    c = NvmlCollector(Nvml(fake))
    with pytest.raises(NvmlUnavailable) as info:
        collect(c)
    assert info.value.reason == "no_driver"
    r, store = runner(c)
    asyncio.run(r.tick(1.0))
    asyncio.run(r.tick(2.0))
    assert not [n for n in store.names() if n.startswith("kcops_gpu_")]
    assert latest(store, "kcops_collector_errors_total", collector="nvml", reason="no_driver") == 2
    assert fake.calls["nvmlInit"] == 1  # init is tried once, the failure remembered
    st = {
        "version": "x",
        "pid": 1,
        "uptime_s": 1,
        "ticks": 1,
        "tick_s": 1.0,
        "series": 0,
        "mode": "off",
        "components": {"collectors": r.status()},
    }
    text = format_status(st)
    assert "nvml: unavailable (no NVIDIA driver" in text


def test_real_pynvml_without_driver_is_unavailable() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("a driver is present")
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver"):
        collect(NvmlCollector(Nvml()))


def test_per_process_memory_is_sampled_sparingly_for_engine_pids() -> None:
    fake = FakeNvmlModule(gpus=2)
    fake.gpus[0].procs = [ProcessInfo(100, 3 << 30), ProcessInfo(999, 1 << 30)]
    fake.gpus[1].procs = [ProcessInfo(101, None)]  # unknown memory: absent
    c = NvmlCollector(Nvml(fake), engine_pids=lambda: {100, 101}, process_interval_s=10)
    out = collect(c, 0.0)
    lab = {"device": "0", "uuid": fake.gpus[0].uuid, "pid": "100"}
    assert value(out, "kcops_gpu_process_memory_bytes", **lab) == 3 << 30
    assert len([s for s in out if s.name == "kcops_gpu_process_memory_bytes"]) == 1
    collect(c, 5.0)
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 2  # once per device, not again
    collect(c, 10.0)
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 4


def test_a_driver_that_appears_later_is_picked_up() -> None:
    t = {"now": 0.0}
    fake = FakeNvmlModule(gpus=1, driver=False)
    c = NvmlCollector(Nvml(fake, retry_s=300, clock=lambda: t["now"]))
    with pytest.raises(NvmlUnavailable):
        collect(c, 1.0)
    fake.driver = True
    t["now"] = 100.0
    with pytest.raises(NvmlUnavailable):
        collect(c, 2.0)  # not retried yet
    t["now"] = 301.0
    assert value(
        collect(c, 3.0), "kcops_gpu_temperature_celsius", device="0", uuid=fake.gpus[0].uuid
    )
    assert fake.calls["nvmlInit"] == 2
