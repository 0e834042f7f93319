"""XID errors: :class:`XidWatcher` waits on one NVML event set for the XID events of all GPUs and
feeds :class:`XidTracker`, which keeps monotonic per-code counters and last-seen timestamps (an
identical XID seen twice counts twice).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.fleet import TRACKED_XIDS
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .codes import NVML_ERROR_TIMEOUT, NVML_EVENT_TYPE_XID, NVML_NO_INSTANCE
from .query import NA, GpuLost, NvmlQuery, as_text

log = logging.getLogger("gpuwarden.exporter.nvml")


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

    def __init__(self, query: NvmlQuery, tracker: XidTracker, clock: Clock = SYSTEM_CLOCK,
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
                uuid = as_text(self.query("nvmlDeviceGetUUID", data.device, default=""))
            except GpuLost:
                uuid = ""
            code = int(data.eventData)
            instance = getattr(data, "gpuInstanceId", NVML_NO_INSTANCE)
            instance = None if not isinstance(instance, int) or instance == NVML_NO_INSTANCE else instance
            self.tracker.record(uuid, code, self.clock.time(), instance)
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
