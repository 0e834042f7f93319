"""The NVML GPU backend: every NVML call goes through one query function.

- :class:`NvmlQuery` is the only place that calls NVML. It initialises NVML lazily, turns an
  unsupported call or field into the :data:`NA` sentinel (an absent series, never a fake 0), logs
  each unknown function or unexpected error once, counts errors per GPU, and raises
  :class:`GpuLost` for ``NVML_ERROR_GPU_IS_LOST`` so that one GPU is marked lost while the others
  carry on.
- :class:`NvmlBackend` reads every GPU (and MIG instance) once per collection: cheap getters,
  ONE batched ``nvmlDeviceGetFieldValues`` call per GPU (ECC, remapped rows, PCIe replay, memory
  temperature, energy, recovery action), GPM activity from two consecutive samples, the XID
  counters an event thread keeps, and the GPU's running compute processes with their memory
  (``nvmlDeviceGetComputeRunningProcesses``, 9.7 us idle / 37 us busy on the H200), which the pod
  attribution step maps to pods on time-sliced GPUs. It never reads PCIe throughput (that call
  sleeps 20 ms).
- :class:`XidWatcher` waits on an NVML event set and feeds :class:`XidTracker`: monotonic
  per-code counters and last-seen timestamps (an identical XID seen twice counts twice).

``nvml`` (the ``pynvml`` module, or anything that speaks its API) and ``clock`` are constructor
parameters; tests and the replay backend hand in a recorded NVML.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from gpuwarden.fleet import TRACKED_XIDS, GpuReading

log = logging.getLogger("gpuwarden.exporter.nvml")

# NVML return codes (nvml.h; stable ABI).
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_NO_INSTANCE = 0xFFFFFFFF  # event data gpuInstanceId / computeInstanceId when no MIG instance is named

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_EVENT_TYPE_XID = 0x8  # nvmlEventTypeXidCriticalError

# Field ids read in the one nvmlDeviceGetFieldValues call per GPU: id -> (values key, scale).
FIELDS: dict[int, tuple[str, float]] = {
    3: ("ecc_sbe_volatile_total", 1.0),  # NVML_FI_DEV_ECC_SBE_VOL_TOTAL
    4: ("ecc_dbe_volatile_total", 1.0),  # NVML_FI_DEV_ECC_DBE_VOL_TOTAL
    82: ("memory_temperature_celsius", 1.0),  # NVML_FI_DEV_MEMORY_TEMP
    83: ("energy_joules_total", 1e-3),  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ)
    94: ("pcie_replay_total", 1.0),  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
    142: ("remapped_rows_correctable_total", 1.0),  # NVML_FI_DEV_REMAPPED_COR
    143: ("remapped_rows_uncorrectable_total", 1.0),  # NVML_FI_DEV_REMAPPED_UNC
    144: ("remapped_rows_pending", 1.0),  # NVML_FI_DEV_REMAPPED_PENDING
    145: ("remapped_rows_failure", 1.0),  # NVML_FI_DEV_REMAPPED_FAILURE
    230: ("recovery_action", 1.0),  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    # NVLink error counters, each already summed over the GPU's links by the driver; NotSupported on a
    # GPU without NVLink (the recorded H200), which leaves the series absent.
    38: ("nvlink_crc_flit_errors_total", 1.0),  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    45: ("nvlink_crc_data_errors_total", 1.0),  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
    52: ("nvlink_replay_errors_total", 1.0),  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    59: ("nvlink_recovery_errors_total", 1.0),  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
}
_FIELD_IDS = list(FIELDS)

# GPM metric ids (percent 0-100 in NVML) -> values key (ratio 0-1, as DCGM's PROF fields).
GPM_METRICS: dict[int, str] = {
    1: "graphics_active_ratio",  # NVML_GPM_METRIC_GRAPHICS_UTIL -> DCGM_FI_PROF_GR_ENGINE_ACTIVE
    2: "sm_active_ratio",  # NVML_GPM_METRIC_SM_UTIL -> DCGM_FI_PROF_SM_ACTIVE
    3: "sm_occupancy_ratio",  # NVML_GPM_METRIC_SM_OCCUPANCY -> DCGM_FI_PROF_SM_OCCUPANCY
    5: "tensor_active_ratio",  # NVML_GPM_METRIC_ANY_TENSOR_UTIL -> DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    10: "dram_active_ratio",  # NVML_GPM_METRIC_DRAM_BW_UTIL -> DCGM_FI_PROF_DRAM_ACTIVE
}
NVML_GPM_METRICS_GET_VERSION = 1

# Calls the exporter must never make on the collection path.
FORBIDDEN_CALLS = frozenset({"nvmlDeviceGetPcieThroughput", "nvmlDeviceGetTotalEnergyConsumption"})

_MIG_PROFILE = re.compile(r"(\d+c\.)?\d+g\.\d+gb(\+\w+)?")


class _NotAvailable:
    """The one sentinel for "NVML cannot tell": it becomes an absent series."""

    _instance: "_NotAvailable | None" = None

    def __new__(cls) -> "_NotAvailable":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NA"


NA: Any = _NotAvailable()


class NvmlUnavailable(RuntimeError):
    """NVML could not be initialised: no driver, no library, or no permission."""


class _Missing:
    """What :class:`NvmlQuery` returns for ``missing=`` callers when this NVML lacks the function."""


MISSING: Any = _Missing()


class GpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST from a call on one GPU."""


