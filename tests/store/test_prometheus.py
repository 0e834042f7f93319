"""PrometheusSource against a real Prometheus, and its errors against tiny local HTTP servers.

The integration test starts Prometheus (Debian package ``prometheus``) on 127.0.0.1 with a temp
config and TSDB, scraping a real exporter on the simulated fleet every second, and the embedded
scraper on the same exporter writing a LocalStore; it polls (never sleeps a fixed time) until
both have samples, then checks that both sources give the same fleet samples for the same window
and that recording-rule series appear.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from servers import assert_reports_agree, FAST_PARAMS, fast_rules, free_port, PrometheusServer, rollup_window, wait_for

from gpuwarden.analytics import IdleParams
from gpuwarden.cli.sources import add_source_options, open_window
from gpuwarden.exporter import ExporterService
from gpuwarden.fleet import IDENTITY_COLUMN_NAMES, METRIC_COLUMN_NAMES
from gpuwarden.sim.backend import SimGpuBackend
from gpuwarden.sim.config import SimConfig
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.store import LocalStore, SamplesError
from gpuwarden.store.prometheus import (
    PrometheusError,
    PrometheusQueryError,
    PrometheusSource,
    PrometheusUnavailable,
)
from gpuwarden.store.scraper import Scraper

ROOT = Path(__file__).resolve().parents[2]


def by_device(frame: pd.DataFrame) -> pd.DataFrame:
    """The newest row of each GPU / MIG instance, indexed by (gpu_uuid, mig_instance)."""
    mig = frame["mig_instance"].astype(object)
    frame = frame.assign(_uuid=frame["gpu_uuid"].astype(object), _mig=mig.where(mig.notna(), "-"))
    return frame.sort_values("timestamp").groupby(["_uuid", "_mig"], sort=True).tail(1).set_index(["_uuid", "_mig"]).sort_index()


def device_keys(frame: pd.DataFrame) -> list[str]:
    mig = frame["mig_instance"].astype(object)
    return [f"{uuid}/{m}" for uuid, m in zip(frame["gpu_uuid"].astype(object), mig.where(mig.notna(), "-"))]


def assert_same_samples(left: pd.DataFrame, right: pd.DataFrame, columns=None) -> None:
    assert list(left.index) == list(right.index)
    for column in columns or [c for c in left.columns if not c.startswith("_") and c != "timestamp"]:
        a, b = left[column], right[column]
        if column in METRIC_COLUMN_NAMES:
            a_values, b_values = a.astype("float64").to_numpy(), b.astype("float64").to_numpy()
            assert np.allclose(a_values, b_values, rtol=1e-9, atol=1e-9, equal_nan=True), \
                f"{column}: {a_values[:5]} != {b_values[:5]}"
        else:
            assert a.astype(object).where(a.notna(), None).tolist() == b.astype(object).where(b.notna(), None).tolist(), column


@pytest.fixture(scope="module")
def fleet(data_dir):
    sim = simulated_fleet(SimConfig(nodes=8, gpus_per_node=8, warmup_days=0.5, data_dir=data_dir))
    sim.step()
    return sim


@pytest.fixture(scope="module")
def stack(fleet, tmp_path_factory):
    """Exporter (sim backend) -> real Prometheus, and -> embedded scraper -> LocalStore."""
    tmp = tmp_path_factory.mktemp("prometheus")
    started = pd.Timestamp.now(tz="UTC").floor("s")
    exporter = ExporterService(SimGpuBackend(fleet), interval_seconds=0.5, host="127.0.0.1", port=0).start()
    server = scraper = None
    try:
        target = exporter.url.split("//", 1)[1].rsplit("/metrics", 1)[0]
        server = PrometheusServer(tmp, [target], fast_rules(tmp))
        store = LocalStore(tmp / "store")
        scraper = Scraper([exporter.url], store, interval_seconds=1.0, cluster="sim").start()
        wait_for(server.ready, 30, "prometheus /-/ready")
        source = PrometheusSource(server.url, step=1, lookback="2s", timeout=15, retries=1, backoff=0.05, rollups=False)
        devices = len(fleet.latest)
        wait_for(lambda: source.query("count(DCGM_FI_DEV_FB_USED)") and
                 int(float(source.query("count(DCGM_FI_DEV_FB_USED)")[0]["value"][1])) == devices,
                 30, "the first scraped samples in prometheus")
        # Three scrapes each, so the window holds several grid points of both.
        wait_for(lambda: (source.query("min(count_over_time(DCGM_FI_DEV_FB_USED[1m]))") or [{"value": [0, "0"]}])[0]["value"][1]
                 not in ("0", "1", "2"), 30, "three prometheus scrapes")
        wait_for(lambda: scraper.scrapes >= 3 and store.row_count() >= 3 * devices, 20, "three embedded scrapes")
        yield {"exporter": exporter, "server": server, "source": source, "store": store, "scraper": scraper,
               "started": started, "fleet": fleet}
    finally:
        if scraper is not None:
            scraper.stop()
        if server is not None:
            server.stop()
        exporter.stop()


def test_prometheus_and_local_store_give_the_same_samples(stack):
    source, store, fleet = stack["source"], stack["store"], stack["fleet"]
    scraper = stack["scraper"]
    scraper.stop()  # freeze the local store; Prometheus keeps scraping the same (static) fleet
    end = pd.Timestamp.now(tz="UTC").ceil("s")
    start = stack["started"]
    local = store.read(start, end)
    remote = source.read(start, end)
    assert len(local) and len(remote)
    assert list(remote.columns) == list(local.columns)
    assert dict(remote.dtypes.astype(str)) == dict(local.dtypes.astype(str))
    assert remote["timestamp"].between(start, end, inclusive="left").all()
    assert remote["timestamp"].is_monotonic_increasing
    # Same GPUs, same values, as each other and as the fleet the exporter served.
    devices = len(fleet.latest)
    assert remote.groupby("timestamp").size().max() == devices
    assert remote["timestamp"].nunique() >= 2
    left, right = by_device(remote), by_device(local)
    assert len(left) == devices
    # Prometheus relabels a project from the pod's name (PROJECT_FROM_POD); the embedded scraper does not.
    assert_same_samples(left, right, [c for c in left.columns if not c.startswith("_") and c not in ("timestamp", "project")])
    assert set(left["project"].dropna()) == {pod.split("-")[0] for pod in left["pod"].dropna()}
    truth = by_device(fleet.latest)
    assert_same_samples(left, truth, [c for c in IDENTITY_COLUMN_NAMES[1:] if c not in ("team", "project")]
                        + list(METRIC_COLUMN_NAMES))
    # A column subset reads only what it needs and agrees.
    subset = source.read(start, end, columns=["timestamp", "gpu_uuid", "gpu_util_ratio", "mem_total_bytes"])
    assert list(subset.columns) == ["timestamp", "gpu_uuid", "gpu_util_ratio", "mem_total_bytes"]
    assert len(subset) == len(remote)


def test_idle_report_is_the_same_from_prometheus_and_the_local_store(stack):
    """The issue's promise: the same report whichever source holds the data. The fleet is static
    here (the simulation is not stepped), so every state's share of GPU time must agree exactly even
    though the two sources sampled at different instants."""
    from gpuwarden.analytics import build_ledger, idle_report

    stack["scraper"].stop()
    start, end = stack["started"], pd.Timestamp.now(tz="UTC").ceil("s")
    reports = {name: idle_report(build_ledger(source, start, end)).summary
               for name, source in (("prometheus", stack["source"]), ("local", stack["store"]))}
    remote, local = reports["prometheus"], reports["local"]
    assert remote["gpus"] == local["gpus"] == stack["fleet"].config.nodes * stack["fleet"].config.gpus_per_node
    assert remote["gpu_hours"] > 0 and local["gpu_hours"] > 0
    for key in ("idle_share", "efficiency_score"):
        assert remote[key] == pytest.approx(local[key], abs=1e-9), key
    for reason, hours in local["idle_gpu_hours_by_reason"].items():
        assert remote["idle_gpu_hours_by_reason"][reason] / remote["gpu_hours"] == pytest.approx(
            hours / local["gpu_hours"], abs=1e-9), reason


def test_time_range_and_cli_window(stack):
    source, started = stack["source"], stack["started"]
    span = source.time_range()
    assert span is not None
    oldest, newest = span
    assert started - pd.Timedelta(seconds=2) <= oldest <= newest <= pd.Timestamp.now(tz="UTC") + pd.Timedelta(seconds=1)
    import argparse

    parser = argparse.ArgumentParser()
    add_source_options(parser)
    args = parser.parse_args(["--source", "prometheus", "--prometheus-url", stack["server"].url,
                              "--prometheus-step", "1s", "--since", "1h"])
    window = open_window(args)
    assert isinstance(window.source, PrometheusSource)
    # The window ends at now; asked for an hour of a Prometheus holding seconds, it is trimmed to the
    # data held and says so.
    assert window.end > newest and window.start >= oldest - pd.Timedelta(seconds=1)
    assert window.end - window.start < pd.Timedelta(hours=1) and "trimmed to the data held" in window.note
    assert len(window.source.read(window.start, window.end, columns=["gpu_uuid"])) > 0


def test_recording_rules_and_rollup(stack):
    source, fleet = stack["source"], stack["fleet"]
    devices = len(fleet.latest)
    # The recorded idle indicator appears for every device that reports activity.
    series = wait_for(lambda: len(source.query("gpu:gpuwarden_idle:bool")) == devices and source.query("gpu:gpuwarden_idle:bool"),
                      30, "gpu:gpuwarden_idle:bool for every device")
    assert {float(s["value"][1]) for s in series} <= {0.0, 1.0}
    wait_for(lambda: source.query("namespace:gpuwarden_idle_gpus:sum"), 30, "namespace:gpuwarden_idle_gpus:sum")
    # The fleet is static, so each GPU is idle for all or none of a window; the rollup (pushed into
    # PromQL, from the rules and from raw series) says so per GPU and per namespace.
    latest = fleet.latest
    sm, util = latest["sm_active_ratio"], latest["gpu_util_ratio"]
    params = IdleParams()  # the rules are generated from the classifier's parameters
    fake = sm.notna() & (sm < params.idle_activity) & (util >= params.fake_busy_util)
    idle = np.where(sm.notna(), sm < params.idle_activity, util < params.idle_activity) & ~fake
    expected_idle = dict(zip(device_keys(latest), idle))
    # The clock proposes a window, the data accepts it: read_rollup evaluates at multiples of its
    # step, so the end sits on the 4 s grid; every device's rule series holds 3+ evaluations in
    # the 4 s before it (on a loaded machine the rules may start late), and both series have an
    # evaluation after it, so nothing in the window is still being written (a rule group's
    # evaluations run in order; CI once saw idle 3 s against allocated-idle 2 s at a live edge).
    def settled_end():
        end = math.floor(time.time() / 4) * 4 - 4
        counts = source.query("count_over_time(gpu:gpuwarden_idle:bool[3999ms])", at=end)
        newest = [source.query(f"min(timestamp({name}))") for name in
                  ("gpu:gpuwarden_idle:bool", "gpu:gpuwarden_allocated_idle:bool")]
        settled = len(counts) == devices and min(float(c["value"][1]) for c in counts) >= 3 and \
            all(found and float(found[0]["value"][1]) > end for found in newest)
        return pd.Timestamp(end, unit="s", tz="UTC") if settled else None

    end = wait_for(settled_end, 30, "4 settled seconds of rule evaluations for every device")
    start = end - pd.Timedelta(seconds=4)
    for use_rules in (False, True):
        fast = PrometheusSource(source.url, rule_interval="1s")
        rollup = fast.read_rollup(start, end, step="4s", by="gpu", use_rules=use_rules)
        assert len(rollup) == devices, use_rules
        keys = device_keys(rollup)
        for key, row in zip(keys, rollup.itertuples()):
            assert row.observed_gpu_seconds > 0
            assert row.idle_gpu_seconds == (row.observed_gpu_seconds if expected_idle[key] else 0), (key, use_rules)
            assert row.allocated_idle_gpu_seconds == (row.idle_gpu_seconds if isinstance(row.pod, str) else 0)
        namespaces = fast.read_rollup(start, end, step="4s", by="namespace", use_rules=use_rules)
        assert namespaces["idle_gpu_seconds"].sum() == pytest.approx(rollup["idle_gpu_seconds"].sum())


def test_reports_from_rollups_match_raw_samples(stack):
    """#17: the four reports from the recording-rule rollups (classified by the generated PromQL,
    one row per GPU, namespace and state per rollup) and from raw samples (classified in Python)
    agree within 1% on the same data, team and project included (project relabelled from the pod)."""
    from gpuwarden.analytics import build_ledger

    raw, fleet = stack["source"], stack["fleet"]
    rollup = PrometheusSource(raw.url, step=1, lookback="2s", timeout=15, rule_interval="1s", rollup_interval="5s")

    def rollup_times():
        found = raw.query("gpu:gpuwarden_state_seconds:5m[10m]")
        per_series = [[float(v[0]) for v in series["values"]] for series in found]
        return per_series if len({s["metric"]["UUID"] for s in found}) == len({*fleet.latest["gpu_uuid"]}) and \
            min(map(len, per_series)) >= 6 else None

    # Six 5 s rollups: one rule evaluation run late (a loaded machine) moves the total by 1/30, inside 5%.
    times = wait_for(rollup_times, 90, "six rollups of every GPU")
    window = rollup_window(times, rollup_seconds=5, lag_seconds=1)
    from_rollup = build_ledger(rollup, *window, params=FAST_PARAMS)
    from_raw = build_ledger(raw, *window, params=FAST_PARAMS)
    assert from_rollup.quality["source"] == "rollup" and from_raw.quality["source"] == "samples"
    assert any("recording-rule rollups" in note for note in from_rollup.notes)
    # On a loaded machine a 1 s rule evaluation may be skipped (Prometheus counts them) or run late,
    # so the rollups' total time can differ by a few evaluations at this 1 s test cadence (at the
    # shipped 1 m it is far below 1%); every report figure below is held to 1%.
    with urllib.request.urlopen(f"{raw.url}/metrics", timeout=10) as response:
        own = response.read().decode()
    missed = sum(float(line.rsplit(" ", 1)[1]) for line in own.splitlines()
                 if line.startswith("prometheus_rule_group_iterations_missed_total"))
    if missed == 0:
        assert from_rollup.gpu_hours == pytest.approx(from_raw.gpu_hours, rel=0.05)
    assert int(from_rollup.instances["gpu_uuid"].nunique()) == int(from_raw.instances["gpu_uuid"].nunique()) == \
        fleet.latest["gpu_uuid"].nunique()
    assert from_raw.rows["project"].notna().any()  # relabelled from the pod: the rollups must keep it
    assert_reports_agree(from_rollup, from_raw)


def test_promql_error_is_passed_through(stack):
    with pytest.raises(PrometheusQueryError) as caught:
        stack["source"].query("sum(DCGM_FI_DEV_GPU_UTIL")
    assert "parse error" in caught.value.prometheus_message
    assert "sum(DCGM_FI_DEV_GPU_UTIL" in str(caught.value) and "\n" not in str(caught.value)


# -- failures without a real Prometheus ---------------------------------------------------------
class FakePrometheus:
    """A tiny HTTP server: answers ``status`` with ``body`` and records each request."""

    def __init__(self, status: int, body: dict | str) -> None:
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                owner.requests.append({"path": self.path, "headers": dict(self.headers),
                                       "form": self.rfile.read(length).decode()})
                payload = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_5xx_is_retried_then_a_clear_error():
    with FakePrometheus(503, "Service Unavailable") as fake:
        source = PrometheusSource(fake.url, retries=2, backoff=0.01)
        with pytest.raises(PrometheusUnavailable) as caught:
            source.read("2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z")
    assert len(fake.requests) >= 3 and len(fake.requests) % 3 == 0  # every attempt of each request
    message = str(caught.value)
    assert "unavailable after 3 attempt(s)" in message and "HTTP 503" in message and fake.url in message
    assert "\n" not in message and isinstance(caught.value, SamplesError)  # the CLI prints it as one line


def test_prometheus_down_is_a_clear_error():
    port = free_port()  # nothing listens there
    source = PrometheusSource(f"http://127.0.0.1:{port}", retries=1, backoff=0.01, timeout=2)
    with pytest.raises(PrometheusUnavailable, match=r"unavailable after 2 attempt\(s\)"):
        source.query("up")


def test_query_errors_are_not_retried_and_keep_prometheus_words():
    body = {"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unclosed left parenthesis"}
    with FakePrometheus(400, body) as fake:
        with pytest.raises(PrometheusQueryError, match="unclosed left parenthesis") as caught:
            PrometheusSource(fake.url, retries=3, backoff=0.01).query("sum(")
    assert len(fake.requests) == 1 and caught.value.error_type == "bad_data"


def test_bearer_token_and_form_are_sent(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    empty = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    with FakePrometheus(200, empty) as fake:
        source = PrometheusSource(fake.url + "/", bearer_token_file=token, step="15s")
        frame = source.read("2026-11-01T00:00:00Z", "2026-11-01T00:10:00Z", columns=["timestamp", "gpu_util_ratio"])
    assert frame.empty and list(frame.columns) == ["timestamp", "gpu_util_ratio"]
    assert all(r["path"] == "/api/v1/query_range" for r in fake.requests)
    assert all(r["headers"]["Authorization"] == "Bearer s3cret" for r in fake.requests)
    request = next(r for r in fake.requests if "DCGM_FI_DEV_GPU_UTIL" in r["form"])
    assert request["headers"]["Authorization"] == "Bearer s3cret"
    form = urllib.parse.parse_qs(request["form"])
    assert form["query"] == ["last_over_time(DCGM_FI_DEV_GPU_UTIL[14999ms])"] and form["step"] == ["15s"]


def test_unauthorised_says_so():
    with FakePrometheus(401, "Unauthorized") as fake:
        with pytest.raises(PrometheusError, match="HTTP 401"):
            PrometheusSource(fake.url, retries=3, backoff=0.01).query("up")
        assert len(fake.requests) == 1


def test_long_ranges_are_split_into_grid_aligned_chunks():
    empty = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    with FakePrometheus(200, empty) as fake:
        source = PrometheusSource(fake.url, step=60, chunk="1d", concurrency=1)
        source.read("2026-11-01T00:00:30Z", "2026-11-04T00:00:00Z", columns=["timestamp", "gpu_util_ratio"])
    forms = [{k: v[0] for k, v in urllib.parse.parse_qs(r["form"]).items()} for r in fake.requests]
    forms = [f for f in forms if "DCGM_FI_DEV_GPU_UTIL" in f["query"]]
    spans = sorted((float(f["start"]), float(f["end"])) for f in forms)
    assert len(spans) == 3
    first = pd.Timestamp("2026-11-01T00:01:00Z").value / 1e9  # aligned up to the step
    last = pd.Timestamp("2026-11-03T23:59:00Z").value / 1e9  # the end is exclusive
    assert spans[0][0] == first and spans[-1][1] == last
    for (_, a_end), (b_start, _) in zip(spans, spans[1:]):
        assert b_start == a_end + 60  # no gap, no overlap
    assert all((end - start) / 60 + 1 <= 1440 for start, end in spans)


def test_bad_url_and_duration():
    with pytest.raises(PrometheusError, match="not a URL"):
        PrometheusSource("localhost:9090")
    with pytest.raises(PrometheusError, match="not a duration"):
        PrometheusSource("http://x", step="fast")
