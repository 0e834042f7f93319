"""What each NVML call cost on the recorded H200, spent again by the replayed NVML when asked
(``RecordedNvml(latency=True)``, :mod:`gpuwarden.exporter.replay.latency`)."""

from __future__ import annotations

import pytest

from gpuwarden.exporter.replay import RecordedNvml, load_probe, load_trace
from gpuwarden.exporter.replay.latency import LATENCY_FUNCTIONS, busy_wait, call_costs_s


@pytest.fixture(scope="module")
def probe(data_dir):
    return load_probe(data_dir / "h200" / "nvml_probe.json")


def test_each_timed_call_costs_its_recorded_median_and_untimed_siblings_cost_theirs(probe):
    costs = call_costs_s(probe)
    medians = probe["latency_idle"]
    assert costs["nvmlDeviceGetUtilizationRates"] == medians["utilization"]["median_us"] / 1e6
    assert costs["nvmlDeviceGetFieldValues"] == medians["field_values_10"]["median_us"] / 1e6
    # not in the probe: costed as the call on the same driver path
    assert costs["nvmlDeviceGetMemoryInfo_v2"] == costs["nvmlDeviceGetMemoryInfo"]
    assert costs["nvmlGpmMigSampleGet"] == costs["nvmlGpmSampleGet"]
    assert costs["nvmlDeviceGetMPSComputeRunningProcesses"] == costs["nvmlDeviceGetComputeRunningProcesses"]
    assert set(costs) >= {f for key, f in LATENCY_FUNCTIONS.items() if key in medians}
    assert call_costs_s({}) == {"nvmlGpmMigSampleGet": 0.0, "nvmlDeviceGetMemoryInfo_v2": 0.0,
                                "nvmlDeviceGetMPSComputeRunningProcesses": 0.0}


def test_the_replayed_nvml_spends_each_calls_cost_only_when_asked(probe, data_dir):
    rows = load_trace(data_dir / "h200" / "phase_trace.csv")
    spent: list[float] = []
    nvml = RecordedNvml(probe, rows, latency=True, spin=spent.append)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    spent.clear()
    nvml.nvmlDeviceGetUtilizationRates(handle)
    nvml.nvmlDeviceGetPowerUsage(handle)
    assert spent == [call_costs_s(probe)["nvmlDeviceGetUtilizationRates"], call_costs_s(probe)["nvmlDeviceGetPowerUsage"]]
    free = RecordedNvml(probe, rows, spin=spent.append)
    free.nvmlInit()
    spent.clear()
    free.nvmlDeviceGetUtilizationRates(free.nvmlDeviceGetHandleByIndex(0))
    assert spent == []


def test_busy_wait_waits_at_least_as_long_as_asked():
    import time

    for seconds in (0.0005, 0.003):
        start = time.perf_counter()
        busy_wait(seconds)
        assert time.perf_counter() - start >= seconds
