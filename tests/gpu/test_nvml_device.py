"""The NVML collector against the real driver: every field it exports, this process's own
GPU memory and the XID event registration (tests/gpu/device_check.sh runs it).

Marked ``gpu``: skipped without an NVIDIA GPU (tests/conftest.py).
"""

from __future__ import annotations

import os

import pytest

from kcops.agent.collectors.nvml import Nvml, NvmlCollector
from tests.unit.collectors.helpers import collect, value

pytestmark = pytest.mark.gpu


def test_real_driver_gives_every_field() -> None:
    import torch

    held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # this process's GPU memory
    c = NvmlCollector(Nvml(), engine_pids=lambda: {os.getpid()})
    try:
        out = collect(c)
        devices = {s.key.label_dict()["device"]: s.key.label_dict()["uuid"] for s in out}
        assert devices and all(u.startswith("GPU-") for u in devices.values())
        for dev, uuid in devices.items():
            at = {"device": dev, "uuid": uuid}
            total = value(out, "kcops_device_memory_total_bytes", **at)
            used = value(out, "kcops_device_memory_used_bytes", **at)
            assert total is not None and used is not None and 0 <= used <= total
            util = value(out, "kcops_gpu_utilization_ratio", **at)
            assert util is not None and 0 <= util <= 1
            temp = value(out, "kcops_gpu_temperature_celsius", **at)
            assert temp is not None and 0 < temp < 120
            watts = value(out, "kcops_gpu_power_watts", **at)
            assert watts is not None and watts > 0
        mine = [s for s in out if s.name == "kcops_gpu_process_memory_bytes"]
        assert [s.key.label_dict()["pid"] for s in mine] == [str(os.getpid())]
        assert mine[0].value >= held.numel()
        # XIDs cannot be provoked safely; that the driver accepted the registration is checkable
        assert c._event_set is not None
    finally:
        c.stop()
