"""``gpuwarden metrics serve``: the analytics collector over one computed snapshot, in a fresh
registry, and the command over a real LocalStore of a simulated fleet, a cluster snapshot from
SimCluster and an audit log written by the actuator's own AuditLog."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from metrics_demo import build_fleet, now_floor, serve_args
from polling import wait_for
from prometheus_client import CollectorRegistry
from servers import free_port

from gpuwarden.remediation.approvals import decision_record
from gpuwarden.analytics import IdleParams, Inventory, PriceBook, build_ledger, idle_report
from gpuwarden.analytics.metrics_collector import METRICS, PREFIX, SnapshotCollector
from gpuwarden.analytics.metrics_snapshot import (
    ActuatorFigures,
    FleetFigures,
    IdleFigure,
    MetricsSnapshot,
    QueueFigure,
)
from gpuwarden.cli.metrics_cmd import compute
from gpuwarden.cli.metrics_inputs import actuator_figures
from gpuwarden.fleet.cluster_state import read_snapshot
from gpuwarden.scheduling.queue_report import pending_table, plan_with

ROOT = Path(__file__).resolve().parents[2]


def registry_of(snapshot: MetricsSnapshot | None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshot))
    return registry


def test_collector_serves_the_snapshot_and_leaves_out_what_it_lacks():
    fleet = FleetFigures(window_seconds=3600.0, gpus=4, gpu_hours=4.0, idle_gpu_hours=1.5, cost_usd=12.0,
                         idle_cost_usd=4.5, efficiency_ratio=None, idle_ratio=0.375)
    snapshot = MetricsSnapshot(
        computed_at_seconds=100.0, compute_duration_seconds=0.5, price_book="bundled", fleet=fleet,
        idle=(IdleFigure("hoarded", "vision", "vision-ns", 1.0, 3.0), IdleFigure("unallocated", "(unallocated)", "(unallocated)", 0.5, 1.5)),
        actuator=ActuatorFigures(True, 2, 600.0, {("applied", "cordon"): 3}), queue=None, errors=("health",))
    registry = registry_of(snapshot)
    get = registry.get_sample_value
    assert get("gpuwarden_idle_gpu_hours", {"reason": "hoarded", "team": "vision", "namespace": "vision-ns"}) == 1.0
    assert get("gpuwarden_idle_cost_usd", {"reason": "unallocated", "team": "(unallocated)", "namespace": "(unallocated)"}) == 1.5
    assert get("gpuwarden_fleet_idle_ratio") == 0.375 and get("gpuwarden_fleet_gpus") == 4
    assert get("gpuwarden_fleet_efficiency_ratio") is None  # nothing allocated: no ratio, not a fake 0
    assert get("gpuwarden_actuator_breaker_open") == 1.0 and get("gpuwarden_actuator_pending_approvals") == 2
    assert get("gpuwarden_actuator_actions_total", {"outcome": "applied", "kind": "cordon"}) == 3
    assert get("gpuwarden_queue_pending_workloads", {"team": "vision"}) is None  # no cluster snapshot given
    assert get("gpuwarden_metrics_compute_errors", {"part": "health"}) == 1.0
    assert get("gpuwarden_metrics_info", {"price_book": "bundled"}) == 1.0
    served = {m.name for m in registry.collect()}
    assert served <= {PREFIX + name for name in METRICS}
    assert list(registry_of(None).collect()) == []  # before the first computation: nothing at all


def test_queue_figures_are_served_per_team():
    snapshot = MetricsSnapshot(computed_at_seconds=1.0, compute_duration_seconds=0.1, price_book="bundled",
                               queue=(QueueFigure("nlp", 3, 24.0, 7200.0),))
    get = registry_of(snapshot).get_sample_value
    assert get("gpuwarden_queue_pending_workloads", {"team": "nlp"}) == 3
    assert get("gpuwarden_queue_pending_gpus", {"team": "nlp"}) == 24.0
    assert get("gpuwarden_queue_oldest_wait_seconds", {"team": "nlp"}) == 7200.0


def _entry(at: datetime, outcome: str, approval_id: str | None = None, kind: str = "cordon") -> dict:
    return {"at": at.isoformat(), "outcome": outcome, "kind": kind, "target": "node-1", "approval_id": approval_id}


def test_actuator_state_is_folded_from_the_audit_log_as_the_actuator_folds_it():
    t0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
    records = [
        _entry(t0, "awaiting-approval", "a"), _entry(t0 + timedelta(minutes=10), "awaiting-approval", "b"),
        decision_record("a", True, "alice", "", at=t0 + timedelta(minutes=20)),
        _entry(t0 + timedelta(minutes=30), "breaker-open", kind="breaker"),
    ]
    now = (t0 + timedelta(minutes=40)).timestamp()
    state = actuator_figures(records, now)
    assert state.breaker_open and state.pending_approvals == 1  # "a" was decided
    assert state.oldest_pending_age_seconds == pytest.approx(30 * 60)  # "b", planned at +10 min
    assert state.actions_by_outcome[("awaiting-approval", "cordon")] == 2
    reset = actuator_figures([*records, _entry(t0 + timedelta(minutes=35), "breaker-reset", kind="breaker")], now)
    assert not reset.breaker_open
    assert actuator_figures([], now).oldest_pending_age_seconds == 0.0


@pytest.fixture(scope="module")
def demo(data_dir, tmp_path_factory):
    return build_fleet(data_dir, tmp_path_factory.mktemp("metrics"), hours=3.0, end=now_floor())


def test_served_figures_are_the_analytics_figures(demo):
    args = serve_args(demo, "--since", "3h")
    snapshot = compute(args, now=demo["end"].timestamp())
    assert snapshot.errors == ()
    get = registry_of(snapshot).get_sample_value
    # The same window read independently through the reports' own path.
    import pandas as pd

    start, end = pd.Timestamp(demo["end"]) - pd.Timedelta(hours=3), pd.Timestamp(demo["end"])
    ledger = build_ledger(demo["samples"], start, end, price_book=PriceBook.default(), inventory=Inventory.default(),
                          params=IdleParams())
    summary = idle_report(ledger).summary
    idle = snapshot.idle
    assert sum(f.gpu_hours for f in idle) == pytest.approx(summary["idle_gpu_hours"], rel=1e-6)
    for reason, hours in summary["idle_gpu_hours_by_reason"].items():
        served = sum(f.gpu_hours for f in idle if f.reason == reason)
        assert served == pytest.approx(hours, rel=1e-6, abs=1e-9), reason
    assert get("gpuwarden_fleet_idle_gpu_hours") == pytest.approx(summary["idle_gpu_hours"])
    assert get("gpuwarden_fleet_efficiency_ratio") == pytest.approx(summary["efficiency_score"])
    assert get("gpuwarden_fleet_gpus") == 32
    # Open findings: critical ones among them, each on a GPU the simulator made faulty, with its node and action.
    faulty = {(r.node, r.gpu_uuid) for r in demo["sim"].ground_truth().itertuples()}
    assert any(f.severity == "critical" for f in snapshot.findings)
    assert {(f.node, f.gpu) for f in snapshot.findings if f.gpu} <= faulty
    assert all(f.severity in ("info", "warning", "critical") and f.action for f in snapshot.findings)
    # Actuator: two approvals waiting since 40 and 30 minutes before the end, breaker open.
    assert get("gpuwarden_actuator_pending_approvals") == 2 and get("gpuwarden_actuator_breaker_open") == 1
    assert get("gpuwarden_actuator_oldest_pending_approval_age_seconds") == pytest.approx(40 * 60)
    # Queue: the planner's own pending workloads, per team.
    cluster = read_snapshot(demo["cluster"])
    assert get("gpuwarden_cluster_snapshot_timestamp_seconds") == cluster.taken_at.timestamp()
    table = pending_table(cluster, plan_with(cluster))
    assert len(table) > 0
    for team, rows in table.groupby("team"):
        assert get("gpuwarden_queue_pending_workloads", {"team": team}) == len(rows)


def test_a_failing_part_is_an_error_metric_and_the_rest_is_served(demo, tmp_path):
    (tmp_path / "snapshot.json").write_text("{not json")
    args = serve_args(demo, "--since", "3h")
    args.cluster_state = tmp_path
    snapshot = compute(args, now=demo["end"].timestamp())
    get = registry_of(snapshot).get_sample_value
    assert get("gpuwarden_metrics_compute_errors", {"part": "queue"}) == 1.0
    assert get("gpuwarden_fleet_gpus") == 32 and get("gpuwarden_actuator_pending_approvals") == 2


def test_a_price_book_not_in_usd_is_refused_naming_the_currency(demo, tmp_path):
    book = PriceBook.default()
    assert book.currency == "USD"
    import dataclasses

    from gpuwarden.analytics.metrics_snapshot import fleet_figures
    from gpuwarden.analytics.params import AnalyticsError

    import pandas as pd

    end = pd.Timestamp(demo["end"])
    ledger = build_ledger(demo["samples"], end - pd.Timedelta(hours=1), end,
                          price_book=dataclasses.replace(book, currency="EUR"), inventory=Inventory.default())
    with pytest.raises(AnalyticsError, match="'EUR'.*USD"):
        fleet_figures(ledger)


def test_serve_answers_scrapes_and_stops_on_sigterm(demo):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.cli", "metrics", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "10s",
         "--source", "local", "--store", str(demo["store"]), "--since", "30d", "--audit", str(demo["audit"]),
         "--cluster-state", str(demo["cluster"])], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def scrape() -> str | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                text = response.read().decode()
            return text if "gpuwarden_fleet_gpus 32.0" in text else None

        text = wait_for(scrape, 120, "the first computed snapshot on /metrics", tolerate_errors=True)
        assert 'gpuwarden_health_finding{' in text and "gpuwarden_queue_pending_workloads{" in text
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


def test_bad_interval_is_one_line_naming_the_flag():
    result = subprocess.run([sys.executable, "-m", "gpuwarden.cli", "metrics", "serve", "--interval", "1s"],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--interval '1s': expected at least 10s" in result.stderr and "Traceback" not in result.stderr


def test_a_price_book_given_prices_the_cost_metrics_and_is_named(demo, tmp_path):
    import yaml

    from gpuwarden.analytics.pricebook import DEFAULT_PRICE_BOOK_PATH

    book = yaml.safe_load(DEFAULT_PRICE_BOOK_PATH.read_text())
    for prices in book["models"].values():  # every cloud price doubled; owned hardware as it was
        for tier in ("on-demand", "reserved", "spot"):
            if tier in prices:
                prices[tier] *= 2
    (tmp_path / "book.yaml").write_text(yaml.safe_dump(book))
    bundled = compute(serve_args(demo, "--since", "3h"), now=demo["end"].timestamp())
    mine = compute(serve_args(demo, "--since", "3h", "--price-book", str(tmp_path / "book.yaml")), now=demo["end"].timestamp())
    get = registry_of(mine).get_sample_value
    assert get("gpuwarden_metrics_info", {"price_book": str(tmp_path / "book.yaml")}) == 1.0
    assert registry_of(bundled).get_sample_value("gpuwarden_metrics_info", {"price_book": "bundled"}) == 1.0
    assert bundled.fleet.cost_usd < mine.fleet.cost_usd <= 2 * bundled.fleet.cost_usd + 1e-9
    assert mine.fleet.gpu_hours == bundled.fleet.gpu_hours
