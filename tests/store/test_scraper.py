"""The embedded scraper: exporter /metrics pages -> fleet samples rows -> LocalStore.

The mapping is the metric catalogue inverted; a round trip through the real exporter must give
back the readings it served (MIG instances, throttle bitmask, XIDs, memory total, absent values).
"""

from __future__ import annotations

import socket

import numpy as np
import pandas as pd
import pytest
from builders import GIB, mig_reading
from polling import tick, wait_for

from gpuwarden.exporter import ExporterService
from gpuwarden.fleet import METRIC_COLUMN_NAMES, THROTTLE_REASONS, GpuReading
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.store import PANDAS_DTYPES, LocalStore
from gpuwarden.store.scraper import Scraper, parse_exposition
from gpuwarden.store.series import SeriesMapper

STAMP = pd.Timestamp("2026-11-23T00:00:00Z")


class StaticBackend:
    name = "static"

    def __init__(self, readings):
        self.readings = tuple(readings)

    def read(self):
        return self.readings

    def driver_version(self):
        return "550.90.07"


def readings() -> list[GpuReading]:
    whole = GpuReading(
        node="n1", gpu_uuid="GPU-aaa", gpu_index=0, model="NVIDIA H100 80GB HBM3", namespace="ml", pod="train-0",
        container="main", values={
            "gpu_util_ratio": 0.22, "sm_active_ratio": 0.0, "mem_used_bytes": 10 * GIB + 12345, "mem_total_bytes": 80 * GIB,
            "power_watts": 312.5, "temperature_celsius": 61.0, "sm_clock_mhz": 1980.0,
            "throttle_reasons_bitmask": THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_power_cap"],
            "ecc_dbe_volatile_total": 2, "xid_79_total": 1, "xid_other_total": 4, "recovery_action": 1,
            "remapped_rows_pending": 1,
        })
    mig = mig_reading(2, "3g.40gb", node="n1", uuid="GPU-bbb")  # no GPM: SM absent
    return [whole, mig]


def scraped(readings_, **mapper_options) -> pd.DataFrame:
    service = ExporterService(StaticBackend(readings_), port=0)
    service.collect_now()
    return parse_exposition(service.render_metrics().decode(), SeriesMapper(**mapper_options), STAMP)


def test_round_trip_through_the_exporter():
    frame = scraped(readings(), cluster="lab")
    assert list(frame.columns) == list(PANDAS_DTYPES)
    assert dict(frame.dtypes.astype(str)) == PANDAS_DTYPES
    assert len(frame) == 2 and (frame["timestamp"] == STAMP).all()
    rows = {row.gpu_uuid: row for row in frame.itertuples()}
    whole, mig = rows["GPU-aaa"], rows["GPU-bbb"]
    source = readings()[0].values
    for column, value in source.items():
        assert getattr(whole, column) == pytest.approx(value, rel=1e-12), column
    assert (whole.cluster, whole.node, whole.gpu_index, whole.model) == ("lab", "n1", 0, "NVIDIA H100 80GB HBM3")
    assert (whole.namespace, whole.pod, whole.team) == ("ml", "train-0", "ml")  # namespace-per-team default
    assert pd.isna(whole.mig_instance) and pd.isna(whole.project)
    assert mig.mig_instance == "2:3g.40gb" and mig.gpu_index == 1
    assert pd.isna(mig.pod) and pd.isna(mig.namespace) and pd.isna(mig.team)
    # Absent stays absent: no GPM -> null SM activity, not 0; unmeasured counters stay null.
    assert pd.isna(mig.sm_active_ratio) and pd.isna(mig.power_watts) and pd.isna(mig.throttle_reasons_bitmask)
    assert pd.isna(mig.xid_79_total)
    assert mig.mem_total_bytes == 40 * GIB


def test_labels_and_attribution_override():
    frame = scraped(readings(), attribution=lambda namespace, pod: (f"team-{namespace}", f"proj-{pod}"))
    row = frame[frame["gpu_uuid"] == "GPU-aaa"].iloc[0]
    assert (row["cluster"], row["team"], row["project"]) == ("default", "team-ml", "proj-train-0")
    none = scraped(readings(), attribution=None)
    assert none["team"].isna().all()


