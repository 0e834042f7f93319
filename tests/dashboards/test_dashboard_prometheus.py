"""The dashboard over Prometheus (``GPUWARDEN_SOURCE=prometheus``, what the helm chart sets): its
data layer and the Fleet page read the fleet from a real Prometheus (Debian package ``prometheus``,
started as ``tests/store/test_prometheus.py`` starts it) scraping a real exporter on a small simulated
fleet; a Prometheus that does not answer, or a source that is misconfigured, is one clear line on
the page, never a traceback."""

from __future__ import annotations

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from servers import PrometheusServer, free_port, wait_for

from gpuwarden.analytics import report_bundle
from gpuwarden.analytics.windows import DEFAULT_PRESET, window_for
from gpuwarden.dashboards import (
    CACHE_DIR_ENV,
    PROMETHEUS_STEP_ENV,
    PROMETHEUS_URL_ENV,
    SOURCE_ENV,
    STORE_ENV,
)
from gpuwarden.dashboards import data
from gpuwarden.dashboards.launch import APP_PATH
from gpuwarden.exporter import ExporterService
from gpuwarden.sim.backend import SimGpuBackend
from gpuwarden.sim.config import SimConfig
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.store.prometheus import PrometheusSource

STEP = "2s"  # two 1 s scrapes per grid point: every GPU is on every point


@pytest.fixture(scope="module")
def scraped(data_dir, tmp_path_factory):
    """A static simulated fleet (2 nodes x 4 GPUs) served by a real exporter, scraped every second
    by a real Prometheus; yields (Prometheus URL, the fleet's newest samples)."""
    fleet = simulated_fleet(SimConfig(nodes=2, gpus_per_node=4, warmup_days=0.1, data_dir=data_dir))
    fleet.step()
    exporter = ExporterService(SimGpuBackend(fleet), interval_seconds=0.5, host="127.0.0.1", port=0).start()
    server = None
    try:
        target = exporter.url.split("//", 1)[1].rsplit("/metrics", 1)[0]
        server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), [target], [])
        wait_for(server.ready, 30, "prometheus /-/ready")
        probe = PrometheusSource(server.url, timeout=5, retries=0)
        wait_for(lambda: (probe.query("min(count_over_time(DCGM_FI_DEV_FB_USED[1m]))") or [{"value": [0, "0"]}])[0]
                 ["value"][1] not in ("0", "1", "2"), 30, "three prometheus scrapes of every GPU")
        yield server.url, fleet.latest
    finally:
        if server is not None:
            server.stop()
        exporter.stop()


def use_prometheus(monkeypatch, tmp_path, url: str) -> None:
    monkeypatch.delenv(STORE_ENV, raising=False)
    monkeypatch.setenv(SOURCE_ENV, "prometheus")
    monkeypatch.setenv(PROMETHEUS_URL_ENV, url)
    monkeypatch.setenv(PROMETHEUS_STEP_ENV, STEP)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def test_the_data_layer_reads_the_fleet_from_prometheus(scraped, monkeypatch, tmp_path):
    url, latest = scraped
    use_prometheus(monkeypatch, tmp_path, url)
    data.clear_caches()
    info = data.store_info()
    assert info is not None
    assert info.path.startswith(str(tmp_path / "cache"))  # the bundles' folder: under the cache dir
    assert info.oldest < info.newest <= pd.Timestamp.now(tz="UTC") + pd.Timedelta(seconds=1)
    assert info.version % 2 == 0 and info.newest.timestamp() - 2 < info.version <= info.newest.timestamp()
    assert data.current_version() == info.version  # what the auto-refresh compares

    window = window_for(DEFAULT_PRESET, info.oldest, info.newest)
    board = data.Board()
    fleet = board.get("fleet", info.path, window, info.version, data.BUILDERS["fleet"])
    assert set(fleet["grid"]["gpu_uuid"]) == set(latest["gpu_uuid"].astype(object))
    assert list(fleet["reporting"]) == [8, 8]
    saved = report_bundle.load(info.path, "fleet", window.key)
    assert saved is not None and saved.version == info.version  # written to the cache dir for the next process
    assert board.get("fleet", info.path, window, info.version, data.BUILDERS["fleet"]) is fleet
    assert board.computed["fleet"] == 1

    # One GPU's history (the GPU page before its bundle is ready) reads only its node's rows.
    gpu = latest.iloc[0]
    history = data.gpu_history(info.path, window.start, window.end, info.version, str(gpu["node"]), str(gpu["gpu_uuid"]))
    assert history["model"] == gpu["model"]


def test_the_fleet_page_shows_the_gpus_prometheus_holds(scraped, monkeypatch, tmp_path):
    url, latest = scraped
    use_prometheus(monkeypatch, tmp_path, url)
    at = AppTest.from_file(str(APP_PATH), default_timeout=30)
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    gpus = latest["gpu_uuid"].nunique()
    assert metrics["GPUs reporting"] == f"{gpus} of {gpus}"
    assert metrics["Nodes"] == str(latest["node"].nunique())

    # The Queue page reads the scheduler, not the samples source: without it, one line naming the variable.
    monkeypatch.delenv("GPUWARDEN_SCHEDULER_URL", raising=False)
    at.switch_page("views/queue.py")
    at.run()
    assert not at.exception and not at.error
    assert len(at.info) == 1 and "`GPUWARDEN_SCHEDULER_URL` is not set" in at.info[0].value


def test_an_unreachable_prometheus_is_one_clear_line(monkeypatch, tmp_path):
    """No Prometheus at all (a closed port): the page names the URL and the variable to fix."""
    url = f"http://127.0.0.1:{free_port()}"
    use_prometheus(monkeypatch, tmp_path, url)
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    assert len(at.error) == 1 and url in at.error[0].value and PROMETHEUS_URL_ENV in at.error[0].value
    assert not at.metric


@pytest.mark.parametrize("env, expected", [
    ({SOURCE_ENV: "thanos"}, [SOURCE_ENV, "'thanos'", "store, prometheus"]),
    ({SOURCE_ENV: "prometheus"}, [PROMETHEUS_URL_ENV]),
    ({SOURCE_ENV: "prometheus", PROMETHEUS_URL_ENV: "prometheus:9090"}, [PROMETHEUS_URL_ENV, "not a URL"]),
    ({SOURCE_ENV: "prometheus", PROMETHEUS_URL_ENV: "http://127.0.0.1:9", PROMETHEUS_STEP_ENV: "soon"},
     [PROMETHEUS_STEP_ENV, "'soon'", "not a duration"]),
], ids=["unknown-source", "no-url", "bad-url", "bad-step"])
def test_a_misconfigured_source_names_the_variable(monkeypatch, env, expected):
    monkeypatch.delenv(STORE_ENV, raising=False)
    for name in (SOURCE_ENV, PROMETHEUS_URL_ENV, PROMETHEUS_STEP_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    at = AppTest.from_file(str(APP_PATH), default_timeout=30)
    at.run()
    assert not at.exception, at.exception
    assert len(at.error) == 1, [e.value for e in at.error]
    for text in expected:
        assert text in at.error[0].value

