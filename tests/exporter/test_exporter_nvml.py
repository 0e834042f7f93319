"""The NVML and replay backends, the watchdog, and the exporter command line.

No GPU exists on CI (nor on developers' machines), so the NVML backend is tested against a FAKE:
``RecordedNvml``, which speaks the pynvml API (pynvml's own error classes, constants and ctypes
structures) and answers from ``../shared/data/h200/nvml_probe.json``, a recording of every call's
value or exact NVML error on a real H200, with dynamic values from ``phase_trace.csv``. Faults (a
lost GPU, a hung call, an XID event, an unknown function) are injected into that fake.
"""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from polling import wait_for
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.exporter import ExporterService, ExporterSnapshot, GpuCollector
from gpuwarden.exporter.nvml import (
    NA,
    NVML_ERROR_NOT_SUPPORTED,
    NvmlBackend,
    NvmlQuery,
    NvmlUnavailable,
    mig_profile_from_name,
)
from gpuwarden.exporter.replay import (
    RecordedNvml,
    ReplayBackend,
    ReplayError,
    load_probe,
    load_trace,
)
from gpuwarden.fleet import TRACKED_XIDS, GpuBackend
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock, FakeClock

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def h200(data_dir: Path):
    return load_probe(data_dir / "h200" / "nvml_probe.json"), load_trace(data_dir / "h200" / "phase_trace.csv")


@pytest.fixture
def make_backend(h200):
    made: list[NvmlBackend] = []

    def make(gpus: int = 1, probe=None, clock: Clock = SYSTEM_CLOCK, **kwargs) -> NvmlBackend:
        recorded = RecordedNvml(probe or h200[0], h200[1], gpus=gpus, mig_profiles=kwargs.pop("mig_profiles", ()))
        backend = NvmlBackend("node-a", nvml=recorded, clock=clock, xid_wait_ms=20, **kwargs)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def render(readings, driver: str = "580.159.04") -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(GpuCollector(ExporterSnapshot(tuple(readings), driver, True)))
    return registry


def labels(reading, **extra: str) -> dict[str, str]:
    from gpuwarden.exporter.collector import gpu_labels

    return {**gpu_labels(reading, "580.159.04"), **extra}


def row_of(rows, phase: str) -> int:
    return next(i for i, row in enumerate(rows) if row.phase == phase)


# -- the NVML backend over the recorded H200 ------------------------------------------------


def test_backend_implements_the_protocol_and_reads_the_recorded_h200(make_backend, h200):
    probe, rows = h200
    backend = make_backend()
    assert isinstance(backend, GpuBackend)
    (gpu,) = backend.read()
    device = probe["device0"]
    row = rows[0].values
    assert gpu.gpu_uuid == device["uuid"]["value"] and gpu.model == "NVIDIA H200"
    assert gpu.pci_bus_id == device["pci"]["value"]["busId"] and gpu.node == "node-a"
    assert backend.driver_version() == probe["driver"]["value"]
    v = gpu.values
    assert v["mem_total_bytes"] == device["memory"]["value"]["total"]
    # v2 memory: the trace's v1 "used" less the driver-reserved memory (the whole of it at idle)
    reserved = device["memory"]["value"]["used"]
    assert v["mem_reserved_bytes"] == reserved
    assert v["mem_used_bytes"] == max(0, row["mem_used_mib"] * 1024**2 - reserved)
    assert v["power_watts"] == pytest.approx(row["power_w"], abs=1e-3)
    assert v["temperature_celsius"] == row["temp_c"] and v["sm_clock_mhz"] == row["sm_clock_mhz"]
    assert v["mem_clock_mhz"] == row["mem_clock_mhz"]
    assert v["throttle_reasons_bitmask"] == row["clocks_event_reasons"]
    assert v["energy_joules_total"] == pytest.approx(row["energy_mj"] / 1000)
    fields = device["field_values"]
    assert v["memory_temperature_celsius"] == fields["NVML_FI_DEV_MEMORY_TEMP"]["value"]
    assert v["recovery_action"] == fields["NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"]["value"]
    for key in ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "pcie_replay_total",
                "remapped_rows_correctable_total", "remapped_rows_uncorrectable_total", "remapped_rows_failure"):
        assert v[key] == 0
    assert v["nvml_errors_total"] == 0  # NotSupported answers are not errors


