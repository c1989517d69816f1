"""NVIDIA GPUs through NVML (``nvidia-ml-py``, module ``pynvml``).

Every NVML call goes through :class:`Nvml.query`: it initialises lazily, turns
"not supported" / "no permission" / a function the driver lacks into
:data:`UNKNOWN` (logged once per function; left out of the samples, never
exported as 0), and "no driver" / "no library" into :class:`NvmlUnavailable`.

Per tick, one snapshot per device, plus XID events drained with a zero timeout.
Per-process GPU memory is a slow call, so it runs every ``process_interval_s``
in a worker thread and the collector exports the last result.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from kcops.agent.samples import Sample, label_pairs
from kcops.errors import CollectorUnavailable

log = logging.getLogger("kcops.agent.collectors.nvml")

# The library pynvml loads on Linux (a driver installs it).
NVML_LIBRARY = "libnvidia-ml.so.1"

# pynvml's error codes (NVML_ERROR_*), kept here so a fake module needs no more
# than the names the real one has.
_UNKNOWN_CODES = {
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_INVALID_ARGUMENT",
}
_NO_DRIVER_CODES = {
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_UNINITIALIZED",
}


class _Unknown:
    """A value NVML cannot give on this device/driver. Falsy; never a number."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


class NvmlUnavailable(CollectorUnavailable):
    """No NVIDIA driver or library: NVML cannot be used at all."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="no_driver")


def _load_pynvml() -> Any:
    """pynvml, once the NVML library loads: without a driver the module (~1.5 MiB of RSS)
    is not imported at all, and the failure reads as pynvml's own would."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(NVML_LIBRARY)  # what pynvml loads first; dlopen keeps it for pynvml
        except OSError:
            raise NvmlUnavailable("no NVIDIA driver: NVML Shared Library Not Found") from None
    import pynvml

    return pynvml


