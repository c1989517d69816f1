"""A fake ``pynvml`` with the real module's interface, for tests and the tick benchmark.

Function names, constants, error classes (``NVMLError`` whose constructor
returns the ``NVMLError_<Name>`` subclass for a code, like pynvml's) and the
fields of returned structs match nvidia-ml-py; test_nvml.py checks that
against the installed pynvml so the fake cannot drift.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
nvmlEventTypeXidCriticalError = 0x0000000000000008

_NAMES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "InvalidArgument",
    NVML_ERROR_NOT_SUPPORTED: "NotSupported",
    NVML_ERROR_NO_PERMISSION: "NoPermission",
    NVML_ERROR_NOT_FOUND: "NotFound",
    NVML_ERROR_DRIVER_NOT_LOADED: "DriverNotLoaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "LibraryNotFound",
    NVML_ERROR_FUNCTION_NOT_FOUND: "FunctionNotFound",
    NVML_ERROR_GPU_IS_LOST: "GpuIsLost",
    NVML_ERROR_UNKNOWN: "Unknown",
}


class NVMLError(Exception):
    _valClassMapping: ClassVar[dict[int, type]] = {}

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value  # type: ignore[attr-defined]
        return obj

    def __init__(self, value: int) -> None:
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML Error with code {self.value}")


for _code, _name in _NAMES.items():
    _cls = type(f"NVMLError_{_name}", (NVMLError,), {})
    NVMLError._valClassMapping[_code] = _cls
    globals()[_cls.__name__] = _cls


@dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclass
class c_nvmlEventData_t:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


@dataclass
class ProcessInfo:
    """pynvml's friendly object for c_nvmlProcessInfo_t (usedGpuMemory None when unknown)."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeGpu:
    index: int
    uuid: str
    total: int = 80 << 30
    used: int = 10 << 30
    util: int = 42
    temp: int = 55
    power_mw: int = 250_000
    procs: list[ProcessInfo] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # function names -> NotSupported


class FakeHandle:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu


class FakeNvmlModule:
    """Module-like object: pass it as ``Nvml(module=...)``."""

    def __init__(self, gpus: int = 2, *, driver: bool = True) -> None:
        self.gpus = [FakeGpu(i, f"GPU-{i:08x}-fake") for i in range(gpus)]
        self.driver = driver
        self.initialised = False
        self.events: deque[c_nvmlEventData_t] = deque()
        self.calls: dict[str, int] = {}
        self.registered: set[int] = set()
        g = globals()
        for name, value in g.items():
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType")):
                setattr(self, name, value)

    def _count(self, fn: str) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1

    def _check(self, fn: str, h: FakeHandle | None = None) -> None:
        self._count(fn)
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if h is not None and fn in h.gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if not self.driver:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeHandle:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(self.gpus[i])

    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:
        self._check("nvmlDeviceGetUUID", h)
        return h.gpu.uuid

    def nvmlDeviceGetIndex(self, h: FakeHandle) -> int:
        self._check("nvmlDeviceGetIndex", h)
        return h.gpu.index

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle) -> c_nvmlMemory_t:
        self._check("nvmlDeviceGetMemoryInfo", h)
        return c_nvmlMemory_t(h.gpu.total, h.gpu.total - h.gpu.used, h.gpu.used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> c_nvmlUtilization_t:
        self._check("nvmlDeviceGetUtilizationRates", h)
        return c_nvmlUtilization_t(h.gpu.util, 10)

    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", h)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return h.gpu.temp

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        self._check("nvmlDeviceGetPowerUsage", h)
        return h.gpu.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeHandle) -> list[ProcessInfo]:
        self._check("nvmlDeviceGetComputeRunningProcesses", h)
        return list(h.gpu.procs)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeHandle) -> list[ProcessInfo]:
        self._check("nvmlDeviceGetGraphicsRunningProcesses", h)
        return []

    def nvmlEventSetCreate(self) -> object:
        self._check("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, h: FakeHandle, types: int, es: object) -> None:
        self._check("nvmlDeviceRegisterEvents", h)
        self.registered.add(h.gpu.index)

    def nvmlEventSetWait(self, es: object, timeoutms: int) -> c_nvmlEventData_t:
        self._check("nvmlEventSetWait")
        if not self.events:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return self.events.popleft()

    def nvmlEventSetFree(self, es: object) -> None:
        self._check("nvmlEventSetFree")

    # -- test helpers ------------------------------------------------------------

    def xid(self, index: int, xid: int) -> None:
        self.events.append(
            c_nvmlEventData_t(FakeHandle(self.gpus[index]), nvmlEventTypeXidCriticalError, xid)
        )