def test_one_batched_field_values_call_per_gpu_and_never_pcie_throughput(make_backend):
    backend = make_backend(gpus=4)
    seen: list[str] = []
    backend.query.nvml.before_call = lambda name, handle: seen.append(name)
    for _ in range(3):
        backend.read()
    assert seen.count("nvmlDeviceGetFieldValues") == 4 * 3
    assert "nvmlDeviceGetPcieThroughput" not in seen
    assert "nvmlDeviceGetTotalEnergyConsumption" not in seen  # energy rides in the field batch
    assert seen.count("nvmlDeviceGetHandleByIndex") == 4  # identity is read once per GPU
    with pytest.raises(ValueError, match="must not be called"):
        backend.query("nvmlDeviceGetPcieThroughput", None, 0)


def test_not_supported_field_is_absent_not_zero(make_backend, h200):
    probe = copy.deepcopy(h200[0])
    probe["device0"]["field_values"]["NVML_FI_DEV_MEMORY_TEMP"] = {"id": 82, "ok": False, "ret": 3}
    probe["device0"]["power_usage_mw"] = {"ok": False, "error": "NVMLError_NotSupported: Not Supported"}
    (gpu,) = make_backend(probe=probe).read()
    assert "memory_temperature_celsius" not in gpu.values and "power_watts" not in gpu.values
    assert gpu.values["nvml_errors_total"] == 0
    registry = render([gpu])
    assert registry.get_sample_value("DCGM_FI_DEV_MEMORY_TEMP", labels(gpu)) is None
    assert registry.get_sample_value("DCGM_FI_DEV_POWER_USAGE", labels(gpu)) is None
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_TEMP", labels(gpu)) == 38


def test_gpm_gives_real_activity_where_nvml_util_misleads(make_backend, h200):
    """The H200 trace: in tiny_kernels_one_block NVML util reads ~22% while GPM SM activity is ~0."""
    backend = make_backend()
    rows = h200[1]
    backend.query.nvml.cursor = row_of(rows, "tiny_kernels_one_block") + 5
    (first,) = backend.read()
    assert "sm_active_ratio" not in first.values  # GPM needs two samples: absent, not 0
    backend.query.nvml.advance()
    (gpu,) = backend.read()
    row = rows[backend.query.nvml.cursor].values
    registry = render([gpu])
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_UTIL", labels(gpu)) == row["gpu_util"] > 10
    sm_active = registry.get_sample_value("DCGM_FI_PROF_SM_ACTIVE", labels(gpu))
    assert sm_active == pytest.approx(row["gpm_sm_util"] / 100) and sm_active < 0.01
    assert registry.get_sample_value("DCGM_FI_PROF_SM_OCCUPANCY", labels(gpu)) == pytest.approx(row["gpm_sm_occupancy"] / 100)
    assert registry.get_sample_value("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", labels(gpu)) == pytest.approx(row["gpm_any_tensor_util"] / 100)
    assert registry.get_sample_value("DCGM_FI_PROF_DRAM_ACTIVE", labels(gpu)) == pytest.approx(row["gpm_dram_bw_util"] / 100)
    assert registry.get_sample_value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels(gpu)) == pytest.approx(row["gpm_graphics_util"] / 100)
    backend.query.nvml.cursor = row_of(rows, "compute_bf16_matmul") + 10
    backend.read()
    (busy,) = backend.read()
    assert 0.5 < busy.values["sm_active_ratio"] <= 1 and 0.5 < busy.values["tensor_active_ratio"] <= 1


def test_gpm_unsupported_gives_absent_series(make_backend, h200):
    probe = copy.deepcopy(h200[0])
    probe["device0"]["gpm_support"] = {"ok": True, "value": {"version": 1, "isSupportedDevice": 0}}
    backend = make_backend(probe=probe)
    backend.read()
    (gpu,) = backend.read()
    registry = render([gpu])
    for metric in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                   "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
        assert registry.get_sample_value(metric, labels(gpu)) is None
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_UTIL", labels(gpu)) is not None
    assert gpu.values["nvml_errors_total"] == 0


