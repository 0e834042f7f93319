"""The replay backend: a recorded H200 answered through the pynvml API.

:class:`RecordedNvml` speaks the part of the ``pynvml`` API that :class:`~.nvml.NvmlBackend`
uses. Static answers, and the exact NVML error of every call or field that was NotSupported, come
from ``nvml_probe.json`` (recorded on a real H200); dynamic values come from one row of
``phase_trace.csv`` per :meth:`RecordedNvml.advance`. :class:`ReplayBackend` is the real NVML
backend over it, so a replay exercises the same query layer, field batching, GPM windows and
NotSupported handling as a real GPU. Optionally every call costs what it cost on the H200
(``latency=True``: the per-call medians recorded in the probe), which is what the bench's naive
exporter pays per scrape.

Several GPUs (and MIG instances) can be played from the one recorded GPU: GPU ``i`` plays the trace
shifted by ``i * rows / gpus`` rows, so the GPUs of a replayed node sit in different phases.
"""

from __future__ import annotations

import csv
import ctypes
import itertools
import json
import math
import queue
import re
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Sequence

import pynvml  # nvidia-ml-py; importing it does not load libnvidia-ml

from gpuwarden.fleet import GpuReading

from .nvml import NVML_EVENT_TYPE_XID, NvmlBackend

MIB = 1024**2

# Columns of phase_trace.csv the recorded NVML answers from; every other column but `phase` must
# be numeric too. NaN is allowed only in GPM columns (the first GPM window has no value).
TRACE_COLUMNS = (
    "gpu_util", "mem_util", "mem_used_mib", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz",
    "clocks_event_reasons", "energy_mj", "n_procs",
    "gpm_graphics_util", "gpm_sm_util", "gpm_sm_occupancy", "gpm_any_tensor_util", "gpm_dram_bw_util",
)
_TEXT_COLUMNS = frozenset({"phase"})
_GPM_COLUMNS = {1: "gpm_graphics_util", 2: "gpm_sm_util", 3: "gpm_sm_occupancy", 5: "gpm_any_tensor_util",
                10: "gpm_dram_bw_util"}

# Probe latency keys -> the NVML function they timed.
LATENCY_FUNCTIONS = {
    "utilization": "nvmlDeviceGetUtilizationRates",
    "memory": "nvmlDeviceGetMemoryInfo",
    "memory_v2": "nvmlDeviceGetMemoryInfo_v2",  # not in the probe: costed as v1 (same driver path)
    "power": "nvmlDeviceGetPowerUsage",
    "temperature": "nvmlDeviceGetTemperature",
    "clock_sm": "nvmlDeviceGetClockInfo",
    "clocks_event_reasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "procs": "nvmlDeviceGetComputeRunningProcesses",
    "field_values_10": "nvmlDeviceGetFieldValues",
    "gpm_sample": "nvmlGpmSampleGet",
    "energy": "nvmlDeviceGetTotalEnergyConsumption",
    "pcie_throughput": "nvmlDeviceGetPcieThroughput",
}


