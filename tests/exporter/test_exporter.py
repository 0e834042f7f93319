"""The exporter core: catalogue, collector, and the service over real HTTP.

No GPU is present on CI, so these tests read GPUs through ``FakeBackend``, a fake backend that
implements the real ``gpuwarden.fleet.GpuBackend`` protocol over a list of ``GpuReading`` the
test mutates between collections.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from builders import DRIVER, GIB, FakeBackend, gpu_reading
from polling import tick, wait_for
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.exporter import (
    ExporterService,
    ExporterSnapshot,
    GpuCollector,
    load_catalogue,
)
from gpuwarden.exporter.collector import gpu_labels
from gpuwarden.fleet import THROTTLE_REASONS, GpuBackend, GpuReading
from gpuwarden.fleet.catalogue import GPU_LABELS, CatalogueError
from gpuwarden.fleet.clock import FakeClock

SELF = {"node": "node-a"}  # the exporter's own series carry the node label too
SELF_KEY = frozenset(SELF.items())
MIB = 1024**2


def labels_of(reading: GpuReading, **extra: str) -> dict[str, str]:
    return {**gpu_labels(reading, DRIVER), **extra}


def fresh(readings, **snapshot_fields) -> tuple[CollectorRegistry, GpuCollector]:
    registry = CollectorRegistry()
    collector = GpuCollector(ExporterSnapshot(tuple(readings), DRIVER, True, **snapshot_fields))
    registry.register(collector)
    return registry, collector


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def scrape(service: ExporterService) -> dict[tuple[str, frozenset], float]:
    status, body = get(service.url)
    assert status == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


@pytest.fixture
def service_factory():
    started: list[ExporterService] = []

    def make(backend: FakeBackend, interval: float = 60.0) -> ExporterService:
        service = ExporterService(backend, interval_seconds=interval, port=0)
        started.append(service.start())
        return service

    yield make
    for service in started:
        service.stop()


# -- catalogue -------------------------------------------------------------------------------


def test_catalogue_loads_and_names_the_dcgm_fields():
    names = {spec.metric for spec in load_catalogue()}
    for expected in (
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "gpuwarden_gpu_recovery_action",
        "gpuwarden_xid_errors_total", "gpuwarden_gpu_throttle_reason", "gpuwarden_gpu_lost",
    ):
        assert expected in names


@pytest.mark.parametrize(
    "row, message",
    [
        ("X,gauge,no_such_column,value,,1,h", "unknown source column"),
        ("X,histogram,power_watts,value,,1,h", "type must be"),
        ("X,gauge,power_watts,value,,1/0,h", "invalid scale"),
        ("X,counter,nope_*_total,pattern,code,1,h", "matches no fleet-samples column"),
        ("X,gauge,throttle_reasons_bitmask,bits,gpu,1,h", "new label name"),
    ],
)
def test_catalogue_rejects_bad_rows_with_file_and_line(tmp_path: Path, row: str, message: str):
    path = tmp_path / "c.csv"
    path.write_text("# comment\nmetric,type,source_column,transform,label,scale,help\n" + row + "\n")
    with pytest.raises(CatalogueError, match=message) as err:
        load_catalogue(path)
    assert f"{path}:3:" in str(err.value)


def test_a_custom_catalogue_decides_what_is_exported(tmp_path: Path):
    path = tmp_path / "c.csv"
    path.write_text("metric,type,source_column,transform,label,scale,help\nmy_power_kw,gauge,power_watts,value,,1/1000,kW\n")
    registry = CollectorRegistry()
    registry.register(GpuCollector(ExporterSnapshot((gpu_reading(),), DRIVER, True), catalogue=load_catalogue(path)))
    assert registry.get_sample_value("my_power_kw", labels_of(gpu_reading())) == pytest.approx(0.3125)
    assert registry.get_sample_value("DCGM_FI_DEV_POWER_USAGE", labels_of(gpu_reading())) is None


# -- collector ------------------------------------------------------------------------------


def test_labels_follow_dcgm_exporter():
    mig = GpuReading(node="node-b", gpu_uuid="GPU-abc", gpu_index=3, model="NVIDIA A100-SXM4-80GB",
                     pci_bus_id="00000000:CA:00.0", mig_instance_id=1, mig_profile="3g.40gb",
                     values={"gpu_util_ratio": 0.5})
    assert gpu_labels(mig, DRIVER) == {
        "gpu": "3", "UUID": "GPU-abc", "pci_bus_id": "00000000:CA:00.0", "device": "nvidia3",
        "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "node-b", "GPU_I_PROFILE": "3g.40gb",
        "GPU_I_ID": "1", "pod": "", "namespace": "", "container": "", "DCGM_FI_DRIVER_VERSION": DRIVER,
        "node": "node-b",
    }
    assert tuple(gpu_labels(mig, DRIVER)) == GPU_LABELS
    whole = gpu_labels(gpu_reading(), DRIVER)
    assert (whole["GPU_I_PROFILE"], whole["GPU_I_ID"], whole["pod"], whole["namespace"], whole["container"]) == (
        "", "", "train-0", "ml", "trainer")


def test_values_are_converted_to_dcgm_units():
    gpu = gpu_reading()
    registry, _ = fresh([gpu])
    labels = labels_of(gpu)
    expected = {  # series -> value in DCGM's unit (MiB, W, MHz, percent, counts)
        "DCGM_FI_DEV_GPU_UTIL": 22.0, "DCGM_FI_DEV_FB_USED": 10 * 1024, "DCGM_FI_DEV_FB_FREE": 70 * 1024,
        "DCGM_FI_DEV_GPU_TEMP": 61.0, "DCGM_FI_DEV_POWER_USAGE": 312.5, "DCGM_FI_DEV_SM_CLOCK": 1980.0,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 7, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 3, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 1, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0, "gpuwarden_gpu_recovery_action": 0,
        "gpuwarden_gpu_lost": 0,
    }
    assert {name: registry.get_sample_value(name, labels) for name in expected} == pytest.approx(expected)
    assert registry.get_sample_value("gpuwarden_exporter_gpus", SELF) == 1


def test_absent_key_gives_absent_series_never_zero():
    a100 = replace(gpu_reading(), model="NVIDIA A100-SXM4-80GB")  # no GPM: no sm/tensor/dram activity keys
    h200 = gpu_reading(1, sm_active_ratio=0.41, tensor_active_ratio=0.3, dram_active_ratio=0.55)
    no_mem = replace(gpu_reading(2), values={"gpu_util_ratio": 0.0})
    registry, _ = fresh([a100, h200, no_mem])
    value = registry.get_sample_value
    for metric in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        assert value(metric, labels_of(a100)) is None
    assert value("DCGM_FI_PROF_SM_ACTIVE", labels_of(h200)) == pytest.approx(0.41)
    assert value("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", labels_of(h200)) == pytest.approx(0.3)
    assert value("DCGM_FI_PROF_DRAM_ACTIVE", labels_of(h200)) == pytest.approx(0.55)
    # a real 0 stays a 0; a missing key (and anything derived from it) is no series at all
    assert value("DCGM_FI_DEV_GPU_UTIL", labels_of(no_mem)) == 0.0
    for metric in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE"):
        assert value(metric, labels_of(no_mem)) is None
    assert value("gpuwarden_gpu_throttle_reason", labels_of(no_mem, reason="gpu_idle")) is None
    assert value("gpuwarden_xid_errors_total", labels_of(no_mem, xid="other")) is None


def test_xid_counter_per_code():
    gpu = gpu_reading()
    registry, _ = fresh([gpu])
    value = registry.get_sample_value
    assert value("gpuwarden_xid_errors_total", labels_of(gpu, xid="48")) == 2
    assert value("gpuwarden_xid_errors_total", labels_of(gpu, xid="79")) == 0
    assert value("gpuwarden_xid_errors_total", labels_of(gpu, xid="other")) == 5
    assert value("gpuwarden_xid_errors_total", labels_of(gpu, xid="13")) is None  # key absent


def test_throttle_reasons_are_one_series_per_reason():
    gpu = gpu_reading()
    registry, _ = fresh([gpu])
    for reason in THROTTLE_REASONS:
        expected = 1.0 if reason in ("hw_thermal_slowdown", "sw_power_cap") else 0.0
        assert registry.get_sample_value("gpuwarden_gpu_throttle_reason", labels_of(gpu, reason=reason)) == expected


def test_lost_gpu_is_flagged_while_others_report():
    healthy = gpu_reading(0)
    lost = replace(gpu_reading(1), lost=True, values={"xid_79_total": 1})
    registry, _ = fresh([healthy, lost])
    value = registry.get_sample_value
    assert value("gpuwarden_gpu_lost", labels_of(lost)) == 1
    assert value("gpuwarden_xid_errors_total", labels_of(lost, xid="79")) == 1
    assert value("DCGM_FI_DEV_GPU_UTIL", labels_of(lost)) is None
    assert value("gpuwarden_gpu_lost", labels_of(healthy)) == 0
    assert value("DCGM_FI_DEV_GPU_UTIL", labels_of(healthy)) == pytest.approx(22.0)
    assert value("gpuwarden_exporter_gpus", SELF) == 2


def test_self_metrics_and_snapshot_swap():
    registry, collector = fresh([gpu_reading(0), gpu_reading(1)], timestamp_seconds=1700000000.0, duration_seconds=0.012)
    assert registry.get_sample_value("gpuwarden_exporter_last_collection_success", SELF) == 1
    assert registry.get_sample_value("gpuwarden_exporter_last_collection_timestamp_seconds", SELF) == 1700000000.0
    assert registry.get_sample_value("gpuwarden_exporter_collection_duration_seconds", SELF) == 0.012
    collector.update(ExporterSnapshot((gpu_reading(0),), DRIVER, True))
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_UTIL", labels_of(gpu_reading(1))) is None
    assert registry.get_sample_value("gpuwarden_exporter_gpus", SELF) == 1


def test_collect_is_pure():
    _, collector = fresh([gpu_reading(0)])
    assert list(collector.collect()) == list(collector.collect())


def test_exporter_imports_no_heavy_libraries():
    code = (
        "import sys, gpuwarden.exporter\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pandas', 'pyarrow', 'sklearn', 'streamlit')"
        " or (m.startswith('gpuwarden.') and m.split('.')[1] not in ('exporter', 'fleet'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- service over HTTP -----------------------------------------------------------------------


def test_fake_backend_implements_the_protocol():
    assert isinstance(FakeBackend([]), GpuBackend)


def test_metrics_over_http_with_all_labels(service_factory):
    gpu = gpu_reading()
    service = service_factory(FakeBackend([gpu]))
    wait_for(lambda: service.health()[0], what="first collection")
    assert service.url == f"http://127.0.0.1:{service.port}/metrics" and service.port != 0
    samples = scrape(service)
    assert samples[("DCGM_FI_DEV_GPU_UTIL", frozenset(labels_of(gpu).items()))] == pytest.approx(22.0)
    assert samples[("DCGM_FI_DEV_FB_USED", frozenset(labels_of(gpu).items()))] == 10240
    assert samples[("gpuwarden_xid_errors_total", frozenset(labels_of(gpu, xid="48").items()))] == 2
    assert samples[("gpuwarden_exporter_last_collection_success", SELF_KEY)] == 1
    assert ("gpuwarden_exporter_last_collection_timestamp_seconds", SELF_KEY) in samples
    status, body = get(service.url.replace("/metrics", "/healthz"))
    assert (status, body) == (200, "ok\n")
    assert get(service.url.replace("/metrics", "/nope"))[0] == 404


def test_removed_gpu_disappears_after_next_collection(service_factory):
    backend = FakeBackend([gpu_reading(0), gpu_reading(1)])
    service = service_factory(backend)
    service.collect_now()
    key = ("DCGM_FI_DEV_GPU_UTIL", frozenset(labels_of(gpu_reading(1)).items()))
    assert key in scrape(service)
    backend.readings = [gpu_reading(0)]
    service.collect_now()
    samples = scrape(service)
    assert key not in samples
    assert not any(dict(labels).get("UUID") == "GPU-0000-1" for _, labels in samples)
    assert samples[("gpuwarden_exporter_gpus", SELF_KEY)] == 1
    # a pod that moved away: its labelled series go too
    backend.readings = [replace(gpu_reading(0), pod=None, namespace=None, container=None)]
    service.collect_now()
    assert not any(dict(labels).get("pod") == "train-0" for _, labels in scrape(service))


def test_failing_backend_keeps_old_snapshot_and_reports_failure(service_factory, caplog):
    backend = FakeBackend([gpu_reading(0)])
    service = service_factory(backend)
    service.collect_now()
    backend.error = RuntimeError("NVML_ERROR_UNKNOWN")
    with caplog.at_level("WARNING", logger="gpuwarden.exporter"):
        service.collect_now()
        service.collect_now()
    samples = scrape(service)
    assert samples[("gpuwarden_exporter_last_collection_success", SELF_KEY)] == 0
    assert samples[("DCGM_FI_DEV_GPU_UTIL", frozenset(labels_of(gpu_reading(0)).items()))] == pytest.approx(22.0)
    assert sum("NVML_ERROR_UNKNOWN" in r.getMessage() for r in caplog.records) == 1  # logged once
    backend.error = None
    service.collect_now()
    assert scrape(service)[("gpuwarden_exporter_last_collection_success", SELF_KEY)] == 1


def test_health_goes_stale_three_intervals_after_the_last_success_on_the_injected_clock():
    clock = FakeClock(1_800_000_000.0)
    backend = FakeBackend([gpu_reading()])
    service = ExporterService(backend, interval_seconds=15, port=0, clock=clock)
    assert service.health() == (False, "no successful collection yet")
    assert service.collect_now().timestamp_seconds == 1_800_000_000.0
    backend.error = RuntimeError("NVML_ERROR_UNKNOWN")
    clock.advance(45)  # three intervals: still within the limit
    assert service.collect_now().timestamp_seconds == 1_800_000_045.0
    assert service.health() == (True, "ok")
    clock.advance(1)
    live, reason = service.health()
    assert not live and reason.startswith("stale: last successful collection 46.00s ago (limit 45.00s)")
    assert "NVML_ERROR_UNKNOWN" in reason


def test_collection_loop_runs_once_per_interval_of_the_injected_clock():
    clock = FakeClock(1_800_000_000.0)
    backend = FakeBackend([gpu_reading()])
    service = ExporterService(backend, interval_seconds=15, port=0, clock=clock).start()
    try:
        wait_for(lambda: backend.reads == 1, what="the collection at start")
        for reads in (2, 3):
            tick(clock, 15, waiters=2)  # the collection loop and the watchdog are both idle
            wait_for(lambda: backend.reads == reads, what=f"collection {reads}")  # noqa: B023
        wait_for(lambda: service.snapshot.timestamp_seconds == 1_800_000_030.0, what="the third snapshot")
    finally:
        service.stop()
    assert backend.reads == 3


def test_blocked_backend_never_blocks_scrapes_and_goes_unhealthy(service_factory):
    backend = FakeBackend([gpu_reading(0)])
    service = service_factory(backend, interval=0.05)
    healthz = service.url.replace("/metrics", "/healthz")
    wait_for(lambda: get(healthz)[0] == 200, what="healthy")
    backend.gate = threading.Event()  # the next read() hangs
    try:
        status, body = wait_for(lambda: (r := get(healthz)) and r[0] == 503 and r, timeout=5, what="503")
        assert "stale" in body
        status, body = get(service.url, timeout=5.0)  # answered while read() still blocks on the gate
        assert status == 200 and backend.gate is not None and not backend.gate.is_set()
        assert 'DCGM_FI_DEV_GPU_UTIL{' in body  # still the last good snapshot
    finally:
        backend.gate.set()
    wait_for(lambda: get(healthz)[0] == 200, what="healthy again")


def test_stop_ends_the_threads_mid_interval_and_frees_the_port():
    """The collection loop waits its interval on a FakeClock that never moves: stop() must end it
    through the stop event, not by waiting the interval out."""
    service = ExporterService(FakeBackend([gpu_reading()]), interval_seconds=15, port=0, clock=FakeClock()).start()
    port = service.port
    assert get(service.url)[0] == 200
    threads = [t for t in threading.enumerate() if t.name in ("gpuwarden-exporter-collect", "gpuwarden-exporter-watchdog")]
    assert len(threads) == 2
    service.stop()
    assert not any(thread.is_alive() for thread in threads)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    socket.create_server(("127.0.0.1", port)).close()  # the port can be bound again
    service.stop()  # idempotent


def test_fast_text_render_is_byte_identical_to_prometheus_client():
    """The served text is rendered by ``render_text``; it must equal generate_latest's output,
    including escaping of awkward label values and the extra xid/reason labels."""
    from prometheus_client import generate_latest

    from gpuwarden.exporter.collector import render_text

    odd = replace(gpu_reading(1), pod='we"ird\\pod\nname', node="node-a", mig_instance_id=3, mig_profile="1g.10gb",
                  values={**gpu_reading(1).values, "xid_999_total": 1, "xid_999_last_seen_timestamp_seconds": 1.7e9})
    snapshot = ExporterSnapshot((gpu_reading(0), odd), DRIVER, True, timestamp_seconds=1700000000.5, duration_seconds=0.01,
                                node="node-a", pod_attribution=True)
    registry = CollectorRegistry()
    collector = GpuCollector(snapshot)
    registry.register(collector)
    text = render_text(snapshot, collector.catalogue)
    assert text == generate_latest(registry)
    assert b'xid="999"' in text and b'reason="hw_thermal_slowdown"' in text and b'\\"ird\\\\pod\\nname' in text


def test_sim_backend_passes_reserved_memory_and_nvlink_counters_through():
    """The simulated fleet's backend hands every samples column the simulator fills to the exporter;
    a column it leaves null (NaN) stays an absent series."""
    import math

    import pandas as pd

    from gpuwarden.fleet import METRIC_COLUMN_NAMES
    from gpuwarden.sim.backend import SimGpuBackend

    row = {name: math.nan for name in METRIC_COLUMN_NAMES}
    row.update(node="node-a", gpu_uuid="GPU-sim-0", gpu_index=0, model="NVIDIA H100 80GB HBM3", mig_instance=None,
               namespace="ml", pod="train-0", gpu_util_ratio=0.5, power_watts=300.0, mem_used_bytes=10 * GIB,
               mem_total_bytes=80 * GIB, mem_reserved_bytes=512 * MIB, nvlink_crc_flit_errors_total=4,
               nvlink_replay_errors_total=1)
    other = {**row, "gpu_uuid": "GPU-sim-1", "gpu_index": 1, "pod": "train-1", "mem_reserved_bytes": math.nan,
             "nvlink_crc_flit_errors_total": math.nan, "nvlink_replay_errors_total": math.nan}
    simulation = type("Sim", (), {"lock": threading.Lock(), "latest": pd.DataFrame([row, other])})()
    readings = SimGpuBackend(simulation).read()
    registry, _ = fresh(readings)
    first, second = readings
    assert registry.get_sample_value("DCGM_FI_DEV_FB_RESERVED", labels_of(first)) == 512
    assert registry.get_sample_value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", labels_of(first)) == 4
    assert registry.get_sample_value("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", labels_of(first)) == 1
    assert registry.get_sample_value("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", labels_of(first)) is None
    assert registry.get_sample_value("DCGM_FI_DEV_FB_FREE", labels_of(first)) == 80 * 1024 - 10 * 1024 - 512
    assert registry.get_sample_value("DCGM_FI_DEV_FB_RESERVED", labels_of(second)) is None
    assert registry.get_sample_value("DCGM_FI_DEV_FB_FREE", labels_of(second)) == 70 * 1024
    assert registry.get_sample_value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", labels_of(second)) is None