def test_unknown_function_is_logged_once_and_treated_as_unsupported(make_backend, caplog):
    backend = make_backend(gpus=2)
    recorded = backend.query.nvml
    original = recorded.nvmlDeviceGetMigMode

    def gone(*_args):
        raise recorded.NVMLError(recorded.NVML_ERROR_FUNCTION_NOT_FOUND)

    recorded.nvmlDeviceGetMigMode = gone
    with caplog.at_level(logging.WARNING, logger="gpuwarden.exporter"):
        for _ in range(3):
            readings = backend.read()
    assert len(readings) == 2 and all("power_watts" in r.values for r in readings)
    assert sum("nvmlDeviceGetMigMode" in r.getMessage() for r in caplog.records) == 1
    recorded.nvmlDeviceGetMigMode = original


def test_query_layer_sentinel_and_missing_library():
    class NoDriver:
        import pynvml as _p

        NVMLError = _p.NVMLError

        def nvmlInit(self):
            raise self._p.NVMLError(self._p.NVML_ERROR_LIBRARY_NOT_FOUND)

    query = NvmlQuery(NoDriver())
    with pytest.raises(NvmlUnavailable, match="NVML Shared Library Not Found"):
        query("nvmlDeviceGetCount")
    assert not NA and repr(NA) == "NA"
    assert mig_profile_from_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "1g.10gb"
    assert mig_profile_from_name("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb") == "1c.3g.40gb"


def test_lost_gpu_is_marked_and_the_others_carry_on(make_backend):
    backend = make_backend(gpus=3)
    before = {r.gpu_index: r for r in backend.read()}
    backend.query.nvml.lost = {1}
    readings = {r.gpu_index: r for r in backend.read()}
    assert readings[1].lost and not readings[0].lost and not readings[2].lost
    assert readings[1].gpu_uuid == before[1].gpu_uuid  # same identity: its series say so
    assert readings[1].values["nvml_errors_total"] >= 1
    registry = render(readings.values())
    assert registry.get_sample_value("gpuwarden_gpu_lost", labels(readings[1])) == 1
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_UTIL", labels(readings[1])) is None
    assert registry.get_sample_value("gpuwarden_exporter_gpu_errors_total", labels(readings[1])) >= 1
    for index in (0, 2):
        assert registry.get_sample_value("gpuwarden_gpu_lost", labels(readings[index])) == 0
        assert registry.get_sample_value("DCGM_FI_DEV_POWER_USAGE", labels(readings[index])) is not None
    backend.query.nvml.lost = set()
    assert not any(r.lost for r in backend.read())  # back after a reset


def test_xid_counter_is_monotonic_and_counts_repeated_identical_xids(make_backend):
    clock = FakeClock(1_700_000_000.0)
    backend = make_backend(gpus=2, clock=clock)
    gpu0, gpu1 = backend.read()
    assert gpu0.values["xid_48_total"] == 0 and gpu0.values["xid_last_code"] == 0  # watched: exported from 0
    recorded = backend.query.nvml
    assert recorded.inject_xid(0, 48) == 1
    wait_for(lambda: backend.read()[0].values["xid_48_total"] == 1, what="first xid 48")
    clock.advance(30)
    recorded.inject_xid(0, 48)  # the same XID again: DCGM's gauge would not move; the counter does
    recorded.inject_xid(0, 31)
    gpu0 = wait_for(lambda: (r := backend.read()[0]).values.get("xid_31_total") == 1 and r, what="xid 31")
    assert gpu0.values["xid_48_total"] == 2
    assert gpu0.values["xid_48_last_seen_timestamp_seconds"] == 1_700_000_030.0
    assert gpu0.values["xid_last_code"] == 31
    recorded.inject_xid(0, 999)  # an untracked code keeps its own label
    gpu0, gpu1 = wait_for(lambda: (r := backend.read())[0].values.get("xid_999_total") == 1 and r, what="xid 999")
    registry = render([gpu0, gpu1])
    value = registry.get_sample_value
    assert value("gpuwarden_xid_errors_total", labels(gpu0, xid="48")) == 2
    assert value("gpuwarden_xid_errors_total", labels(gpu0, xid="999")) == 1
    assert value("gpuwarden_xid_last_seen_timestamp_seconds", labels(gpu0, xid="48")) == 1_700_000_030.0
    assert value("DCGM_FI_DEV_XID_ERRORS", labels(gpu0)) == 999
    assert value("gpuwarden_xid_errors_total", labels(gpu1, xid="48")) == 0
    assert value("gpuwarden_xid_last_seen_timestamp_seconds", labels(gpu1, xid="48")) is None
    assert {f"xid_{c}_total" for c in TRACKED_XIDS} <= set(gpu1.values)