def test_sim_fleet_round_trip(data_dir):
    from gpuwarden.sim.backend import SimGpuBackend
    from gpuwarden.sim.config import SimConfig
    from gpuwarden.cli.simfleet import simulated_fleet

    sim = simulated_fleet(SimConfig(nodes=8, gpus_per_node=8, warmup_days=0.5, data_dir=data_dir))
    truth = sim.step()
    frame = scraped(SimGpuBackend(sim).read(), cluster="sim")
    key = lambda f: f["gpu_uuid"].astype(object) + "/" + f["mig_instance"].astype(object).fillna("-")  # noqa: E731
    frame, truth = frame.set_index(key(frame)).sort_index(), truth.set_index(key(truth)).sort_index()
    assert list(frame.index) == list(truth.index)
    for column in ["cluster", "node", "gpu_index", "model", "mig_instance", "namespace", "pod"]:
        assert frame[column].astype(object).fillna("-").tolist() == truth[column].astype(object).fillna("-").tolist(), column
    for column in METRIC_COLUMN_NAMES:
        assert np.allclose(frame[column].astype("float64"), truth[column].astype("float64"), rtol=1e-9, equal_nan=True), column


def test_scraper_writes_the_store_and_survives_a_dead_target(tmp_path):
    """The scrape rounds run on a runner on a FakeClock: each 15 s tick is one round, and rows carry its time."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
    service = ExporterService(StaticBackend(readings()), interval_seconds=0.2, port=0).start()
    scraper = None
    try:
        store = LocalStore(tmp_path / "store")
        start = pd.Timestamp("2026-11-23T00:00:00Z")
        clock = FakeClock(start.timestamp())
        scraper = Scraper([service.url, dead], store, interval_seconds=15, timeout_seconds=1, cluster="lab", clock=clock)
        results = scraper.scrape_once()
        assert [r.ok for r in results] == [True, False]
        assert results[0].rows == 2
        assert results[1].url == dead and "refused" in (results[1].error or "").lower()
        assert store.row_count() == 2
        clock.advance(15)
        scraper.start()  # a round at once, then one per tick (each on its own thread: waited for before the next tick)
        for rounds in (2, 3):
            wait_for(lambda: scraper.scrapes == rounds, what=f"scrape round {rounds}")  # noqa: B023
            tick(clock, 15)
        wait_for(lambda: store.row_count() >= 8, what="three scrape rounds in the store")
        scraper.stop()
        frame = store.read()
        assert len(frame) == 8 and frame["timestamp"].is_monotonic_increasing
        assert sorted(set(frame["timestamp"])) == [start + pd.Timedelta(seconds=15 * k) for k in range(4)]
        assert set(frame["cluster"]) == {"lab"}
        assert scraper.rows_written == len(frame)
        assert scraper.scrapes == 4 and [r.ok for r in scraper.last_results] == [True, False]
    finally:
        if scraper is not None:
            scraper.stop()
        service.stop()


def test_scraper_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        Scraper([], LocalStore(tmp_path))
    with pytest.raises(ValueError):
        Scraper(["http://x/metrics"], LocalStore(tmp_path), interval_seconds=0)


def parsed_by_prometheus_client(text: str, mapper: SeriesMapper) -> pd.DataFrame:
    """The same page through prometheus_client's own parser: what parse_exposition must agree with."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpuwarden.store.series import FrameAssembler

    assembler = FrameAssembler(mapper)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            when = STAMP.value if sample.timestamp is None else int(round(float(sample.timestamp) * 1000)) * 1_000_000
            assembler.add(sample.name, sample.labels, np.array([when]), np.array([sample.value]))
    return assembler.frame()


def test_the_page_parser_reads_what_prometheus_clients_parser_reads():
    service = ExporterService(StaticBackend(readings()), port=0)
    service.collect_now()
    page = service.render_metrics().decode()
    # Escapes, a brace in a value, a trailing comma, spacing and a millisecond timestamp, as a third
    # party's exporter may write them; the series names are the catalogue's.
    uuid_line = next(line for line in page.splitlines() if line.startswith("DCGM_FI_DEV_POWER_USAGE{"))
    labels, _, value = uuid_line.rpartition("} ")
    odd = (labels.replace('pod="train-0"', 'pod="tr\\"ain\\\\0}\\n"').replace("{", " {", 1)
           + f",}}  {value} 1764547200123")
    for text in (page, page + odd + "\n"):
        mapper = SeriesMapper(cluster="lab")
        ours, theirs = parse_exposition(text, mapper, STAMP), parsed_by_prometheus_client(text, mapper)
        pd.testing.assert_frame_equal(ours, theirs)
    assert 'tr"ain\\0}\n' in set(ours["pod"].astype(object)) and pd.Timestamp(1764547200123, unit="ms", tz="UTC") in set(
        ours["timestamp"])
    with pytest.raises(ValueError, match="not a label set in the Prometheus text format: 'DCGM_FI_DEV_GPU_TEMP"):
        parse_exposition('DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID=unquoted} 61\n', SeriesMapper(), STAMP)
    with pytest.raises(ValueError, match="not a sample line"):
        parse_exposition("DCGM_FI_DEV_GPU_TEMP\n", SeriesMapper(), STAMP)
