"""The fleet dashboard: its pure computations on a hand-built fleet, the app run headless with
Streamlit's AppTest, and the launcher."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request

import numpy as np
import pandas as pd
import pytest
from polling import wait_for
from streamlit.testing.v1 import AppTest

from gpuwarden.analytics import fleet_report as fv
from gpuwarden.dashboards import STORE_ENV
from gpuwarden.dashboards.launch import APP_PATH, dashboard_command, dashboard_url, launch_dashboard
from gpuwarden.fleet import SAMPLE_COLUMN_NAMES
from gpuwarden.fleet.processes import stop_process
from gpuwarden.store import LocalStore, coerce

START = pd.Timestamp("2025-03-01T00:00:00Z")
MINUTES = 60  # one hour at 60 s
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"

# gpu -> (node, index, model, util, sm activity, temperature, pod, team) at the newest sample.
GPUS = {
    "GPU-a0": ("node-a", 0, H100, 0.8, 0.5, 60.0, "train-0", "alpha"),
    "GPU-a1": ("node-a", 1, H100, 0.6, 0.3, 62.0, "train-1", "alpha"),
    "GPU-a2": ("node-a", 2, H100, 0.4, 0.2, 64.0, "infer-0", "beta"),
    "GPU-a3": ("node-a", 3, H100, 0.0, 0.0, 40.0, None, None),
    "GPU-b0": ("node-b", 0, A100, 0.5, np.nan, 55.0, "train-2", "alpha"),
    "GPU-b1": ("node-b", 1, A100, 0.3, np.nan, 50.0, None, None),
    "GPU-b2": ("node-b", 2, A100, 0.0, np.nan, 45.0, None, None),
    "GPU-b3": ("node-b", 3, A100, 0.2, np.nan, 42.0, None, None),
}


def xid79_gpu_a1(minute: int) -> float:
    """Increasing: +1 at minute 20, unknown at minute 30, +1 at minute 40 -> 2 events."""
    if minute == 30:
        return np.nan
    return 0 + (minute >= 20) + (minute >= 40)


def xid13_gpu_b2(minute: int) -> int:
    """5, +1 at minute 10, reset to 0 at minute 30, +1 at minute 50 -> 2 events (max-min would say 6)."""
    if minute < 10:
        return 5
    if minute < 30:
        return 6
    return 0 if minute < 50 else 1


def fleet_frame() -> pd.DataFrame:
    rows = []
    for minute in range(MINUTES):
        timestamp = START + pd.Timedelta(minutes=minute)
        for uuid, (node, index, model, util, sm, temperature, pod, team) in GPUS.items():
            row = dict.fromkeys(SAMPLE_COLUMN_NAMES, np.nan)
            # GPU-b1 ran a job during the first half hour only: not allocated now.
            if uuid == "GPU-b1" and minute < 30:
                pod, team = "old-job", "gamma"
            row.update(
                timestamp=timestamp, cluster="test", node=node, gpu_uuid=uuid, gpu_index=index, model=model,
                mig_instance=None, namespace=None if pod is None else f"ns-{team}", pod=pod, team=team,
                project=None if team is None else f"{team}-project",
                gpu_util_ratio=util, sm_active_ratio=sm, mem_total_bytes=80e9, mem_used_bytes=40e9 if pod else 0.0,
                power_watts=300.0 * util + 70.0, sm_clock_mhz=1980.0, throttle_reasons_bitmask=0,
                # temperature: a 10 degree spike at minute 45
                temperature_celsius=temperature + (10.0 if minute == 45 else 0.0),
            )
            for column in SAMPLE_COLUMN_NAMES:
                if column.startswith(("xid_", "ecc_", "remapped_", "pcie_")) or column == "recovery_action":
                    row[column] = 0
            if uuid == "GPU-a1":
                row["xid_79_total"] = xid79_gpu_a1(minute)
            if uuid == "GPU-b2":
                row["xid_13_total"] = xid13_gpu_b2(minute)
            rows.append(row)
    return coerce(pd.DataFrame(rows))


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return fleet_frame()


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, frame) -> str:
    root = tmp_path_factory.mktemp("store")
    LocalStore(root).append(frame)
    return str(root)


# -- pure functions ----------------------------------------------------------------------------


def test_snapshot_is_the_newest_sample_per_gpu(frame):
    snapshot = fv.latest_snapshot(frame)
    assert len(snapshot) == 8
    assert (snapshot["timestamp"] == START + pd.Timedelta(minutes=MINUTES - 1)).all()


def test_headline_counts_and_means_ignore_unmeasured_sm_activity(frame):
    head = fv.headline(frame)
    assert (head.gpus, head.nodes) == (8, 2)
    assert head.allocated_gpus == 4.0  # a0, a1, a2, b0; b1's job ended half an hour ago
    assert head.mean_util == pytest.approx((0.8 + 0.6 + 0.4 + 0.0 + 0.5 + 0.3 + 0.0 + 0.2) / 8)
    # The A100s do not measure SM activity: the mean is over the H100s, not diluted by zeros.
    assert head.mean_sm_active == pytest.approx((0.5 + 0.3 + 0.2 + 0.0) / 4)
    assert head.sm_measured_gpus == 4
    assert head.newest == START + pd.Timedelta(minutes=59)


def test_headline_says_when_sm_activity_is_not_measured(frame):
    a100 = frame[frame["model"] == A100]
    head = fv.headline(a100)
    assert head.mean_sm_active is None and head.sm_measured_gpus == 0
    assert head.mean_util == pytest.approx(0.25)


def test_allocation_by_team_counts_gpus_now(frame):
    teams = fv.allocation_by_team(fv.latest_snapshot(frame))
    assert teams.to_dict("list") == {"team": ["alpha", "beta"], "gpus": [3.0, 1.0]}


def test_allocation_by_model(frame):
    models = fv.allocation_by_model(fv.latest_snapshot(frame))
    assert models.to_dict("list") == {
        "model": [A100, H100],
        "gpus": [4, 4],
        "allocated": [1.0, 3.0],
        "free": [3.0, 1.0],
    }


def test_xid_events_handle_gaps_and_counter_resets(frame):
    events = fv.xid_events(frame)
    assert events.loc["GPU-a1", "xid_79_total"] == 2
    assert events.loc["GPU-b2", "xid_13_total"] == 2  # the reset's drop of 6 is not counted
    assert events["total"].to_dict() == {uuid: {"GPU-a1": 2, "GPU-b2": 2}.get(uuid, 0) for uuid in GPUS}


def test_counter_increase_after_a_reset_counts_the_new_value():
    stamps = pd.date_range(START, periods=5, freq="min")
    frame = pd.DataFrame({"gpu_uuid": ["g"] * 5, "timestamp": stamps, "c": pd.array([3, 4, 1, 1, 2], dtype="Int64")})
    # +1, reset (1 event since it), +0, +1
    assert fv.counter_increase(frame, "c").to_dict() == {"g": 3.0}


def test_node_table(frame):
    table = fv.node_table(frame).set_index("node")
    assert table.loc["node-a", "model"] == H100
    assert table.loc["node-a"].drop(["model", "mean_util"]).to_dict() == {
        "gpus": 4, "allocated": 3.0, "max_temperature_celsius": 74.0, "xid_events": 2,
    }
    assert table.loc["node-b"].drop(["model", "mean_util"]).to_dict() == {
        "gpus": 4, "allocated": 1.0, "max_temperature_celsius": 65.0, "xid_events": 2,
    }
    assert table.loc["node-a", "mean_util"] == pytest.approx(0.45)
    assert table.loc["node-b", "mean_util"] == pytest.approx(0.25)


def test_utilisation_over_time_buckets_and_skips_nan(frame):
    series = fv.utilisation_over_time(frame, "10min")
    assert len(series) == 6 and series.index[0] == START
    assert series["gpu_util_ratio"].to_numpy() == pytest.approx([2.8 / 8] * 6)
    assert series["sm_active_ratio"].to_numpy() == pytest.approx([0.25] * 6)
    assert fv.bucket_for("1h") == "1min" and fv.bucket_for("24h") == "10min"


def test_mig_instances_count_as_their_share():
    snapshot = pd.DataFrame({
        "timestamp": [START] * 4,
        "node": ["n"] * 4,
        "gpu_uuid": ["GPU-m", "GPU-m", "GPU-m", "GPU-w"],
        "model": [H100] * 4,
        "mig_instance": ["1:3g.40gb", "2:2g.20gb", "3:2g.20gb", None],
        "pod": ["p1", None, "p3", "p4"],
        "team": ["alpha", None, "beta", "beta"],
    })
    assert fv.gpu_share(snapshot).tolist() == pytest.approx([3 / 7, 2 / 7, 2 / 7, 1.0])
    teams = fv.allocation_by_team(snapshot)
    assert teams.set_index("team")["gpus"].to_dict() == pytest.approx({"beta": 2 / 7 + 1, "alpha": 3 / 7})
    head = fv.headline(snapshot.assign(gpu_util_ratio=0.5, sm_active_ratio=np.nan))
    assert head.gpus == 2 and head.allocated_gpus == pytest.approx(1 + 5 / 7)
    assert fv.format_gpus(head.allocated_gpus) == "1.7" and fv.format_gpus(3.0) == "3"


# -- the app, headless ---------------------------------------------------------------------------


def run_app(monkeypatch, store: str | None) -> AppTest:
    if store is None:
        monkeypatch.delenv(STORE_ENV, raising=False)
    else:
        monkeypatch.setenv(STORE_ENV, store)
    at = AppTest.from_file(str(APP_PATH), default_timeout=30)
    at.run()
    return at


def test_fleet_page_renders(monkeypatch, store_dir):
    at = run_app(monkeypatch, store_dir)
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["GPUs reporting"] == "8 of 8"
    assert metrics["Nodes"] == "2"
    assert metrics["GPUs allocated now"] == "4"
    assert metrics["Mean SM activity"] == "25%"
    assert any("measured on 4 of 8 GPUs" in c.value for c in at.caption)
    assert not at.info


def test_fleet_page_windows(monkeypatch, store_dir):
    at = run_app(monkeypatch, store_dir)
    window = at.selectbox(key="window_preset")
    assert window.value == "24h"
    window.set_value("1h").run()
    assert not at.exception, at.exception
    assert {m.label: m.value for m in at.metric}["GPUs reporting"] == "8 of 8"
    assert any("last 1 hour" in c.value for c in at.caption)


def test_empty_store_explains_how_to_fill_it(monkeypatch, tmp_path):
    at = run_app(monkeypatch, str(tmp_path))
    assert not at.exception
    assert len(at.info) == 1 and "gpuwarden demo" in at.info[0].value
    assert not at.metric and not at.error


def test_unset_store_explains_how_to_fill_it(monkeypatch):
    at = run_app(monkeypatch, None)
    assert not at.exception
    assert "GPUWARDEN_STORE" in at.info[0].value and "gpuwarden demo" in at.info[0].value


# -- launcher ---------------------------------------------------------------------------------


def test_dashboard_url():
    assert dashboard_url("127.0.0.1", 8501) == "http://127.0.0.1:8501"
    assert dashboard_url("0.0.0.0", 9000) == "http://localhost:9000"
    assert dashboard_url("::1", 8501) == "http://[::1]:8501"


def test_dashboard_command_is_headless():
    command = dashboard_command(port=8600, host="127.0.0.1")
    assert command[:5] == [sys.executable, "-m", "streamlit", "run", str(APP_PATH)]
    options = dict(zip(command[5::2], command[6::2]))
    assert options == {
        "--server.headless": "true",
        "--server.port": "8600",
        "--server.address": "127.0.0.1",
        "--browser.gatherUsageStats": "false",
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_launch_dashboard_serves(store_dir):
    port = _free_port()
    process = launch_dashboard(store_dir, port=port, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def health() -> bytes:
        assert process.poll() is None, process.stderr.read().decode()
        with urllib.request.urlopen(f"{dashboard_url(port=port)}/_stcore/health", timeout=1) as response:
            return response.read()

    try:
        assert wait_for(health, timeout=20, what="the dashboard's health check", interval=0.2,
                        tolerate_errors=True) == b"ok"
    finally:
        stop_process(process)


def test_gpu_history_sums_mig_memory_and_matches_the_one_gpu_read(tmp_path):
    from gpuwarden.analytics.fleet_report import bucketed_history, gpu_histories_bundle, gpu_history, history_groups
    from gpuwarden.analytics.windows import window_for

    rows = []
    for minute in range(20):
        for mig, used_gib, power in (("1:3g.40gb", 10, 100.0), ("2:4g.40gb", 20, 100.0), (None, 5, 300.0)):
            row = dict.fromkeys(SAMPLE_COLUMN_NAMES, np.nan)
            row.update(timestamp=START + pd.Timedelta(minutes=minute), cluster="c", node="n-0",
                       gpu_uuid="GPU-m" if mig else "GPU-w", gpu_index=0 if mig else 1, model=H100, mig_instance=mig,
                       pod=None, mem_used_bytes=used_gib * 2**30, mem_total_bytes=80 * 2**30, power_watts=power,
                       gpu_util_ratio=0.5)
            rows.append(row)
    frame = coerce(pd.DataFrame(rows))
    history = bucketed_history(frame, "10min").set_index(["gpu_uuid", "time"])
    assert history.loc["GPU-m", "mem_used_gib"].tolist() == [30.0, 30.0]  # both instances: one GPU's memory
    assert history.loc["GPU-w", "power_watts"].tolist() == [300.0, 300.0]
    assert history["sm_active_pct"].isna().all()  # not measured: NaN, and its line is left out
    LocalStore(tmp_path).append(frame)
    window = window_for("1h", frame["timestamp"].min(), frame["timestamp"].max())
    store = LocalStore(tmp_path)
    bundle = gpu_histories_bundle(store, window)
    for uuid in ("GPU-m", "GPU-w"):
        from_bundle = history_groups(bundle["history"][bundle["history"]["gpu_uuid"] == uuid])
        direct = gpu_history(store, window, "n-0", uuid)["groups"]
        assert list(from_bundle) == list(direct) and "Activity (%)" in direct
        for name in direct:
            pd.testing.assert_frame_equal(from_bundle[name], direct[name], check_freq=False, check_names=False)
