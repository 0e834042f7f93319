"""The recorded NVML: a real H200's answers through the pynvml API.

:class:`RecordedNvml` speaks the part of the ``pynvml`` API that :class:`~..nvml.NvmlBackend`
uses. Static answers, and the exact NVML error of every call or field that was NotSupported, come
from ``nvml_probe.json`` (recorded on a real H200); dynamic values come from one row of
``phase_trace.csv`` per :meth:`RecordedNvml.advance`. Optionally every call costs what it cost on
the H200 (``latency=True``: the per-call medians recorded in the probe), which is what the bench's
naive exporter pays per scrape.

Several GPUs (and MIG instances) can be played from the one recorded GPU: GPU ``i`` plays the trace
shifted by ``i * rows / gpus`` rows, so the GPUs of a replayed node sit in different phases.
"""

from __future__ import annotations

import itertools
import math
import re
import uuid as uuidlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py; importing it does not load libnvidia-ml

from .files import TraceRow
from .identity import RecordedIdentity
from .latency import busy_wait, call_costs_s
from .state import EventSets, GpmSamples

MIB = 1024**2

# The trace column each GPM metric id (``nvml.fields.GPM_METRICS``) answers from.
GPM_COLUMNS = {1: "gpm_graphics_util", 2: "gpm_sm_util", 3: "gpm_sm_occupancy", 5: "gpm_any_tensor_util",
               10: "gpm_dram_bw_util"}

_ERROR_CODES = {cls.__name__: code for code, cls in pynvml.NVMLError._valClassMapping.items()}


def _recorded_error(text: str) -> pynvml.NVMLError:
    """``"NVMLError_NotSupported: Not Supported"`` -> that NVMLError."""
    name = text.split(":", 1)[0].strip()
    return pynvml.NVMLError(_ERROR_CODES.get(name, pynvml.NVML_ERROR_UNKNOWN))


@dataclass(frozen=True)
class RecordedHandle:
    index: int
    mig_slot: int | None = None


