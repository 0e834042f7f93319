"""What each NVML call cost on the recorded H200: the per-call medians in ``nvml_probe.json``,
spent again per call when a :class:`~.recorded.RecordedNvml` is made with ``latency=True`` (the
bench's naive exporter pays them per scrape)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

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


def call_costs_s(probe: Mapping[str, Any]) -> dict[str, float]:
    """NVML function name -> its recorded median cost in seconds; calls the probe did not time
    are costed as their closest timed sibling (same driver path)."""
    costs: dict[str, float] = {}
    for key, function in LATENCY_FUNCTIONS.items():
        median = probe.get("latency_idle", {}).get(key, {}).get("median_us")
        if median is not None:
            costs[function] = float(median) / 1e6
    costs.setdefault("nvmlGpmMigSampleGet", costs.get("nvmlGpmSampleGet", 0.0))
    costs.setdefault("nvmlDeviceGetMemoryInfo_v2", costs.get("nvmlDeviceGetMemoryInfo", 0.0))
    costs.setdefault("nvmlDeviceGetMPSComputeRunningProcesses", costs.get("nvmlDeviceGetComputeRunningProcesses", 0.0))
    return costs


def busy_wait(seconds: float) -> None:
    """Busy-wait: time.sleep cannot wait a few microseconds, and NVML calls do not sleep either."""
    if seconds >= 0.002:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
