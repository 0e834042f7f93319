"""Scrape health read back from a real Prometheus: a GPU exporter target that slows down, flaps and
loses a GPU's series is recorded by Prometheus (``up``, ``scrape_duration_seconds``,
``scrape_samples_scraped``), read per node by ``PrometheusSource.read_scrape_health`` and judged by
the health scan's observability-collapse rule."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest
from servers import PrometheusServer, wait_for

from gpuwarden.analytics.health import scan
from gpuwarden.analytics.health.collapse_rules import CollapseConfig
from gpuwarden.fleet import FindingKind
from gpuwarden.fleet.scrape_health import SCRAPE_HEALTH_COLUMN_NAMES
from gpuwarden.store.prometheus import PrometheusSource

NODE = "gpu-node-7"
GPUS = 4


class FlakyExporter:
    """dcgm-exporter's series for one node's GPUs; ``mode``: normal | slow | flap (every other
    scrape fails) | thin (GPU 3's series missing every other scrape, scrapes slow)."""

    def __init__(self) -> None:
        self.mode = "normal"
        self.scrapes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                owner.scrapes += 1
                mode, odd = owner.mode, owner.scrapes % 2 == 1
                if mode in ("slow", "thin"):
                    time.sleep(0.35)
                if mode == "flap" and odd:
                    self.send_response(500)
                    self.end_headers()
                    return
                lines = []
                for gpu in range(GPUS):
                    if mode == "thin" and gpu == 3 and odd:
                        continue
                    labels = (f'gpu="{gpu}",UUID="GPU-0000000{gpu}-aaaa-bbbb-cccc-000000000000",Hostname="{NODE}",'
                              f'modelName="NVIDIA H100 80GB HBM3"')
                    for metric, value in (("DCGM_FI_DEV_FB_USED", 1000 + gpu), ("DCGM_FI_DEV_FB_FREE", 80000),
                                          ("DCGM_FI_DEV_GPU_UTIL", 90), ("DCGM_FI_DEV_POWER_USAGE", 500.5),
                                          ("DCGM_FI_DEV_GPU_TEMP", 60)):
                        lines.append(f"{metric}{{{labels}}} {value}")
                payload = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Prometheus scraping the flaky exporter every second through normal, slow, flapping and
    thinning phases; the phases' (start, end) times."""
    tmp = tmp_path_factory.mktemp("scrape-health")
    exporter = FlakyExporter()
    server = None
    try:
        server = PrometheusServer(tmp, [exporter.target], [])
        wait_for(server.ready, 30, "prometheus /-/ready")
        source = PrometheusSource(server.url, step=1, timeout=15, retries=1, backoff=0.05, rollups=False)
        wait_for(lambda: source.query("count(DCGM_FI_DEV_FB_USED)"), 30, "the first scraped samples in prometheus")
        phases = {}
        for mode, seconds in (("normal", 12), ("slow", 5), ("flap", 6), ("normal", 3), ("thin", 8)):
            start = pd.Timestamp.now(tz="UTC")
            exporter.mode = mode
            time.sleep(seconds)
            phases.setdefault(mode, (start, pd.Timestamp.now(tz="UTC")))
        exporter.mode = "normal"
        time.sleep(2)
        yield source, phases
    finally:
        if server is not None:
            server.stop()
        exporter.stop()


def _in(frame: pd.DataFrame, span: tuple[pd.Timestamp, pd.Timestamp]) -> pd.DataFrame:
    return frame[(frame["timestamp"] > span[0] + pd.Timedelta(seconds=1.5)) & (frame["timestamp"] <= span[1])]


def test_slow_and_flapping_target_read_back_as_scrape_health(recorded):
    source, phases = recorded
    start, end = phases["normal"][0], pd.Timestamp.now(tz="UTC")
    health = source.read_scrape_health(start, end)
    assert list(health.columns) == list(SCRAPE_HEALTH_COLUMN_NAMES)
    assert set(health["node"]) == {NODE} and set(health["job"]) == {"gpuwarden"}  # mapped through Hostname
    normal, slow, flap, thin = (_in(health, phases[m]) for m in ("normal", "slow", "flap", "thin"))
    assert len(normal) >= 8 and (normal["up_ratio"] == 1).all()
    assert normal["scrape_duration_seconds"].median() < 0.1
    assert slow["scrape_duration_seconds"].median() > 0.3 and (slow["up_ratio"] == 1).all()
    # up flapping: at a 1 s step each row holds one scrape, so the drops are transitions between rows
    # (``up_drops`` counts those inside a step: several scrapes per step)
    up = flap["up_ratio"].to_numpy()
    assert ((up[1:] < 1) & (up[:-1] == 1)).sum() >= 2
    full = normal["scrape_samples_scraped"].max()
    assert full == GPUS * 5
    assert thin["scrape_samples_scraped"].min() == (GPUS - 1) * 5  # GPU 3's series lost every other scrape


def test_collapse_found_from_what_prometheus_recorded(recorded):
    source, phases = recorded
    start, end = phases["normal"][0], pd.Timestamp.now(tz="UTC")
    samples = source.read(start, end)
    health = source.read_scrape_health(start, end)
    # thresholds scaled from hours to seconds: a 6 s window over a 10 s baseline
    config = CollapseConfig(window_s=6, baseline_s=10, min_baseline_steps=5, settle_s=1, min_missed=2)
    found = [f for f in scan(samples, scrape=health, collapse=config) if f.kind == FindingKind.OBSERVABILITY_COLLAPSE]
    assert found, "no collapse finding"
    signals = {s for f in found for s in f.evidence["signals_in_episode"]}
    assert {"scrape_slowing", "up_flapping"} <= signals
    thinning = [f for f in found if f.gpu_uuid is not None]
    assert {f.gpu_uuid for f in thinning} == {"GPU-00000003-aaaa-bbbb-cccc-000000000000"}
    assert all(f.node == NODE and f.recommended_action is None for f in found)


def test_samples_file_has_no_scrape_health_and_a_source_without_gpu_series_reads_none(recorded):
    source, phases = recorded
    empty = source.read_scrape_health(phases["normal"][0] - pd.Timedelta(hours=2), phases["normal"][0] - pd.Timedelta(hours=1))
    assert empty.empty and list(empty.columns) == list(SCRAPE_HEALTH_COLUMN_NAMES)


def test_scrape_health_that_cannot_be_read_leaves_the_scan_to_series_presence(caplog):
    """A Prometheus that does not answer the scrape-health queries (here: nothing listens) costs the
    scan its collapse signals only: said once, and the window's samples are still scanned."""
    from gpuwarden.cli.health_cmd import _scrape_health

    with socket_closed() as url:
        source = PrometheusSource(url, timeout=1, retries=0)
        with caplog.at_level("WARNING"):
            assert _scrape_health(source, pd.Timestamp("2026-11-01", tz="UTC"), pd.Timestamp("2026-11-01 01:00", tz="UTC")) is None
    assert "scrape health of 2026-11-01 00:00:00+00:00..2026-11-01 01:00:00+00:00 not read" in caplog.text
    assert "judging series presence only" in caplog.text


class socket_closed:
    """The URL of a local port nothing listens on (bound, then closed)."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        return None