def test_xid_series_absent_where_events_unsupported(make_backend, h200):
    probe = copy.deepcopy(h200[0])
    probe["device0"]["supported_events"] = {"ok": True, "value": 0}
    (gpu,) = make_backend(probe=probe).read()
    assert not any(key.startswith("xid_") for key in gpu.values)
    assert render([gpu]).get_sample_value("gpuwarden_xid_errors_total", labels(gpu, xid="48")) is None


def test_mig_instances_are_read_with_dcgm_labels(make_backend):
    backend = make_backend(gpus=2, mig_profiles=["1g.18gb"] * 3)
    backend.read()
    readings = backend.read()
    whole = [r for r in readings if r.mig_instance_id is None]
    migs = [r for r in readings if r.mig_instance_id is not None]
    assert len(whole) == 2 and len(migs) == 6
    assert {(r.gpu_index, r.mig_instance_id) for r in migs} == {(g, i) for g in (0, 1) for i in (7, 8, 9)}
    assert all(r.mig_profile == "1g.18gb" and r.mig_uuid.startswith("MIG-") for r in migs)
    assert len({r.mig_uuid for r in migs}) == 6
    registry = render(readings)
    mig = migs[0]
    assert labels(mig)["GPU_I_PROFILE"] == "1g.18gb" and labels(mig)["GPU_I_ID"] == "7"
    assert registry.get_sample_value("DCGM_FI_DEV_FB_USED", labels(mig)) is not None
    assert registry.get_sample_value("DCGM_FI_PROF_SM_ACTIVE", labels(mig)) is not None
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_UTIL", labels(mig)) is None  # NVML has none per MIG


def test_mig_utilisation_is_asked_once_per_gpu(make_backend):
    """NVML answers NotSupported for a MIG instance's utilisation: asked once per GPU, never again
    (one failing call per instance per collection is wasted driver time on a MIG node)."""
    backend = make_backend(gpus=2, mig_profiles=["1g.18gb"] * 3)
    for _ in range(3):
        readings = backend.read()
    assert backend.query.calls["nvmlDeviceGetUtilizationRates"] == 3 * 2 + 2  # every parent read, one MIG ask per GPU
    assert not any("gpu_util_ratio" in r.values for r in readings if r.mig_instance_id is not None)
    assert all("gpu_util_ratio" in r.values for r in readings if r.mig_instance_id is None)


def test_gpm_buffers_of_gone_mig_instances_are_freed(make_backend):
    """NVML's GPM buffers are the exporter's to free: a MIG instance that is destroyed, or whose GPU
    is lost, gives its buffers back (live buffers: the NVML allocations less the frees)."""
    backend = make_backend(gpus=2, mig_profiles=["1g.18gb"] * 3)
    recorded, calls = backend.query.nvml, backend.query.calls

    def live() -> int:
        return calls.get("nvmlGpmSampleAlloc", 0) - calls.get("nvmlGpmSampleFree", 0)

    backend.read()
    backend.read()
    assert live() == 2 * 2 + 2 * 3 * 2  # two buffers (previous, spare) per GPU and per MIG instance
    recorded.mig_profiles = ("1g.18gb",) * 2  # instance 9 destroyed on both GPUs
    readings = backend.read()
    assert live() == 2 * 2 + 2 * 2 * 2
    assert {r.mig_instance_id for r in readings if r.mig_instance_id is not None} == {7, 8}
    recorded.lost = {1}
    readings = backend.read()
    assert [r.gpu_index for r in readings if r.lost] == [1]
    assert live() == 2 + 2 * 2  # GPU 0 and its two instances; lost GPU 1 holds none
    recorded.lost = set()
    readings = backend.read()
    assert not any(r.lost for r in readings) and len([r for r in readings if r.mig_instance_id is not None]) == 4