def _error_code(error: BaseException) -> int | None:
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlQuery:
    """The single gate to NVML. ``query(name, *args, device=key)`` calls ``nvml.<name>(*args)``.

    Returns :data:`NA` (or ``default``) when the call is unsupported, unknown to this driver, or
    fails; raises :class:`GpuLost` when the GPU is lost and :class:`NvmlUnavailable` when NVML
    cannot be initialised. Each unknown function, and each (function, error) pair, is logged once.
    """

    QUIET = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND})

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._init_lock = threading.Lock()
        self._initialised = False
        self._logged: set[tuple[str, object]] = set()
        self.errors: dict[str, int] = {}  # device key -> NVML errors (not NotSupported) so far
        self.calls: dict[str, int] = {}  # function name -> calls, for tests and the bench

    @property
    def nvml(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # nvidia-ml-py: importing does not load libnvidia-ml
            except ImportError as error:  # pragma: no cover - a declared dependency
                raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({error})") from None
            self._nvml = pynvml
        return self._nvml

    @property
    def initialised(self) -> bool:
        return self._initialised

    def init(self) -> None:
        """Initialise NVML once; raise :class:`NvmlUnavailable` with NVML's own reason."""
        if self._initialised:
            return
        with self._init_lock:
            if self._initialised:
                return
            nvml = self.nvml
            try:
                nvml.nvmlInit()
            except Exception as error:  # noqa: BLE001 (NVMLError, OSError from ctypes...)
                raise NvmlUnavailable(f"{type(error).__name__}: {error}") from None
            self._initialised = True
            log.info("nvml initialised")

    def shutdown(self) -> None:
        with self._init_lock:
            if self._initialised:
                try:
                    self.nvml.nvmlShutdown()
                except Exception as error:  # noqa: BLE001
                    log.debug("nvmlShutdown failed: %s", error)
                self._initialised = False

    def _once(self, key: tuple[str, object], level: int, message: str, *args: object) -> None:
        if key in self._logged:
            return
        self._logged.add(key)
        log.log(level, message, *args)

    def count_error(self, device: str | None) -> None:
        if device is not None:
            self.errors[device] = self.errors.get(device, 0) + 1

    def __call__(self, name: str, *args: Any, device: str | None = None, default: Any = NA,
                 expected: Iterable[int] = (), missing: Any = None) -> Any:
        """``missing``: returned instead of ``default`` (and not logged) when this library or driver
        lacks the function, so that a caller can fall back to an older call."""
        if name in FORBIDDEN_CALLS:
            raise ValueError(f"{name} must not be called on the collection path")
        self.init()
        nvml = self.nvml
        function = getattr(nvml, name, None)
        if function is None:
            if missing is not None:
                return missing
            self._once((name, "missing"), logging.WARNING, "nvml: %s is unknown to this nvidia-ml-py; treated as unsupported", name)
            return default
        self.calls[name] = self.calls.get(name, 0) + 1
        try:
            return function(*args)
        except nvml.NVMLError as error:
            code = _error_code(error)
            if code == NVML_ERROR_GPU_IS_LOST:
                self.count_error(device)
                raise GpuLost(f"{name}: {error}") from None
            if code in self.QUIET or code in expected:
                self._once((name, code), logging.DEBUG, "nvml: %s -> %s (absent)", name, error)
                return default
            if missing is not None and code in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                return missing
            if code == NVML_ERROR_FUNCTION_NOT_FOUND:
                self._once((name, code), logging.WARNING, "nvml: %s is not in this driver's NVML; treated as unsupported", name)
                return default
            self.count_error(device)
            self._once((name, code), logging.WARNING, "nvml: %s failed on %s: %s (absent; logged once)", name, device, error)
            return default


# -- XID ---------------------------------------------------------------------------------------


@dataclass
class _XidState:
    counts: dict[int, int] = field(default_factory=dict)
    last_seen: dict[int, float] = field(default_factory=dict)
    last_code: int | None = None


class XidTracker:
    """Monotonic XID counters per GPU UUID and code, with the time each code was last seen.

    An XID NVML attributes to a MIG instance (event data ``gpuInstanceId``) counts on the parent GPU
    and on that instance; the instance's series start from 0 like the parent's when it is watched."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gpus: dict[tuple[str, int | None], _XidState] = {}
        self._watched: set[str] = set()

    def watch(self, uuid: str) -> None:
        """The GPU delivers XID events: its tracked codes are exported from 0 on."""
        with self._lock:
            self._watched.add(uuid)
            self._gpus.setdefault((uuid, None), _XidState())

    def record(self, uuid: str, code: int, when: float, gpu_instance: int | None = None) -> None:
        with self._lock:
            keys = [(uuid, None)] if gpu_instance is None else [(uuid, None), (uuid, gpu_instance)]
            for key in keys:
                state = self._gpus.setdefault(key, _XidState())
                state.counts[code] = state.counts.get(code, 0) + 1
                state.last_seen[code] = when
                state.last_code = code

    def values(self, uuid: str, gpu_instance: int | None = None) -> dict[str, float]:
        """``xid_<code>_total``, ``xid_<code>_last_seen_timestamp_seconds`` and ``xid_last_code`` of
        a GPU, or of one of its MIG instances (``gpu_instance``)."""
        with self._lock:
            state = self._gpus.get((uuid, gpu_instance))
            watched = uuid in self._watched
            if state is None and not watched:
                return {}
            out: dict[str, float] = {}
            if watched:
                out.update({f"xid_{code}_total": 0.0 for code in TRACKED_XIDS})
                out["xid_last_code"] = float(state.last_code or 0) if state else 0.0
            elif state.last_code is not None:  # type: ignore[union-attr]
                out["xid_last_code"] = float(state.last_code)  # type: ignore[union-attr]
            if state is not None:
                for code, count in state.counts.items():
                    out[f"xid_{code}_total"] = float(count)
                    out[f"xid_{code}_last_seen_timestamp_seconds"] = state.last_seen[code]
            return out


class XidWatcher:
    """A daemon thread waiting on one NVML event set for XID events of all GPUs."""

    def __init__(self, query: NvmlQuery, tracker: XidTracker, clock: Callable[[], float] = time.time,
                 wait_ms: int = 15000):
        self.query = query
        self.tracker = tracker
        self.clock = clock
        self.wait_ms = wait_ms
        self._event_set: Any = NA
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered: set[str] = set()

    def register(self, handle: Any, uuid: str) -> bool:
        """Ask for XID events of one GPU; False (and no XID series) where unsupported."""
        if uuid in self.registered:
            return True
        if self._event_set is NA:
            self._event_set = self.query("nvmlEventSetCreate")
            if self._event_set is NA:
                return False
        ok = self.query("nvmlDeviceRegisterEvents", handle, NVML_EVENT_TYPE_XID, self._event_set, device=uuid, default=False)
        if ok is False:
            return False
        self.registered.add(uuid)
        self.tracker.watch(uuid)
        self._ensure_thread()
        return True

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpuwarden-exporter-xid", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        log.info("xid event thread started")
        while not self._stop.is_set():
            try:
                data = self.query("nvmlEventSetWait_v2", self._event_set, self.wait_ms, expected=(NVML_ERROR_TIMEOUT,))
            except GpuLost as error:
                log.warning("xid event wait: %s", error)
                self._stop.wait(self.wait_ms / 1000)
                continue
            except Exception as error:  # noqa: BLE001 (keep the thread alive)
                log.warning("xid event wait failed: %s", error)
                self._stop.wait(self.wait_ms / 1000)
                continue
            if data is NA:
                continue
            if not int(getattr(data, "eventType", 0)) & NVML_EVENT_TYPE_XID:
                continue
            try:
                uuid = _text(self.query("nvmlDeviceGetUUID", data.device, default=""))
            except GpuLost:
                uuid = ""
            code = int(data.eventData)
            instance = getattr(data, "gpuInstanceId", NVML_NO_INSTANCE)
            instance = None if not isinstance(instance, int) or instance == NVML_NO_INSTANCE else instance
            self.tracker.record(uuid, code, self.clock(), instance)
            log.warning("xid %d on %s%s", code, uuid or "an unknown GPU",
                        "" if instance is None else f" (MIG GPU instance {instance})")
        log.info("xid event thread stopped")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread. It may sit in a long event wait: it is given ``timeout`` seconds (or
        less where the wait ends sooner), then left to exit on its own, holding its event set."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(min(timeout, 0.5, self.wait_ms / 1000 + 0.1))  # never hold a SIGTERM for a whole wait
            if thread.is_alive():
                log.debug("xid event thread still in its wait; leaving it to end with the process")
                self._event_set = NA
                return
        if self._event_set is not NA:
            try:
                self.query("nvmlEventSetFree", self._event_set)
            except GpuLost:
                pass
            self._event_set = NA


# -- the backend -------------------------------------------------------------------------------


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    model: str
    pci_bus_id: str
    gpm: bool
    window: "_GpmWindow" = field(default_factory=lambda: _GpmWindow())


@dataclass
class _GpmWindow:
    """Two GPM samples reused across collections: the last one taken, and a spare."""

    previous: Any = None
    spare: Any = None

    def samples(self) -> list[Any]:
        return [s for s in (self.previous, self.spare) if s is not None]


def _number(value: Any) -> float | None:
    if value is NA or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _field_value(entry: Any) -> float | None:
    kind = int(entry.valueType)
    union = entry.value
    raw = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind)
    return None if raw is None else _number(getattr(union, raw))


def _processes(procs: Iterable[Any]) -> Iterator[tuple[int, float | None]]:
    """(pid, used bytes or None where NVML cannot tell) of an NVML process list."""
    for proc in procs:
        pid = getattr(proc, "pid", None)
        if not isinstance(pid, int) or pid <= 0:
            continue
        used = _number(getattr(proc, "usedGpuMemory", None))
        known = used is not None and 0 <= used < 2**63  # 2**64-1 is NVML_VALUE_NOT_AVAILABLE
        yield pid, used if known else None


def mig_profile_from_name(name: str) -> str | None:
    """``NVIDIA H100 80GB HBM3 MIG 1g.10gb`` -> ``1g.10gb``."""
    match = _MIG_PROFILE.search(name.rsplit("MIG", 1)[-1])
    return match.group(0) if match else None


class NvmlBackend:
    """Read every GPU and MIG instance on this node through NVML (``GpuBackend`` protocol).

    ``read()`` raises :class:`NvmlUnavailable` when NVML cannot be initialised; a lost GPU gives
    a reading with ``lost=True`` and the others are read as usual.
    """

    name = "nvml"

    def __init__(self, node: str, *, nvml: Any = None, clock: Callable[[], float] = time.time,
                 xid_events: bool = True, gpm: bool = True, xid_wait_ms: int = 15000, processes: bool = True):
        self.node = node
        self.processes_enabled = processes
        self.query = NvmlQuery(nvml)
        self.clock = clock
        self.gpm_enabled = gpm
        self.xids = XidTracker()
        self.watcher = XidWatcher(self.query, self.xids, clock, wait_ms=xid_wait_ms) if xid_events else None
        self._gpus: dict[int, _Gpu] = {}
        self._mig_windows: dict[tuple[str, int], _GpmWindow] = {}
        self._driver: str | None = None
        self._lock = threading.Lock()
        self._memory_v2 = True  # until this NVML turns out to lack nvmlDeviceGetMemoryInfo_v2
        self._mps_unsupported: set[str] = set()  # GPUs whose MPS process listing is NotSupported

    # -- lifecycle ----------------------------------------------------------------------------
    def open(self) -> "NvmlBackend":
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

    def driver_version(self) -> str:
        if self._driver is None:
            version = self.query("nvmlSystemGetDriverVersion")
            if version is NA:
                return ""
            self._driver = _text(version)
        return self._driver

    # -- reading ------------------------------------------------------------------------------
    def read(self) -> tuple[GpuReading, ...]:
        with self._lock:
            self.query.init()
            count = self.query("nvmlDeviceGetCount")
            if count is NA:
                raise RuntimeError("nvmlDeviceGetCount failed")
            readings: list[GpuReading] = []
            for index in range(int(count)):
                readings.extend(self._read_gpu(index))
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
        uuid = _text(q("nvmlDeviceGetUUID", handle, device=key, default=key))
        model = _text(q("nvmlDeviceGetName", handle, device=uuid, default="unknown"))
        pci = q("nvmlDeviceGetPciInfo", handle, device=uuid)
        pci_bus_id = "" if pci is NA else _text(getattr(pci, "busId", ""))
        gpm = False
        if self.gpm_enabled:
            support = q("nvmlGpmQueryDeviceSupport", handle, device=uuid)
            gpm = support is not NA and bool(getattr(support, "isSupportedDevice", 0))
        gpu = _Gpu(index, handle, uuid, model, pci_bus_id, gpm)
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
            values, migs = self._read_values(gpu)
            processes = self._read_processes(gpu)
        except GpuLost as error:
            log.warning("gpu %d (%s) is lost: %s", index, gpu.uuid if gpu else "?", error)
            uuid = gpu.uuid if gpu else f"gpu{index}"
            values = {**self.xids.values(uuid), "nvml_errors_total": float(self.query.errors.get(uuid, 0))}
            if gpu is not None:
                self._free(gpu.window)
                gpu.window = _GpmWindow()  # a GPU back from a reset starts a fresh GPM window
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
        for pid, used in _processes(procs):
            out[pid] = used
        # Under MPS the compute list shows the MPS server; NVML lists its clients (the pods' own
        # processes, each with its memory) separately. A client is kept once, with its own figure.
        if out and gpu.uuid not in self._mps_unsupported:  # no process at all: no MPS server, no client
            clients = self.query("nvmlDeviceGetMPSComputeRunningProcesses", gpu.handle, device=gpu.uuid)
            if clients is NA:
                self._mps_unsupported.add(gpu.uuid)
            else:
                for pid, used in _processes(clients):
                    out[pid] = used
        return tuple(out.items())

    def _read_values(self, gpu: _Gpu) -> tuple[dict[str, float], list[GpuReading]]:
        q, h, key = self.query, gpu.handle, gpu.uuid
        values: dict[str, float] = {}

        def put(name: str, value: Any, scale: float = 1.0) -> None:
            number = _number(value)
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
                    number = _number(value)
                    if number is not None:
                        values[name] = number
            return
        if memory is NA:
            return
        for name, value in (("mem_used_bytes", memory.used), ("mem_total_bytes", memory.total),
                            ("mem_reserved_bytes", memory.reserved), ("mem_free_bytes", memory.free)):
            number = _number(value)
            if number is not None:
                values[name] = number

    def _read_fields(self, gpu: _Gpu, values: dict[str, float]) -> None:
        entries = self.query("nvmlDeviceGetFieldValues", gpu.handle, _FIELD_IDS, device=gpu.uuid)
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
            number = _field_value(entry)
            if number is not None:
                values[name] = number * scale

    def _gpm(self, gpu: _Gpu, window: "_GpmWindow", gpu_instance: int | None) -> dict[str, float]:
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
            number = _number(metric.value)
            if number is not None:
                out[name] = min(1.0, max(0.0, number / 100.0))
        return out

    def _read_migs(self, gpu: _Gpu) -> list[GpuReading]:
        q, key = self.query, gpu.uuid
        mode = q("nvmlDeviceGetMigMode", gpu.handle, device=key)
        if mode is NA or not int(mode[0]):
            return []
        count = q("nvmlDeviceGetMaxMigDeviceCount", gpu.handle, device=key, default=0)
        readings = []
        for slot in range(int(count)):
            handle = q("nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, slot, device=key)
            if handle is NA:
                continue
            instance = q("nvmlDeviceGetGpuInstanceId", handle, device=key)
            name = _text(q("nvmlDeviceGetName", handle, device=key, default=""))
            values: dict[str, float] = {}
            self._read_memory(handle, key, values)
            util = q("nvmlDeviceGetUtilizationRates", handle, device=key)  # NotSupported on MIG today
            if util is not NA:
                values["gpu_util_ratio"] = float(util.gpu) / 100.0
            if gpu.gpm and instance is not NA:
                window = self._mig_windows.setdefault((gpu.uuid, int(instance)), _GpmWindow())
                values.update(self._gpm(gpu, window, int(instance)))
            if instance is not NA:
                values.update(self.xids.values(gpu.uuid, int(instance)))
            readings.append(GpuReading(
                node=self.node, gpu_uuid=gpu.uuid, gpu_index=gpu.index, model=gpu.model, pci_bus_id=gpu.pci_bus_id,
                mig_instance_id=None if instance is NA else int(instance), mig_profile=mig_profile_from_name(name),
                mig_uuid=_text(q("nvmlDeviceGetUUID", handle, device=key, default="")) or None,
                values=values,
            ))
        return readings
