"""Fault injection with ground truth kept apart from the samples.

Each kind says how often it happens (a share of one Llama 3 root-cause category, so rates default
to published ones), whether it has precursors (and for how long before the fatal event), what it
does to the GPU's counters and clocks while active, and what an operator should do about it.
The engine asks :class:`FaultInjector` for the events that start in each step; ground truth is a
separate table (``ground_truth()``) that never enters the fleet samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from .config import LLAMA3_GPU_DAYS, LLAMA3_INTERRUPTIONS, SimConfig

HOUR = 3600.0


@dataclass(frozen=True)
class FaultKind:
    name: str
    category: str  # a LLAMA3_INTERRUPTIONS key, or "" for kinds with their own rate
    category_share: float  # share of that category's interruptions
    xid: int | None  # XID logged at the fatal (or start) event
    kills_job: bool  # the workload on the GPU dies at the event
    takes_gpu_down: bool  # the GPU is unusable until repaired
    precursor_hours: tuple[float, float]  # (min, max) warning time before the event; (0, 0) for none
    active_hours: tuple[float, float]  # how long a non-fatal condition lasts, or the repair time
    expected_action: str  # none | restart-app | reset-gpu | drain-and-reset | reboot | replace | inspect
    own_rate_per_gpu_day: float = 0.0  # for kinds outside the Llama 3 table


KINDS: dict[str, FaultKind] = {
    kind.name: kind
    for kind in (
        # HBM: single-bit errors climb, then a double-bit error (XID 48) kills the job.
        FaultKind("ecc_dbe", "gpu_hbm3_memory", 0.5, 48, True, True, (2, 24), (4, 12), "drain-and-reset"),
        FaultKind("row_remap_failure", "gpu_hbm3_memory", 0.2, 64, True, True, (1, 12), (12, 48), "replace"),
        FaultKind("row_remap_pending", "gpu_hbm3_memory", 0.3, 63, False, False, (0, 0), (1, 6), "reset-gpu"),
        FaultKind("xid79_off_bus", "faulty_gpu", 0.4, 79, True, True, (0.5, 2), (4, 24), "reboot"),
        FaultKind("xid95_uncontained_ecc", "faulty_gpu", 0.2, 95, True, True, (0, 0), (1, 3), "drain-and-reset"),
        FaultKind("pcie_replay_storm", "faulty_gpu", 0.2, None, False, False, (0, 0), (1, 6), "inspect"),
        FaultKind("straggler", "faulty_gpu", 0.2, None, False, False, (0, 0), (6, 72), "replace"),
        FaultKind("xid94_contained_ecc", "gpu_sram_memory", 1.0, 94, True, False, (0, 0), (0, 0), "restart-app"),
        FaultKind("xid119_gsp_timeout", "gpu_system_processor", 1.0, 119, True, True, (0, 0), (0.5, 1.5), "reset-gpu"),
        FaultKind("silent_straggler", "silent_data_corruption", 1.0, None, False, False, (0, 0), (12, 72), "replace"),
        FaultKind("thermal_throttle", "gpu_thermal_interface", 1.0, None, False, False, (0, 0), (1, 12), "inspect"),
        # Not in the Llama 3 table: assumed as frequent as thermal faults.
        FaultKind("power_brake", "", 0.0, None, False, False, (0, 0), (0.5, 6), "inspect",
                  own_rate_per_gpu_day=LLAMA3_INTERRUPTIONS["gpu_thermal_interface"] / LLAMA3_GPU_DAYS),
        # A GPU whose clock sags to ~0.78x at unchanged power (no throttle reason, no XID).
        FaultKind("clock_straggler", "", 0.0, None, False, False, (0, 0), (6, 48), "replace",
                  own_rate_per_gpu_day=LLAMA3_INTERRUPTIONS["gpu_thermal_interface"] / LLAMA3_GPU_DAYS),
        # Cooling failing (fan, heatsink, cold plate): the GPU warms by ~25 C over hours at the
        # same load, then thermal slowdown.
        FaultKind("cooling_failure", "", 0.0, None, False, False, (2, 8), (1, 6), "inspect",
                  own_rate_per_gpu_day=LLAMA3_INTERRUPTIONS["gpu_thermal_interface"] / LLAMA3_GPU_DAYS),
        # An NVLink degrading: CRC / replay errors climb, then XID 74 and a GPU reset.
        FaultKind("nvlink_degrading", "faulty_gpu", 0.1, 74, True, True, (2, 10), (0.5, 2), "reset-gpu"),
    )
}
# XIDs an application causes itself (they must never cordon a GPU); per allocated GPU-day.
APPLICATION_XIDS = (13, 31, 43, 45, 68)
APPLICATION_XID_RATE_PER_GPU_DAY = 0.002

NVLINK_COUNTERS = ("nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total", "nvlink_replay_errors_total",
                   "nvlink_recovery_errors_total")

# Ground truth rows the engine records (one per injected fault).
GROUND_TRUTH_COLUMNS = (
    "fault_id", "kind", "node", "gpu_uuid", "onset", "event_at", "ends_at", "xid", "fatal", "has_precursor",
    "expected_action", "observable",
)
# A slow GPU shows only while it works: a straggler needs this much loaded time to be observable.
SLOW_KINDS = ("straggler", "silent_straggler", "clock_straggler")
MIN_LOADED_SECONDS = 3600.0


def rate_per_gpu_day(kind: FaultKind, config: SimConfig) -> float:
    if kind.name in config.counts_overrides:
        return float(config.counts_overrides[kind.name])
    if kind.category:
        base = LLAMA3_INTERRUPTIONS[kind.category] * kind.category_share / LLAMA3_GPU_DAYS
    else:
        base = kind.own_rate_per_gpu_day
    return base * config.fault_rate_scale


@dataclass
class FaultEvent:
    fault_id: int
    kind: FaultKind
    gpu: int
    onset_s: float  # precursors start (== event_s when there are none)
    event_s: float  # the XID / fatal moment, or the start of a condition
    ends_s: float  # repaired, or the condition ends
    loaded_steps: int = 0  # steps of the condition with the GPU under load (a straggler shows only then)

    def active(self, now_s: float) -> bool:
        return self.onset_s <= now_s < self.ends_s


class FaultInjector:
    """Draws fault events as a Poisson process per kind, ``lookahead`` ahead of the clock so that
    precursors can start before the event they announce."""

    LOOKAHEAD_S = 48 * HOUR

    def __init__(self, config: SimConfig, gpu_count: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.gpu_count = gpu_count
        self.step_seconds = float(config.step_seconds)  # every fault lasts at least one step
        self.rates_per_second = {
            name: rate_per_gpu_day(kind, config) * gpu_count / 86400.0 for name, kind in KINDS.items()
        }
        self.next_event_s = {name: self._gap(name, 0.0) for name in KINDS}
        self.events: list[FaultEvent] = []
        self.busy_until = np.zeros(gpu_count)  # one fault at a time per GPU

    def _gap(self, name: str, after_s: float) -> float:
        rate = self.rates_per_second[name]
        return float("inf") if rate <= 0 else after_s + float(self.rng.exponential(1.0 / rate))

    def draw_until(self, now_s: float) -> list[FaultEvent]:
        """Create every event due before ``now_s + LOOKAHEAD_S``; returns the new ones."""
        created = []
        horizon = now_s + self.LOOKAHEAD_S
        for name, kind in KINDS.items():
            while self.next_event_s[name] <= horizon:
                event_s = self.next_event_s[name]
                self.next_event_s[name] = self._gap(name, event_s)
                precursor = float(self.rng.uniform(*kind.precursor_hours)) * HOUR
                if kind.name == "xid79_off_bus" and self.rng.random() < 0.5:
                    precursor = 0.0  # half fall off the bus with no PCIe warning
                onset = max(now_s, event_s - precursor)
                duration = float(self.rng.uniform(*kind.active_hours)) * HOUR if kind.active_hours[1] > 0 else 0.0
                duration = max(duration, self.step_seconds)
                free = np.flatnonzero(self.busy_until <= onset)
                if free.size == 0:
                    continue
                gpu = int(self.rng.choice(free))
                event = FaultEvent(len(self.events), kind, gpu, onset, max(event_s, onset), max(event_s, onset) + duration)
                self.busy_until[gpu] = event.ends_s
                self.events.append(event)
                created.append(event)
        return created

    def ground_truth(self, origin: datetime, gpus, nodes_of_gpu, until_s: float | None = None) -> list[dict]:
        rows = []
        for event in self.events:
            if until_s is not None and event.onset_s > until_s:
                continue
            rows.append(
                {
                    "fault_id": event.fault_id,
                    "kind": event.kind.name,
                    "node": nodes_of_gpu[event.gpu],
                    "gpu_uuid": gpus[event.gpu],
                    "onset": origin + timedelta(seconds=event.onset_s),
                    "event_at": origin + timedelta(seconds=event.event_s),
                    "ends_at": origin + timedelta(seconds=event.ends_s),
                    "xid": event.kind.xid,
                    "fatal": event.kind.kills_job,
                    "has_precursor": event.event_s > event.onset_s,
                    "expected_action": event.kind.expected_action,
                    "observable": (event.kind.name not in SLOW_KINDS
                                   or event.loaded_steps * self.step_seconds >= MIN_LOADED_SECONDS),
                }
            )
        return rows