class Nvml:
    """The one gateway to NVML. ``module`` is pynvml or a fake with its interface."""

    def __init__(
        self,
        module: Any | None = None,
        loader: Callable[[], Any] = _load_pynvml,
        *,
        retry_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._module = module
        self._loader = loader
        self._initialised = False
        self._failure: NvmlUnavailable | None = None
        self._failed_at = 0.0
        # A driver can appear after the agent started (GPU operator): try again now and then.
        self.retry_s = retry_s
        self._clock = clock
        self._logged: set[str] = set()

    @property
    def module(self) -> Any:
        self.init()
        return self._module

    def init(self) -> None:
        """Load and initialise NVML once; raises :class:`NvmlUnavailable` (again) on failure."""
        if self._initialised:
            return
        if self._failure is not None:
            if self._clock() - self._failed_at < self.retry_s:
                # Without with_traceback(None), each re-raise of the same exception grows
                # its traceback by this tick's frames, and with them every sample list they
                # hold: RSS climbed by MB/s with the series count flat (issue 11).
                raise self._failure.with_traceback(None)
            self._failure = None
        try:
            if self._module is None:
                self._module = self._loader()
            self._module.nvmlInit()
        except NvmlUnavailable as exc:
            self._fail(exc)
        except ImportError as exc:
            self._fail(NvmlUnavailable(f"pynvml not importable: {exc}"))
        except Exception as exc:
            if self._is_error(exc):
                self._fail(NvmlUnavailable(f"no NVIDIA driver: {exc}"))
            raise
        self._initialised = True

    def _fail(self, failure: NvmlUnavailable) -> NoReturn:
        self._failure, self._failed_at = failure, self._clock()
        raise failure from None

    def shutdown(self) -> None:
        if self._initialised and self._module is not None:
            try:
                self._module.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown: %s", exc)
            self._initialised = False

    def _is_error(self, exc: BaseException) -> bool:
        err = getattr(self._module, "NVMLError", None)
        return err is not None and isinstance(exc, err)

    def _code_name(self, exc: BaseException) -> str:
        value = getattr(exc, "value", None)
        for name in _UNKNOWN_CODES | _NO_DRIVER_CODES | {"NVML_ERROR_TIMEOUT"}:
            if getattr(self._module, name, object()) == value:
                return name
        return f"code {value}"

    def _once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.info(msg, *args)

    def query(self, fn: str, *args: Any) -> Any:
        """``pynvml.<fn>(*args)``, or :data:`UNKNOWN` when the value cannot be read.

        Raises :class:`NvmlUnavailable` when the driver is gone.
        ``NVML_ERROR_TIMEOUT`` returns None (an empty event set).
        """
        self.init()
        func = getattr(self._module, fn, None)
        if func is None:
            self._once(fn, "nvml: %s not in this pynvml; its value stays unknown", fn)
            return UNKNOWN
        try:
            return func(*args)
        except Exception as exc:
            if not self._is_error(exc):
                raise
            code = self._code_name(exc)
            if code == "NVML_ERROR_TIMEOUT":
                return None
            if code in _NO_DRIVER_CODES:
                self._initialised = False
                self._fail(NvmlUnavailable(f"NVML lost the driver: {exc}"))
            self._once(f"{fn}:{code}", "nvml: %s: %s (%s); value unknown", fn, exc, code)
            return UNKNOWN


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str

    @property
    def labels(self) -> dict[str, str]:
        return {"device": str(self.index), "uuid": self.uuid}


class NvmlCollector:
    """Per-GPU memory, utilization, temperature, power and XID events."""

    name = "nvml"

    def __init__(
        self,
        nvml: Nvml,
        *,
        engine_pids: Callable[[], Iterable[int]] | None = None,
        process_interval_s: float = 10.0,
        max_events_per_tick: int = 64,
    ) -> None:
        self.nvml = nvml
        self.engine_pids = engine_pids
        self.process_interval_s = process_interval_s
        self.max_events_per_tick = max_events_per_tick
        self._devices: list[_Device] | None = None
        self._event_set: Any = None
        self._xid: dict[tuple[int, int], int] = {}
        self._proc_samples: list[Sample] = []
        self._proc_next_at = 0.0

    # -- setup ---------------------------------------------------------------

    def _discover(self) -> list[_Device]:
        if self._devices is not None:
            return self._devices
        q = self.nvml.query
        count = q("nvmlDeviceGetCount")
        devices = []
        for i in range(count or 0):
            h = q("nvmlDeviceGetHandleByIndex", i)
            if h is UNKNOWN:
                continue
            uuid = q("nvmlDeviceGetUUID", h)
            devices.append(_Device(i, h, "" if uuid is UNKNOWN else _text(uuid)))
        self._devices = devices
        self._setup_events(devices)
        return devices

    def _setup_events(self, devices: list[_Device]) -> None:
        mod = self.nvml.module
        es = self.nvml.query("nvmlEventSetCreate")
        if es is UNKNOWN or es is None:
            return
        xid_type = getattr(mod, "nvmlEventTypeXidCriticalError", 0x8)
        registered = 0
        for d in devices:
            if self.nvml.query("nvmlDeviceRegisterEvents", d.handle, xid_type, es) is not UNKNOWN:
                registered += 1
        self._event_set = es if registered else None

    def stop(self) -> None:
        if self._event_set is not None:
            try:
                self.nvml.query("nvmlEventSetFree", self._event_set)
            except NvmlUnavailable:
                pass
            self._event_set = None
        self.nvml.shutdown()

    # -- per tick ------------------------------------------------------------

    def collect(self, now: float) -> list[Sample]:
        try:
            return self._collect(now)
        except NvmlUnavailable:
            # Handles die with the driver: discover again once NVML is back.
            self._devices, self._event_set = None, None
            raise

    def _collect(self, now: float) -> list[Sample]:
        devices = self._discover()
        q = self.nvml.query
        out: list[Sample] = []
        temp_sensor = getattr(self.nvml.module, "NVML_TEMPERATURE_GPU", 0)
        for d in devices:
            lp = label_pairs(d.labels)
            mem = q("nvmlDeviceGetMemoryInfo", d.handle)
            if mem is not UNKNOWN:
                out.append(Sample("kcops_device_memory_used_bytes", lp, float(mem.used)))
                out.append(Sample("kcops_device_memory_total_bytes", lp, float(mem.total)))
            util = q("nvmlDeviceGetUtilizationRates", d.handle)
            if util is not UNKNOWN:
                out.append(Sample("kcops_gpu_utilization_ratio", lp, util.gpu / 100.0))
            temp = q("nvmlDeviceGetTemperature", d.handle, temp_sensor)
            if temp is not UNKNOWN:
                out.append(Sample("kcops_gpu_temperature_celsius", lp, float(temp)))
            power_mw = q("nvmlDeviceGetPowerUsage", d.handle)
            if power_mw is not UNKNOWN:
                out.append(Sample("kcops_gpu_power_watts", lp, power_mw / 1000.0))
        self._drain_events(devices)
        by_index = {d.index: d for d in devices}
        for (idx, xid), n in self._xid.items():
            labels = (
                {**by_index[idx].labels, "xid": str(xid)}
                if idx in by_index
                else {"device": str(idx), "uuid": "", "xid": str(xid)}
            )
            out.append(Sample.of("kcops_gpu_xid_errors_total", n, labels))
        out.extend(self._process_memory(now, devices))
        return out

    def _drain_events(self, devices: list[_Device]) -> None:
        if self._event_set is None:
            return
        for _ in range(self.max_events_per_tick):
            ev = self.nvml.query("nvmlEventSetWait", self._event_set, 0)
            if ev is None or ev is UNKNOWN:
                return
            idx = self.nvml.query("nvmlDeviceGetIndex", ev.device)
            if idx is UNKNOWN:
                idx = -1
            key = (int(idx), int(ev.eventData))
            self._xid[key] = self._xid.get(key, 0) + 1
            log.warning("GPU %s: XID %s", idx, ev.eventData)

    # -- per-process memory, sparingly ----------------------------------------

    def _process_memory(self, now: float, devices: list[_Device]) -> list[Sample]:
        """The engine's per-process GPU memory, re-read every ``process_interval_s``.

        The whole collector runs in its own thread (``InThread``), so this slow
        NVML call never runs on the agent's loop.
        """
        if self.engine_pids is None or now < self._proc_next_at:
            return self._proc_samples
        self._proc_next_at = now + self.process_interval_s
        pids = set(self.engine_pids())
        try:
            self._proc_samples = self._read_processes(devices, pids) if pids else []
        except NvmlUnavailable:
            raise
        except Exception as exc:
            log.warning("nvml per-process memory: %s", exc)
            self._proc_samples = []
        return self._proc_samples

    def _read_processes(self, devices: list[_Device], pids: set[int]) -> list[Sample]:
        out = []
        for d in devices:
            used: dict[int, int] = {}
            for fn in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses",
            ):
                procs = self.nvml.query(fn, d.handle)
                if procs is UNKNOWN or procs is None:
                    continue
                for p in procs:
                    mem = getattr(p, "usedGpuMemory", None)
                    if p.pid in pids and mem is not None:
                        used[p.pid] = max(used.get(p.pid, 0), int(mem))
            for pid, mem in used.items():
                out.append(
                    Sample.of("kcops_gpu_process_memory_bytes", mem, {**d.labels, "pid": str(pid)})
                )
        return out
