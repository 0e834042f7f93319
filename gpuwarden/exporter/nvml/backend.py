"""The NVML GPU backend: :class:`NvmlBackend` reads every GPU (and MIG instance) once per collection.

Cheap getters, ONE batched ``nvmlDeviceGetFieldValues`` call per GPU (ECC, remapped rows, PCIe
replay, memory temperature, energy, recovery action; :data:`~.fields.FIELDS`), GPM activity from
two consecutive samples, the XID counters an event thread keeps (:mod:`.xid`), and the GPU's running
compute processes with their memory (``nvmlDeviceGetComputeRunningProcesses``, 9.7 us idle / 37 us
busy on the H200), which the pod attribution step maps to pods on time-sliced GPUs. It never reads
PCIe throughput (that call sleeps 20 ms). Every call goes through the query gate (:mod:`.query`).

``nvml`` (the ``pynvml`` module, or anything that speaks its API) and ``clock`` (the
:class:`~gpuwarden.fleet.clock.Clock` XID timestamps are read from) are constructor parameters; tests and the replay backend hand in a recorded NVML.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Collection
from typing import Any

from gpuwarden.fleet import GpuReading
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .codes import (
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_GPM_METRICS_GET_VERSION,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
)
from .fields import (
    FIELD_IDS,
    FIELDS,
    GPM_METRICS,
    as_number,
    field_number,
    mig_profile_from_name,
    process_memory,
)
from .identity import DeviceIdentity, IdentityReader
from .query import MISSING, NA, GpuLost, NvmlQuery, as_text
from .xid import XidTracker, XidWatcher

log = logging.getLogger("gpuwarden.exporter.nvml")


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    model: str
    pci_bus_id: str
    gpm: bool
    minor: int | None = None  # /dev/nvidia<minor>: the NVIDIA DRA driver names the GPU gpu-<minor>
    window: _GpmWindow = field(default_factory=lambda: _GpmWindow())


@dataclass
class _GpmWindow:
    """Two GPM samples reused across collections: the last one taken, and a spare."""

    previous: Any = None
    spare: Any = None

    def samples(self) -> list[Any]:
        return [s for s in (self.previous, self.spare) if s is not None]


class NvmlBackend:
    """Read every GPU and MIG instance on this node through NVML (``GpuBackend`` protocol).

    ``read()`` raises :class:`NvmlUnavailable` when NVML cannot be initialised; a lost GPU gives
    a reading with ``lost=True`` and the others are read as usual.
    """

    name = "nvml"

    def __init__(self, node: str, *, nvml: Any = None, clock: Clock = SYSTEM_CLOCK,
                 xid_events: bool = True, gpm: bool = True, xid_wait_ms: int = 15000, processes: bool = True):
        self.node = node
        self.processes_enabled = processes
        self.query = NvmlQuery(nvml)
        self.clock = clock
        self.gpm_enabled = gpm
        self.xids = XidTracker()
        self.watcher = XidWatcher(self.query, self.xids, clock, wait_ms=xid_wait_ms) if xid_events else None
        self.identity = IdentityReader(self.query)
        self._gpus: dict[int, _Gpu] = {}
        self._mig_windows: dict[tuple[str, int], _GpmWindow] = {}
        self._driver: str | None = None
        self._lock = threading.Lock()
        self._memory_v2 = True  # until this NVML turns out to lack nvmlDeviceGetMemoryInfo_v2
        self._mps_unsupported: set[str] = set()  # GPUs whose MPS process listing is NotSupported
        self._mig_util_unsupported: set[str] = set()  # GPUs whose MIG instances report no utilisation

    # -- lifecycle ----------------------------------------------------------------------------
    def open(self) -> NvmlBackend:
        """Initialise NVML now (``NvmlUnavailable`` when it cannot be) and start the XID thread."""
        self.query.init()
        self.driver_version()
        return self

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        for window in [g.window for g in self._gpus.values()] + list(self._mig_windows.values()):
            self._free(window)
        self._gpus.clear()
        self._mig_windows.clear()
        self.query.shutdown()

    def _free(self, window: _GpmWindow) -> None:
        for sample in window.samples():
            try:
                self.query("nvmlGpmSampleFree", sample)
            except GpuLost:
                pass
        window.previous = window.spare = None

    def device_identities(self) -> tuple[DeviceIdentity, ...]:
        """The latest collection's GPUs and MIG devices as the NVIDIA DRA driver names them."""
        return self.identity.identities

    def driver_version(self) -> str:
        if self._driver is None:
            version = self.query("nvmlSystemGetDriverVersion")
            if version is NA:
                return ""
            self._driver = as_text(version)
        return self._driver

    # -- reading ------------------------------------------------------------------------------
    def read(self) -> tuple[GpuReading, ...]:
        with self._lock:
            self.query.init()
            count = self.query("nvmlDeviceGetCount")
            if count is NA:
                raise RuntimeError("nvmlDeviceGetCount failed")
            readings: list[GpuReading] = []
            self.identity.begin()
            for index in range(int(count)):
                readings.extend(self._read_gpu(index))
            self.identity.end()
            for gone in set(self._gpus) - set(range(int(count))):
                self._gpus.pop(gone, None)
            return tuple(readings)

    def _identify(self, index: int) -> _Gpu:
        gpu = self._gpus.get(index)
        if gpu is not None:
            return gpu
        key = f"gpu{index}"
        q = self.query
        handle = q("nvmlDeviceGetHandleByIndex", index, device=key)
        if handle is NA:
            raise GpuLost(f"no handle for GPU {index}")
        uuid = as_text(q("nvmlDeviceGetUUID", handle, device=key, default=key))
        model = as_text(q("nvmlDeviceGetName", handle, device=uuid, default="unknown"))
        pci = q("nvmlDeviceGetPciInfo", handle, device=uuid)
        pci_bus_id = "" if pci is NA else as_text(getattr(pci, "busId", ""))
        gpm = False
        if self.gpm_enabled:
            support = q("nvmlGpmQueryDeviceSupport", handle, device=uuid)
            gpm = support is not NA and bool(getattr(support, "isSupportedDevice", 0))
        gpu = _Gpu(index, handle, uuid, model, pci_bus_id, gpm, self.identity.minor(handle, uuid))
        if self.watcher is not None:
            self.watcher.register(handle, uuid)
        self._gpus[index] = gpu
        log.info("gpu %d: %s %s (%s), gpm=%s", index, model, uuid, pci_bus_id, gpm)
        return gpu

    def _base(self, gpu: _Gpu | None, index: int, **kwargs: Any) -> GpuReading:
        return GpuReading(
            node=self.node, gpu_uuid=gpu.uuid if gpu else f"gpu{index}", gpu_index=index,
            model=gpu.model if gpu else "unknown", pci_bus_id=gpu.pci_bus_id if gpu else "", **kwargs,
        )

    def _read_gpu(self, index: int) -> list[GpuReading]:
        started = time.perf_counter()
        gpu = self._gpus.get(index)
        try:
            gpu = self._identify(index)
            self.identity.gpu(gpu.uuid, gpu.minor)
            values, migs = self._read_values(gpu)
            processes = self._read_processes(gpu)
        except GpuLost as error:
            log.warning("gpu %d (%s) is lost: %s", index, gpu.uuid if gpu else "?", error)
            uuid = gpu.uuid if gpu else f"gpu{index}"
            values = {**self.xids.values(uuid), "nvml_errors_total": float(self.query.errors.get(uuid, 0))}
            if gpu is not None:
                self._free(gpu.window)
                gpu.window = _GpmWindow()  # a GPU back from a reset starts a fresh GPM window
                self._drop_mig_windows(gpu.uuid, keep=())  # and so do its MIG instances,
                self._mig_util_unsupported.discard(gpu.uuid)  # which are asked for utilisation again
            return [self._base(gpu, index, lost=True, values=values)]
        values["collection_seconds"] = time.perf_counter() - started
        return [self._base(gpu, index, values=values, processes=processes), *migs]

    def _read_processes(self, gpu: _Gpu) -> tuple[tuple[int, float | None], ...] | None:
        """The GPU's compute processes: (pid, used bytes or None where NVML cannot tell).

        None when the call is unsupported or failed (pods on a shared GPU then keep the GPU-wide
        memory). pynvml gives ``usedGpuMemory=None`` for NVML_VALUE_NOT_AVAILABLE."""
        if not self.processes_enabled:
            return None
        procs = self.query("nvmlDeviceGetComputeRunningProcesses", gpu.handle, device=gpu.uuid)
        if procs is NA:
            return None
        out: dict[int, float | None] = {}
        for pid, used in process_memory(procs):
            out[pid] = used
        # Under MPS the compute list shows the MPS server; NVML lists its clients (the pods' own
        # processes, each with its memory) separately. A client is kept once, with its own figure.
        if out and gpu.uuid not in self._mps_unsupported:  # no process at all: no MPS server, no client
            clients = self.query("nvmlDeviceGetMPSComputeRunningProcesses", gpu.handle, device=gpu.uuid)
            if clients is NA:
                self._mps_unsupported.add(gpu.uuid)
            else:
                for pid, used in process_memory(clients):
                    out[pid] = used
        return tuple(out.items())

    def _read_values(self, gpu: _Gpu) -> tuple[dict[str, float], list[GpuReading]]:
        q, h, key = self.query, gpu.handle, gpu.uuid
        values: dict[str, float] = {}

        def put(name: str, value: Any, scale: float = 1.0) -> None:
            number = as_number(value)
            if number is not None:
                values[name] = number * scale

        util = q("nvmlDeviceGetUtilizationRates", h, device=key)
        if util is not NA:
            put("gpu_util_ratio", util.gpu, 0.01)
            put("mem_copy_util_ratio", util.memory, 0.01)
        self._read_memory(h, key, values)
        put("power_watts", q("nvmlDeviceGetPowerUsage", h, device=key), 1e-3)
        put("temperature_celsius", q("nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU, device=key))
        put("sm_clock_mhz", q("nvmlDeviceGetClockInfo", h, NVML_CLOCK_SM, device=key))
        put("mem_clock_mhz", q("nvmlDeviceGetClockInfo", h, NVML_CLOCK_MEM, device=key))
        put("throttle_reasons_bitmask", q("nvmlDeviceGetCurrentClocksEventReasons", h, device=key))
        self._read_fields(gpu, values)
        if gpu.gpm:
            values.update(self._gpm(gpu, gpu.window, None))
        values.update(self.xids.values(key))
        migs = self._read_migs(gpu)
        values["nvml_errors_total"] = float(self.query.errors.get(key, 0))
        return values, migs

    def _read_memory(self, handle: Any, key: str, values: dict[str, float]) -> None:
        """Framebuffer memory as nvidia-smi and DCGM count it.

        ``nvmlDeviceGetMemoryInfo_v2`` splits the driver-reserved memory out of "used" (615 MiB on
        an idle H200); the v1 call counts it as used, so every idle GPU would look as if it held
        memory. Where this driver or nvidia-ml-py lacks v2, v1 is read instead, logged once."""
        q = self.query
        version = getattr(q.nvml, "nvmlMemory_v2", None)
        memory: Any = MISSING
        if self._memory_v2 and version is not None:
            memory = q("nvmlDeviceGetMemoryInfo", handle, version, device=key, missing=MISSING)
        if memory is NA:  # v2 NotSupported on this device (a MIG instance, say): its v1 figures, quietly
            memory = MISSING
        elif memory is MISSING:
            if self._memory_v2:
                self._memory_v2 = False
                log.warning("nvml: nvmlDeviceGetMemoryInfo_v2 is not available (driver or nvidia-ml-py too old); "
                            "reading v1, whose used memory includes the driver-reserved memory and no "
                            "DCGM_FI_DEV_FB_RESERVED is exported")
        if memory is MISSING:
            memory = q("nvmlDeviceGetMemoryInfo", handle, device=key)
            if memory is not NA:
                for name, value in (("mem_used_bytes", memory.used), ("mem_total_bytes", memory.total)):
                    number = as_number(value)
                    if number is not None:
                        values[name] = number
            return
        if memory is NA:
            return
        for name, value in (("mem_used_bytes", memory.used), ("mem_total_bytes", memory.total),
                            ("mem_reserved_bytes", memory.reserved), ("mem_free_bytes", memory.free)):
            number = as_number(value)
            if number is not None:
                values[name] = number

    def _read_fields(self, gpu: _Gpu, values: dict[str, float]) -> None:
        entries = self.query("nvmlDeviceGetFieldValues", gpu.handle, FIELD_IDS, device=gpu.uuid)
        if entries is NA:
            return
        for entry in entries:
            name, scale = FIELDS.get(int(entry.fieldId), (None, 1.0))
            if name is None:
                continue
            code = int(entry.nvmlReturn)
            if code == NVML_ERROR_GPU_IS_LOST:
                self.query.count_error(gpu.uuid)
                raise GpuLost(f"field {entry.fieldId}: GPU is lost")
            if code != NVML_SUCCESS:
                if code not in NvmlQuery.QUIET and code != NVML_ERROR_INVALID_ARGUMENT:
                    self.query.count_error(gpu.uuid)
                continue
            number = field_number(entry)
            if number is not None:
                values[name] = number * scale

    def _gpm(self, gpu: _Gpu, window: _GpmWindow, gpu_instance: int | None) -> dict[str, float]:
        """Take one GPM sample; with the one of the previous collection, compute activity ratios.

        The first collection of a GPU has no window yet, so its GPM series are absent then."""
        q, key = self.query, gpu.uuid
        if window.spare is None:
            sample = q("nvmlGpmSampleAlloc", device=key)
            if sample is NA:
                return {}
            window.spare = sample
        current = window.spare
        if gpu_instance is None:
            got = q("nvmlGpmSampleGet", gpu.handle, current, device=key)
        else:
            got = q("nvmlGpmMigSampleGet", gpu.handle, gpu_instance, current, device=key)
        if got is NA:
            return {}
        previous = window.previous
        window.previous, window.spare = current, previous
        if previous is None:
            return {}
        request = q.nvml.c_nvmlGpmMetricsGet_t()
        request.version = NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = previous
        request.sample2 = current
        for i, metric in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric
        result = q("nvmlGpmMetricsGet", request, device=key)
        if result is NA:
            return {}
        out: dict[str, float] = {}
        for i, name in enumerate(GPM_METRICS.values()):
            metric = result.metrics[i]
            if int(metric.nvmlReturn) != NVML_SUCCESS:
                continue
            number = as_number(metric.value)
            if number is not None:
                out[name] = min(1.0, max(0.0, number / 100.0))
        return out

    def _read_migs(self, gpu: _Gpu) -> list[GpuReading]:
        q, key = self.query, gpu.uuid
        mode = q("nvmlDeviceGetMigMode", gpu.handle, device=key)
        if mode is NA or not int(mode[0]):
            self._drop_mig_windows(gpu.uuid, keep=())  # MIG turned off: its instances are gone
            return []
        count = q("nvmlDeviceGetMaxMigDeviceCount", gpu.handle, device=key, default=0)
        readings = []
        for slot in range(int(count)):
            handle = q("nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, slot, device=key)
            if handle is NA:
                continue
            instance = q("nvmlDeviceGetGpuInstanceId", handle, device=key)
            name = as_text(q("nvmlDeviceGetName", handle, device=key, default=""))
            values: dict[str, float] = {}
            self._read_memory(handle, key, values)
            if gpu.uuid not in self._mig_util_unsupported:  # NotSupported on MIG today: asked once per GPU
                util = q("nvmlDeviceGetUtilizationRates", handle, device=key)
                if util is NA:
                    self._mig_util_unsupported.add(gpu.uuid)
                else:
                    values["gpu_util_ratio"] = float(util.gpu) / 100.0
            if gpu.gpm and instance is not NA:
                window = self._mig_windows.setdefault((gpu.uuid, int(instance)), _GpmWindow())
                values.update(self._gpm(gpu, window, int(instance)))
            if instance is not NA:
                values.update(self.xids.values(gpu.uuid, int(instance)))
            instance_id, profile = None if instance is NA else int(instance), mig_profile_from_name(name)
            mig_uuid = as_text(q("nvmlDeviceGetUUID", handle, device=key, default="")) or None
            self.identity.mig(gpu.handle, gpu.uuid, gpu.minor, instance_id, mig_uuid, profile)
            readings.append(GpuReading(
                node=self.node, gpu_uuid=gpu.uuid, gpu_index=gpu.index, model=gpu.model, pci_bus_id=gpu.pci_bus_id,
                mig_instance_id=instance_id, mig_profile=profile, mig_uuid=mig_uuid, values=values,
            ))
        self._drop_mig_windows(gpu.uuid, keep={r.mig_instance_id for r in readings})
        return readings

    def _drop_mig_windows(self, uuid: str, keep: Collection[int | None]) -> None:
        """Free the GPM buffers of ``uuid``'s MIG instances not in ``keep`` (destroyed, or the GPU
        lost or reset): NVML's buffers are the exporter's to free, and a reconfigured GPU's old
        instance ids would otherwise hold them for the process's life."""
        for stale in [k for k in self._mig_windows if k[0] == uuid and k[1] not in keep]:
            self._free(self._mig_windows.pop(stale))