def test_vanished_gpu_series_are_removed(make_backend):
    backend = make_backend(gpus=3)
    service = ExporterService(backend, interval_seconds=60, node_name="node-a")
    service.collect_now()
    assert b'gpu="2"' in service.render_metrics()
    backend.query.nvml.gpus = 2
    service.collect_now()
    body = service.render_metrics().decode()
    assert 'gpu="2"' not in body and 'gpu="1"' in body


# -- replay -------------------------------------------------------------------------------------


def test_replay_plays_the_trace_row_by_row_and_loops(data_dir, h200):
    backend = ReplayBackend("node-r", data_dir / "h200" / "phase_trace.csv", data_dir / "h200" / "nvml_probe.json",
                            xid_wait_ms=20)
    try:
        rows = h200[1]
        powers = [backend.read()[0].values["power_watts"] for _ in range(3)]
        assert powers == pytest.approx([rows[i].values["power_w"] for i in range(3)], abs=1e-3)
        backend.recorded.cursor = len(rows) - 1
        backend.read()
        assert backend.read()[0].values["power_watts"] == pytest.approx(rows[0].values["power_w"], abs=1e-3)
        assert backend.name == "replay" and backend.plays == 5
    finally:
        backend.close()


def test_replay_bad_row_names_the_line(tmp_path, data_dir):
    lines = (data_dir / "h200" / "phase_trace.csv").read_text().splitlines()
    cells = lines[3].split(",")
    cells[5] = "lots"  # power_w
    bad = tmp_path / "trace.csv"
    bad.write_text("\n".join([*lines[:3], ",".join(cells), *lines[4:10]]) + "\n")
    with pytest.raises(ReplayError, match=rf"{bad}:4: column 'power_w': 'lots' is not a number"):
        load_trace(bad)
    short = tmp_path / "short.csv"
    short.write_text("\n".join([lines[0], lines[1], "0.4,start,1"]) + "\n")
    with pytest.raises(ReplayError, match=r"short.csv:3: 3 fields, expected"):
        load_trace(short)
    nan = tmp_path / "nan.csv"
    nan.write_text("\n".join([lines[0], lines[1].replace(",84.859,", ",nan,")]) + "\n")
    with pytest.raises(ReplayError, match=r"nan.csv:2: column 'power_w'"):
        load_trace(nan)
    with pytest.raises(ReplayError, match="missing column"):
        (tmp_path / "h.csv").write_text("t,phase\n0,idle\n")
        load_trace(tmp_path / "h.csv")
    with pytest.raises(ReplayError, match="not valid JSON"):
        (tmp_path / "p.json").write_text("{")
        load_probe(tmp_path / "p.json")