class RecordedNvml(RecordedIdentity):
    """A recorded NVML that speaks the pynvml API (constants and error classes are pynvml's own).

    ``lost``: GPU indices whose every call fails with NVML_ERROR_GPU_IS_LOST.
    ``inject_xid(index, code)``: deliver an XID event to the registered event sets.
    ``before_call(name, handle)``: a hook run before each call (tests use it to make one hang).
    ``processes[index]``: the compute processes GPU ``index`` reports, as ``[(pid, used bytes or
    None)]``, or an NVML error code that ``nvmlDeviceGetComputeRunningProcesses`` raises (e.g.
    ``NVML_ERROR_NOT_SUPPORTED``); GPUs not in it answer from the trace (``n_procs``) or the probe.
    ``mig_gpus``: the GPUs with MIG on (every GPU when None and ``mig_profiles`` are given); minor
    numbers and GPU-instance placements (``minors``, ``gpu_instances_refused``): :mod:`.identity`.
    Functions it does not implement raise NVML_ERROR_FUNCTION_NOT_FOUND, as an older driver would.
    """

    def __init__(self, probe: Mapping[str, Any], rows: Sequence[TraceRow] = (), *, gpus: int = 1,
                 mig_profiles: Sequence[str] = (), latency: bool = False,
                 spin: Callable[[float], None] | None = None, mig_gpus: Collection[int] | None = None):
        if gpus < 0:
            raise ValueError("gpus must be >= 0")
        self.probe = probe
        self.device = probe["device0"]
        self.rows = tuple(rows) or (TraceRow(0, "probe", {}),)
        self.gpus = gpus
        self.mig_profiles = tuple(mig_profiles)
        self._init_identity(mig_gpus)  # minors, MIG mode per GPU (.identity)
        self.cursor = 0
        self.lost: set[int] = set()
        self.processes: dict[int, Sequence[tuple[int, int | None]] | int] = {}
        self.mps_processes: dict[int, Sequence[tuple[int, int | None]] | int] = {}  # MPS clients, as processes
        self.memory_v2 = True  # False: nvmlDeviceGetMemoryInfo_v2 is missing, as on an older driver
        self.latency_s: dict[str, float] = call_costs_s(probe) if latency else {}
        self._spin = spin or busy_wait
        self._fields = {entry["id"]: entry for entry in self.device.get("field_values", {}).values()}
        tokens = itertools.count(0x1000, 0x10)  # GPM sample and event set handles, never 0 (a null pointer)
        self._gpm = GpmSamples(tokens)
        self._events = EventSets(tokens)
        self.initialised = False

    # -- plumbing ------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") and not name.startswith("nvmlEventType"):
            def missing(*_args: Any) -> Any:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            missing.__name__ = name
            return missing
        return getattr(pynvml, name)  # constants, NVMLError classes, ctypes structures

    def before_call(self, name: str, handle: RecordedHandle | None) -> None:
        """Override in a test to make one call hang or fail."""

    def _enter(self, name: str, handle: RecordedHandle | None = None) -> None:
        cost = self.latency_s.get(name)
        if cost:
            self._spin(cost)
        self.before_call(name, handle)
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is not None and handle.index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def _static(self, key: str) -> Any:
        answer = self.device.get(key)
        if answer is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not answer.get("ok"):
            raise _recorded_error(answer.get("error", ""))
        return answer["value"]

    def row(self, index: int) -> TraceRow:
        stride = len(self.rows) // max(1, self.gpus)
        return self.rows[(self.cursor + index * stride) % len(self.rows)]

    def _value(self, handle: RecordedHandle, column: str, key: str | None = None) -> float:
        value = self.row(handle.index).values.get(column)
        if value is None or math.isnan(value):
            return self._static(key) if key else 0.0
        return value

    def advance(self) -> None:
        """Move every GPU on to its next trace row (wrapping at the end)."""
        self.cursor = (self.cursor + 1) % len(self.rows)

    # -- system ---------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.before_call("nvmlInit", None)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return str(self.probe["driver"]["value"])

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> RecordedHandle:
        handle = RecordedHandle(index)
        self._enter("nvmlDeviceGetHandleByIndex", handle)
        if not 0 <= index < self.gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle

    # -- identity -------------------------------------------------------------------------------
    def gpu_uuid(self, index: int) -> str:
        base = str(self.device["uuid"]["value"])
        if index == 0:
            return base
        return f"{base[:-4]}{(int(base[-4:], 16) + index) & 0xFFFF:04x}"

    def nvmlDeviceGetUUID(self, handle: RecordedHandle) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        gpu = self.gpu_uuid(handle.index)
        if handle.mig_slot is None:
            return gpu
        return f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{gpu}/{handle.mig_slot}')}"

    def nvmlDeviceGetName(self, handle: RecordedHandle) -> str:
        self._enter("nvmlDeviceGetName", handle)
        name = str(self._static("name"))
        return name if handle.mig_slot is None else f"{name} MIG {self.mig_profiles[handle.mig_slot]}"

    def nvmlDeviceGetPciInfo(self, handle: RecordedHandle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo", handle)
        pci = dict(self._static("pci"))
        bus = str(pci["busId"])
        head, _, tail = bus.rpartition(":")
        device, _, function = tail.partition(".")
        pci["busId"] = f"{head}:{int(device, 16) + handle.index:02X}.{function}"
        return SimpleNamespace(**pci)

    # -- readings -------------------------------------------------------------------------------
    def _mig_total(self, slot: int) -> int:
        match = re.search(r"(\d+)gb", self.mig_profiles[slot])
        return int(match.group(1)) * 1000**3 if match else 0

    def reserved_bytes(self) -> int:
        """Driver-reserved framebuffer memory, as ``nvmlDeviceGetMemoryInfo_v2`` reports it.

        A probe with a ``memory_v2`` answer gives it; otherwise it is the v1 "used" of the probe,
        which was recorded with no process on the GPU (``procs`` empty), so all of it was the
        driver's: 615.1 MiB, which the recorded ``nvidia-smi -q`` shows as Reserved 616 MiB, Used 0."""
        recorded = self.device.get("memory_v2")
        if recorded and recorded.get("ok"):
            return int(recorded["value"]["reserved"])
        return int(self._static("memory")["used"])

    def nvmlDeviceGetMemoryInfo(self, handle: RecordedHandle, version: int | None = None) -> SimpleNamespace:
        """v1 (``version`` None): used includes the reserved memory, as NVML's v1 call does; v2
        (``version=pynvml.nvmlMemory_v2``): used without it, and ``reserved`` besides. With
        ``memory_v2 = False`` the v2 function is missing, as on an older driver."""
        if version:
            self._enter("nvmlDeviceGetMemoryInfo_v2", handle)
            if not self.memory_v2:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        else:
            self._enter("nvmlDeviceGetMemoryInfo", handle)
        memory = self._static("memory")
        used = int(self._value(handle, "mem_used_mib") * MIB) if self.rows[0].values else int(memory["used"])
        total = int(memory["total"])
        reserved = self.reserved_bytes()
        if handle.mig_slot is not None:
            total = self._mig_total(handle.mig_slot)
            used = min(total, used // max(1, len(self.mig_profiles)))
            reserved = 0
        if not version:
            return SimpleNamespace(total=total, used=used, free=total - used)
        used = max(0, used - reserved)
        return SimpleNamespace(version=version, total=total, reserved=reserved, used=used, free=total - reserved - used)

    def nvmlDeviceGetUtilizationRates(self, handle: RecordedHandle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        recorded = self._static("utilization")
        if handle.mig_slot is not None:  # NVML reports no utilisation for a MIG instance
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not self.rows[0].values:
            return SimpleNamespace(**recorded)
        return SimpleNamespace(gpu=int(self._value(handle, "gpu_util")), memory=int(self._value(handle, "mem_util")))

    def nvmlDeviceGetPowerUsage(self, handle: RecordedHandle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        recorded = self._static("power_usage_mw")
        return int(self._value(handle, "power_w") * 1000) if self.rows[0].values else int(recorded)

    def nvmlDeviceGetTemperature(self, handle: RecordedHandle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle)
        recorded = self._static("temp_gpu")
        return int(self._value(handle, "temp_c")) if self.rows[0].values else int(recorded)

    def nvmlDeviceGetClockInfo(self, handle: RecordedHandle, kind: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", handle)
        key, column = {pynvml.NVML_CLOCK_SM: ("clock_sm", "sm_clock_mhz"),
                       pynvml.NVML_CLOCK_MEM: ("clock_mem", "mem_clock_mhz")}.get(kind, ("", ""))
        if not key:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        recorded = self._static(key)
        return int(self._value(handle, column)) if self.rows[0].values else int(recorded)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: RecordedHandle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        recorded = self._static("clocks_event_reasons")
        return int(self._value(handle, "clocks_event_reasons")) if self.rows[0].values else int(recorded)

    def nvmlDeviceGetFieldValues(self, handle: RecordedHandle, field_ids: Sequence[int]) -> Any:
        self._enter("nvmlDeviceGetFieldValues", handle)
        out = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, field_id in zip(out, field_ids):
            slot.fieldId = field_id
            entry = self._fields.get(field_id)
            if entry is None:
                slot.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
                continue
            if not entry.get("ok"):
                slot.nvmlReturn = int(entry.get("ret", pynvml.NVML_ERROR_NOT_SUPPORTED))
                continue
            value = entry["value"]
            if field_id == 83 and self.rows[0].values:  # total energy (mJ) follows the trace
                value = self._value(handle, "energy_mj")
            slot.nvmlReturn = pynvml.NVML_SUCCESS
            slot.valueType = int(entry.get("type", 3))
            if slot.valueType == 0:
                slot.value.dVal = float(value)
            elif slot.valueType in (4, 5):
                slot.value.sllVal = int(value)
            else:
                slot.value.ullVal = int(value)
                slot.valueType = 3
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: RecordedHandle) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        injected = self.processes.get(handle.index)
        if isinstance(injected, int):
            raise pynvml.NVMLError(injected)
        if injected is not None:
            return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                    for pid, used in injected]
        recorded = self._static("procs")
        if not self.rows[0].values:
            return [SimpleNamespace(**p) for p in recorded]
        count = int(self._value(handle, "n_procs"))
        used = int(self._value(handle, "mem_used_mib") * MIB)
        return [SimpleNamespace(pid=40000 + 100 * handle.index + k, usedGpuMemory=used // max(1, count))
                for k in range(count)]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: RecordedHandle) -> list[SimpleNamespace]:
        """The MPS clients of ``mps_processes[index]`` (none by default: the H200 ran without MPS)."""
        self._enter("nvmlDeviceGetMPSComputeRunningProcesses", handle)
        injected = self.mps_processes.get(handle.index, ())
        if isinstance(injected, int):
            raise pynvml.NVMLError(injected)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, used in injected]

    # -- MIG ------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: RecordedHandle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        recorded = self._static("mig_mode")
        return [1, 1] if self.mig_on(handle.index) else list(recorded)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: RecordedHandle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        return len(self.mig_profiles)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: RecordedHandle, slot: int) -> RecordedHandle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not 0 <= slot < len(self.mig_profiles):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return RecordedHandle(handle.index, slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: RecordedHandle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig_slot is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig_slot + 7  # H100/H200 1g instances are numbered from 7 upwards

    # -- GPM ------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: RecordedHandle) -> SimpleNamespace:
        self._enter("nvmlGpmQueryDeviceSupport", handle)
        return SimpleNamespace(**self._static("gpm_support"))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        return self._gpm.alloc()

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._gpm.free(sample)

    def _take(self, handle: RecordedHandle, instance: int | None, sample: Any) -> Any:
        if not self._static("gpm_support").get("isSupportedDevice"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gpm.fill(sample, handle.index, instance, self.row(handle.index).values)

    def nvmlGpmSampleGet(self, handle: RecordedHandle, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", handle)
        return self._take(handle, None, sample)

    def nvmlGpmMigSampleGet(self, handle: RecordedHandle, instance: int, sample: Any) -> Any:
        self._enter("nvmlGpmMigSampleGet", handle)
        return self._take(handle, instance, sample)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        return self._gpm.metrics(request, GPM_COLUMNS)

    # -- events ---------------------------------------------------------------------------------
    def nvmlDeviceGetSupportedEventTypes(self, handle: RecordedHandle) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", handle)
        return int(self._static("supported_events"))

    def nvmlEventSetCreate(self) -> int:
        self._enter("nvmlEventSetCreate")
        return self._events.create()

    def nvmlDeviceRegisterEvents(self, handle: RecordedHandle, event_types: int, event_set: int) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        if not int(self._static("supported_events")) & event_types:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._events.register(event_set, handle.index)

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait_v2")
        return self._events.wait(event_set, timeout_ms)

    def nvmlEventSetWait(self, event_set: int, timeout_ms: int) -> SimpleNamespace:
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlEventSetFree(self, event_set: int) -> None:
        self._events.free(event_set)

    def inject_xid(self, index: int, code: int, gpu_instance: int = 0xFFFFFFFF) -> int:
        """Deliver XID ``code`` of GPU ``index`` to every event set registered for it; returns how many."""
        return self._events.deliver_xid(RecordedHandle(index), index, code, gpu_instance)