class ReplayError(ValueError):
    """A replay file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class TraceRow:
    line: int
    phase: str
    values: Mapping[str, float]


def load_trace(path: str | Path) -> tuple[TraceRow, ...]:
    """Read and check a phase trace; a bad row raises :class:`ReplayError` with its line number."""
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as error:
        raise ReplayError(f"{path}: cannot read the replay trace ({error.strerror or error})") from None
    rows: list[TraceRow] = []
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header:
            raise ReplayError(f"{path}:1: empty file; expected a header with {', '.join(TRACE_COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise ReplayError(f"{path}:1: missing column(s) {', '.join(missing)}")
        for line, cells in enumerate(reader, start=2):
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise ReplayError(f"{path}:{line}: {len(cells)} fields, expected {len(header)}")
            values: dict[str, float] = {}
            phase = ""
            for name, cell in zip(header, cells):
                if name in _TEXT_COLUMNS:
                    phase = cell
                    continue
                try:
                    number = float(cell)
                except ValueError:
                    raise ReplayError(f"{path}:{line}: column {name!r}: {cell!r} is not a number") from None
                if math.isinf(number) or (math.isnan(number) and not name.startswith("gpm_")):
                    raise ReplayError(f"{path}:{line}: column {name!r}: {cell!r} is not a finite number")
                if not math.isnan(number) and number < 0 and name != "t":
                    raise ReplayError(f"{path}:{line}: column {name!r}: {cell!r} is negative")
                values[name] = number
            rows.append(TraceRow(line, phase, values))
    if not rows:
        raise ReplayError(f"{path}: no data rows")
    return tuple(rows)


def load_probe(path: str | Path) -> dict[str, Any]:
    """Read ``nvml_probe.json``: ``driver`` and ``device0`` answers are required."""
    path = Path(path)
    try:
        probe = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ReplayError(f"{path}: cannot read the NVML probe ({error.strerror or error})") from None
    except json.JSONDecodeError as error:
        raise ReplayError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    for key in ("driver", "device0"):
        if not isinstance(probe, dict) or key not in probe:
            raise ReplayError(f"{path}: missing {key!r}; expected an nvml_probe.json recording")
    for key in ("name", "uuid", "memory"):
        if not probe["device0"].get(key, {}).get("ok"):
            raise ReplayError(f"{path}: device0.{key} must be a recorded value")
    return probe


_ERROR_CODES = {cls.__name__: code for code, cls in pynvml.NVMLError._valClassMapping.items()}


def _recorded_error(text: str) -> pynvml.NVMLError:
    """``"NVMLError_NotSupported: Not Supported"`` -> that NVMLError."""
    name = text.split(":", 1)[0].strip()
    return pynvml.NVMLError(_ERROR_CODES.get(name, pynvml.NVML_ERROR_UNKNOWN))


@dataclass(frozen=True)
class RecordedHandle:
    index: int
    mig_slot: int | None = None


class RecordedNvml:
    """A recorded NVML that speaks the pynvml API (constants and error classes are pynvml's own).

    ``lost``: GPU indices whose every call fails with NVML_ERROR_GPU_IS_LOST.
    ``inject_xid(index, code)``: deliver an XID event to the registered event sets.
    ``before_call(name, handle)``: a hook run before each call (tests use it to make one hang).
    ``processes[index]``: the compute processes GPU ``index`` reports, as ``[(pid, used bytes or
    None)]``, or an NVML error code that ``nvmlDeviceGetComputeRunningProcesses`` raises (e.g.
    ``NVML_ERROR_NOT_SUPPORTED``); GPUs not in it answer from the trace (``n_procs``) or the probe.
    Functions it does not implement raise NVML_ERROR_FUNCTION_NOT_FOUND, as an older driver would.
    """

    def __init__(self, probe: Mapping[str, Any], rows: Sequence[TraceRow] = (), *, gpus: int = 1,
                 mig_profiles: Sequence[str] = (), latency: bool = False,
                 spin: Callable[[float], None] | None = None):
        if gpus < 0:
            raise ValueError("gpus must be >= 0")
        self.probe = probe
        self.device = probe["device0"]
        self.rows = tuple(rows) or (TraceRow(0, "probe", {}),)
        self.gpus = gpus
        self.mig_profiles = tuple(mig_profiles)
        self.cursor = 0
        self.lost: set[int] = set()
        self.processes: dict[int, Sequence[tuple[int, int | None]] | int] = {}
        self.mps_processes: dict[int, Sequence[tuple[int, int | None]] | int] = {}  # MPS clients, as processes
        self.memory_v2 = True  # False: nvmlDeviceGetMemoryInfo_v2 is missing, as on an older driver
        self.latency_s: dict[str, float] = {}
        if latency:
            for key, function in LATENCY_FUNCTIONS.items():
                median = probe.get("latency_idle", {}).get(key, {}).get("median_us")
                if median is not None:
                    self.latency_s[function] = float(median) / 1e6
            self.latency_s.setdefault("nvmlGpmMigSampleGet", self.latency_s.get("nvmlGpmSampleGet", 0.0))
            self.latency_s.setdefault("nvmlDeviceGetMemoryInfo_v2", self.latency_s.get("nvmlDeviceGetMemoryInfo", 0.0))
            self.latency_s.setdefault("nvmlDeviceGetMPSComputeRunningProcesses",
                                      self.latency_s.get("nvmlDeviceGetComputeRunningProcesses", 0.0))
        self._spin = spin or _spin
        self._fields = {entry["id"]: entry for entry in self.device.get("field_values", {}).values()}
        self._tokens = itertools.count(0x1000, 0x10)
        self._samples: dict[int, tuple[int, int | None, TraceRow | None]] = {}
        self._event_sets: dict[int, queue.Queue] = {}
        self._registered: dict[int, set[int]] = {}  # event set -> GPU indices
        self._lock = threading.Lock()
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
        return [1, 1] if self.mig_profiles else list(recorded)

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
        token = next(self._tokens)
        with self._lock:
            self._samples[token] = (-1, None, None)
        return ctypes.cast(ctypes.c_void_p(token), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        with self._lock:
            self._samples.pop(_token(sample), None)

    def _take(self, handle: RecordedHandle, instance: int | None, sample: Any) -> Any:
        if not self._static("gpm_support").get("isSupportedDevice"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        token = _token(sample)
        with self._lock:
            if token not in self._samples:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._samples[token] = (handle.index, instance, self.row(handle.index))
        return sample

    def nvmlGpmSampleGet(self, handle: RecordedHandle, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", handle)
        return self._take(handle, None, sample)

    def nvmlGpmMigSampleGet(self, handle: RecordedHandle, instance: int, sample: Any) -> Any:
        self._enter("nvmlGpmMigSampleGet", handle)
        return self._take(handle, instance, sample)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        with self._lock:
            first = self._samples.get(_token(request.sample1))
            second = self._samples.get(_token(request.sample2))
        if first is None or second is None or first[2] is None or second[2] is None or first[:2] != second[:2]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        row = second[2]
        for i in range(int(request.numMetrics)):
            metric = request.metrics[i]
            column = _GPM_COLUMNS.get(int(metric.metricId))
            value = row.values.get(column) if column else None
            if value is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            metric.value = value  # NaN (no window yet) stays NaN, as NVML returns it
        return request

    # -- events ---------------------------------------------------------------------------------
    def nvmlDeviceGetSupportedEventTypes(self, handle: RecordedHandle) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", handle)
        return int(self._static("supported_events"))

    def nvmlEventSetCreate(self) -> int:
        self._enter("nvmlEventSetCreate")
        token = next(self._tokens)
        with self._lock:
            self._event_sets[token] = queue.Queue()
            self._registered[token] = set()
        return token

    def nvmlDeviceRegisterEvents(self, handle: RecordedHandle, event_types: int, event_set: int) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        if not int(self._static("supported_events")) & event_types:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            self._registered[event_set].add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait_v2")
        events = self._event_sets.get(event_set)
        if events is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        try:
            return events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetWait(self, event_set: int, timeout_ms: int) -> SimpleNamespace:
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlEventSetFree(self, event_set: int) -> None:
        with self._lock:
            self._event_sets.pop(event_set, None)
            self._registered.pop(event_set, None)

    def inject_xid(self, index: int, code: int, gpu_instance: int = 0xFFFFFFFF) -> int:
        """Deliver XID ``code`` of GPU ``index`` to every event set registered for it; returns how many."""
        delivered = 0
        with self._lock:
            for event_set, indices in self._registered.items():
                if index in indices:
                    self._event_sets[event_set].put(SimpleNamespace(
                        device=RecordedHandle(index), eventType=NVML_EVENT_TYPE_XID, eventData=code,
                        gpuInstanceId=gpu_instance, computeInstanceId=0xFFFFFFFF))
                    delivered += 1
        return delivered


def _token(sample: Any) -> int | None:
    return ctypes.cast(sample, ctypes.c_void_p).value


def _spin(seconds: float) -> None:
    """Busy-wait: time.sleep cannot wait a few microseconds, and NVML calls do not sleep either."""
    if seconds >= 0.002:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class ReplayBackend(NvmlBackend):
    """The NVML backend over a recorded H200: plays one trace row per collection.

    ``gpus`` GPUs (each shifted along the trace), each with ``mig_profiles`` MIG instances when
    given; ``latency=True`` makes each NVML call cost its recorded median on the H200.
    """

    name = "replay"

    def __init__(self, node: str, trace: str | Path, probe: str | Path, *, gpus: int = 1,
                 mig_profiles: Sequence[str] = (), latency: bool = False, loop: bool = True,
                 clock: Callable[[], float] = time.time, xid_events: bool = True, xid_wait_ms: int = 15000,
                 processes: bool = True):
        rows = load_trace(trace)
        self.recorded = RecordedNvml(load_probe(probe), rows, gpus=gpus, mig_profiles=mig_profiles, latency=latency)
        self.loop = loop
        self.plays = 0
        super().__init__(node, nvml=self.recorded, clock=clock, xid_events=xid_events, xid_wait_ms=xid_wait_ms,
                         processes=processes)

    def read(self) -> tuple[GpuReading, ...]:
        readings = super().read()
        self.plays += 1
        if self.loop or self.recorded.cursor + 1 < len(self.recorded.rows):
            self.recorded.advance()
        return readings

    @property
    def phase(self) -> str:
        """The phase GPU 0 plays next."""
        return self.recorded.row(0).phase