def test_replay_cli_bad_file_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "trace.csv"
    bad.write_text("t,phase\n0,x\n")
    result = subprocess.run([sys.executable, "-m", "gpuwarden.exporter", "--backend", "replay", "--replay-trace", str(bad),
                             "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "--backend replay" in lines[0] and f"{bad}:1: missing column" in lines[0]


def test_nvml_missing_is_one_clear_line_and_exit_2():
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")
    result = subprocess.run([sys.executable, "-m", "gpuwarden.exporter", "--backend", "nvml", "--listen", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "--backend nvml: NVML is not available" in lines[0]
    assert "--backend replay" in lines[0] and "--backend sim" in lines[0]


def test_exporter_process_serves_replay_over_http(data_dir):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUWARDEN_DATA": str(data_dir)}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.exporter", "--backend", "replay", "--listen", "127.0.0.1:0", "--interval", "0.2",
         "--replay-gpus", "2", "--node-name", "gpu-node-7", "--kubelet-socket", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:"), line + process.stderr.read()
        url = line.split()[1]

        def scraped():
            with urllib.request.urlopen(url, timeout=2) as response:
                body = response.read().decode()
            samples = {(s.name, s.labels.get("gpu")): s for f in text_string_to_metric_families(body) for s in f.samples}
            return samples if ("DCGM_FI_PROF_SM_ACTIVE", "1") in samples else None

        samples = wait_for(scraped, timeout=10, what="GPM series on the second collection")
        util = samples[("DCGM_FI_DEV_GPU_UTIL", "0")]
        assert util.labels["node"] == util.labels["Hostname"] == "gpu-node-7"
        assert util.labels["modelName"] == "NVIDIA H200" and util.labels["DCGM_FI_DRIVER_VERSION"] == "580.159.04"
        assert samples[("gpuwarden_exporter_last_collection_success", None)].labels == {"node": "gpu-node-7"}
        with urllib.request.urlopen(url.replace("/metrics", "/healthz"), timeout=2) as response:
            assert response.status == 200
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0


# -- watchdog: a hung NVML call ------------------------------------------------------------------


def test_hung_nvml_call_never_blocks_metrics_and_marks_the_collection_stale(make_backend):
    backend = make_backend(gpus=2)
    release = threading.Event()
    hang = threading.Event()

    def before_call(name, handle):
        if hang.is_set() and name == "nvmlDeviceGetFieldValues" and handle.index == 1:
            release.wait(10)

    backend.query.nvml.before_call = before_call
    service = ExporterService(backend, interval_seconds=0.2, port=0, node_name="node-a", watchdog_seconds=0.2).start()
    healthz = service.url.replace("/metrics", "/healthz")

    def scrape() -> str:
        """The body; a scrape that waited on the hung collection would raise a timeout instead."""
        with urllib.request.urlopen(service.url, timeout=5) as response:
            return response.read().decode()

    def stale() -> bool:
        return 'gpuwarden_exporter_collection_stale{node="node-a"} 1.0' in scrape()

    try:
        wait_for(lambda: 'DCGM_FI_DEV_POWER_USAGE{' in scrape(), what="first collection")
        hang.set()
        wait_for(stale, timeout=5, what="stale mark")
        assert not release.is_set() and 'DCGM_FI_DEV_POWER_USAGE{' in scrape()  # the last good snapshot, mid-hang
        try:
            urllib.request.urlopen(healthz, timeout=2)
            raise AssertionError("healthz should be 503 while a collection hangs")
        except urllib.error.HTTPError as error:
            assert error.code == 503 and "hung" in error.read().decode()
        hang.clear()
        release.set()
        wait_for(lambda: not stale(), timeout=5, what="recovery")
    finally:
        release.set()
        service.stop()


# -- memory v2, NVLink, MIG XIDs, MPS (issue 15) ----------------------------------------------


def smi_fb_memory_mib(data_dir: Path) -> dict[str, float]:
    """The "FB Memory Usage" block of the recorded ``nvidia-smi -q`` of the idle H200."""
    lines = (data_dir / "h200" / "nvidia-smi-q.txt").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "FB Memory Usage")
    out = {}
    for line in lines[start + 1:start + 5]:
        key, _, value = line.partition(":")
        out[key.strip()] = float(value.split()[0])
    return out


def test_v2_memory_matches_nvidia_smi_and_exports_reserved(make_backend, data_dir, h200):
    backend = make_backend()
    (gpu,) = backend.read()  # row 0: idle, no process
    smi = smi_fb_memory_mib(data_dir)
    mib = {key: gpu.values[key] / 1024**2 for key in ("mem_total_bytes", "mem_reserved_bytes", "mem_used_bytes", "mem_free_bytes")}
    assert mib["mem_total_bytes"] == pytest.approx(smi["Total"], abs=1)
    assert mib["mem_reserved_bytes"] == pytest.approx(smi["Reserved"], abs=1)
    assert mib["mem_used_bytes"] == pytest.approx(smi["Used"], abs=1)  # 0, where v1 said 615 MiB
    assert mib["mem_free_bytes"] == pytest.approx(smi["Free"], abs=1)
    assert gpu.values["mem_total_bytes"] == sum(gpu.values[k] for k in ("mem_reserved_bytes", "mem_used_bytes", "mem_free_bytes"))
    registry = render([gpu])
    assert registry.get_sample_value("DCGM_FI_DEV_FB_RESERVED", labels(gpu)) == pytest.approx(smi["Reserved"], abs=1)
    assert registry.get_sample_value("DCGM_FI_DEV_FB_USED", labels(gpu)) == pytest.approx(0, abs=1)
    assert registry.get_sample_value("DCGM_FI_DEV_FB_FREE", labels(gpu)) == pytest.approx(smi["Free"], abs=1)
    # hoarding: used is the trace's v1 figure less the reserved memory (the 66,868 -> 66,253 MiB)
    rows = h200[1]
    backend.query.nvml.cursor = row_of(rows, "idle_memory_hoarded_64g")
    (gpu,) = backend.read()
    v1_mib = rows[row_of(rows, "idle_memory_hoarded_64g")].values["mem_used_mib"]
    assert gpu.values["mem_used_bytes"] / 1024**2 == pytest.approx(v1_mib - gpu.values["mem_reserved_bytes"] / 1024**2)
    assert backend.query.calls["nvmlDeviceGetMemoryInfo"] == 2


def test_v1_memory_fallback_where_v2_is_missing_logged_once(make_backend, caplog, h200):
    backend = make_backend()
    backend.query.nvml.memory_v2 = False  # an older driver: nvmlDeviceGetMemoryInfo_v2 not found
    with caplog.at_level(logging.WARNING, logger="gpuwarden.exporter.nvml"):
        (gpu,) = backend.read()
        backend.read()
    assert "mem_reserved_bytes" not in gpu.values and "mem_free_bytes" not in gpu.values
    assert gpu.values["mem_used_bytes"] == h200[1][0].values["mem_used_mib"] * 1024**2  # v1: reserved counted as used
    assert sum("nvmlDeviceGetMemoryInfo_v2 is not available" in r.getMessage() for r in caplog.records) == 1
    registry = render([gpu])
    assert registry.get_sample_value("DCGM_FI_DEV_FB_RESERVED", labels(gpu)) is None  # absent, not 0
    assert registry.get_sample_value("DCGM_FI_DEV_FB_FREE", labels(gpu)) is not None  # derived total - used
    assert backend.query.calls["nvmlDeviceGetMemoryInfo"] == 3  # v2 tried once, then v1 only
    assert gpu.values["nvml_errors_total"] == 0


NVLINK = {38: "nvlink_crc_flit_errors_total", 45: "nvlink_crc_data_errors_total", 52: "nvlink_replay_errors_total",
          59: "nvlink_recovery_errors_total"}


def test_nvlink_counters_absent_where_not_supported_and_read_in_the_one_batched_call(make_backend):
    backend = make_backend()
    (gpu,) = backend.read()  # the recorded H200 (PCIe, no NVLink): every NVLink field is NotSupported
    assert not set(NVLINK.values()) & set(gpu.values)
    assert render([gpu]).get_sample_value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", labels(gpu)) is None
    assert gpu.values["nvml_errors_total"] == 0  # NotSupported is no error
    assert backend.query.calls["nvmlDeviceGetFieldValues"] == 1


def test_nvlink_counters_exported_under_dcgm_names(make_backend, h200):
    probe = copy.deepcopy(h200[0])
    fields = probe["device0"]["field_values"]
    counts = {38: 3, 45: 0, 52: 17, 59: 2}
    for name, entry in fields.items():
        if entry["id"] in counts:
            fields[name] = {"id": entry["id"], "ok": True, "type": 3, "value": counts[entry["id"]]}
    backend = make_backend(gpus=2, probe=probe)
    readings = backend.read()
    assert backend.query.calls["nvmlDeviceGetFieldValues"] == 2  # still one batched call per GPU
    registry = render(readings)
    for gpu in readings:
        for field_id, key in NVLINK.items():
            assert gpu.values[key] == counts[field_id]
        assert registry.get_sample_value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", labels(gpu)) == 3
        assert registry.get_sample_value("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", labels(gpu)) == 0
        assert registry.get_sample_value("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", labels(gpu)) == 17
        assert registry.get_sample_value("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", labels(gpu)) == 2


def test_xid_on_a_mig_instance_counts_on_the_instance_and_the_parent(make_backend):
    backend = make_backend(gpus=1, mig_profiles=["1g.18gb"] * 2)
    backend.read()
    recorded = backend.query.nvml
    recorded.inject_xid(0, 43, gpu_instance=8)  # NVML names GPU instance 8
    recorded.inject_xid(0, 48)  # no instance named: the parent only

    def landed():
        readings = backend.read()
        parent = next(r for r in readings if r.mig_instance_id is None)
        return parent.values.get("xid_43_total") == 1 and parent.values["xid_48_total"] == 1 and readings

    readings = wait_for(landed, what="both xids")
    by_instance = {r.mig_instance_id: r for r in readings}
    assert by_instance[8].values["xid_43_total"] == 1 and by_instance[8].values["xid_48_total"] == 0
    assert by_instance[8].values["xid_last_code"] == 43
    assert by_instance[7].values["xid_43_total"] == 0 and by_instance[7].values["xid_last_code"] == 0
    registry = render(readings)
    assert registry.get_sample_value("gpuwarden_xid_errors_total", labels(by_instance[8], xid="43")) == 1
    assert registry.get_sample_value("gpuwarden_xid_errors_total", labels(by_instance[7], xid="43")) == 0
    assert registry.get_sample_value("gpuwarden_xid_errors_total", labels(by_instance[None], xid="43")) == 1
    assert registry.get_sample_value("DCGM_FI_DEV_XID_ERRORS", labels(by_instance[None])) == 48


def test_mps_clients_are_listed_with_their_own_memory(make_backend):
    backend = make_backend(gpus=2)
    recorded = backend.query.nvml
    recorded.processes[0] = [(900, 700 * 1024**2)]  # the MPS server
    recorded.mps_processes[0] = [(101, 300 * 1024**2), (102, 400 * 1024**2)]
    gpu0, _ = backend.read()
    assert dict(gpu0.processes) == {900: 700 * 1024**2, 101: 300 * 1024**2, 102: 400 * 1024**2}
    assert backend.query.calls["nvmlDeviceGetMPSComputeRunningProcesses"] == 2
    # no compute process on GPU 1: no MPS server, so its clients are not asked for
    backend2 = make_backend(gpus=2)
    backend2.query.nvml.processes[0] = [(900, 700 * 1024**2)]
    backend2.query.nvml.processes[1] = [(901, 700 * 1024**2)]
    backend2.query.nvml.mps_processes[0] = NVML_ERROR_NOT_SUPPORTED  # asked once, then never again
    backend2.read()
    backend2.read()
    assert backend2.query.calls["nvmlDeviceGetMPSComputeRunningProcesses"] == 3  # GPU 0 once, GPU 1 twice
    gpu0, _ = backend2.read()
    assert dict(gpu0.processes) == {900: 700 * 1024**2}


def test_a_device_without_v2_memory_keeps_its_v1_figures(make_backend):
    import pynvml

    backend = make_backend(gpus=1, mig_profiles=["1g.18gb"] * 2)
    recorded = backend.query.nvml

    def before_call(name, handle):
        if name == "nvmlDeviceGetMemoryInfo_v2" and handle is not None and handle.mig_slot is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    recorded.before_call = before_call
    readings = backend.read()
    whole = next(r for r in readings if r.mig_instance_id is None)
    migs = [r for r in readings if r.mig_instance_id is not None]
    assert "mem_reserved_bytes" in whole.values  # the GPU itself still reads v2
    assert all("mem_used_bytes" in r.values and "mem_reserved_bytes" not in r.values for r in migs)
    assert whole.values["nvml_errors_total"] == 0
