"""The dashboards' pure helpers (formatting, palette, health timeline, queue and quota tables, the
cluster-state files, approver tokens) and the pages' behaviour on a broken store and with cached
reports, run headless with Streamlit's AppTest."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from test_dashboard_idle_cost import fleet

from gpuwarden.remediation import approvals
from gpuwarden.analytics import health_report as hv
from gpuwarden.dashboards import STORE_ENV, auth, fmt, palette
from gpuwarden.fleet import cluster_state as cs
from gpuwarden.dashboards.launch import APP_PATH
from gpuwarden.fleet import (
    ClusterSnapshot,
    Gpu,
    GpuRequest,
    Node,
    Placement,
    Team,
    Topology,
    Workload,
    WorkloadPhase,
    WorkloadState,
)
from gpuwarden.scheduling import queue_report as qv
from gpuwarden.store import LocalStore, coerce

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def test_formatting_keeps_units_and_few_decimals():
    assert fmt.percent(0.04951) == "5%" and fmt.percent(None) == "n/a"
    assert fmt.money(1533815.5178, "USD") == "1,533,816 USD" and fmt.money(6.571, "EUR") == "6.57 EUR"
    assert fmt.gpu_hours(654.0333) == "654 GPU-h" and fmt.gpu_hours(6.0) == "6.0 GPU-h"
    assert fmt.title("idle_gpu_hours") == "Idle (GPU-h)" and fmt.title("allocation_ratio") == "Allocation (%)"
    assert fmt.title("energy_kwh") == "Energy (kWh)"


def test_every_state_has_one_colour_and_size_orders_them():
    from gpuwarden.analytics import STATES

    assert set(palette.STATE_COLOURS) == set(STATES) == set(palette.STATE_LABELS), "every state needs a colour and a label"
    assert len(set(palette.STATE_COLOURS.values())) == len(palette.STATE_COLOURS)
    assert palette.by_size({"busy": 1.0, "unallocated": 5.0, "hoarded": 1.0}) == ["unallocated", "hoarded", "busy"]


def test_no_findings_still_gives_every_column():
    table = hv.findings_table([])
    assert table.empty and list(table.columns) == hv.FINDING_COLUMNS
    assert table[table["active"]]["severity"].tolist() == []  # what raised KeyError 'severity' before


def test_event_timeline_counts_increases_and_resets_per_gpu():
    start = pd.Timestamp("2026-11-23T00:00:00Z")
    xid79 = [0, 0, 1, 1, 2, 2]  # +2
    xid13 = [5, 6, 6, 0, 1, 1]  # +1, reset to 0, +1 -> 2 events
    frame = pd.DataFrame({
        "timestamp": [start + pd.Timedelta(minutes=m) for m in range(6)], "node": "node-a", "gpu_uuid": "GPU-1",
        "gpu_index": 3, "xid_79_total": xid79, "xid_13_total": xid13, "ecc_dbe_volatile_total": np.nan,
    })
    events = hv.event_timeline(frame, "1h")
    totals = events.groupby("event")["count"].sum().to_dict()
    assert totals == {"XID 79": 2.0, "XID 13": 2.0}
    assert set(events["gpu"]) == {"GPU 3 · GPU-1"}
    assert hv.event_timeline(frame.assign(xid_79_total=0, xid_13_total=0), "1h").empty


def snapshot(teams: tuple[Team, ...] = (Team("alpha", 4, 8), Team("beta", 4, 8))) -> ClusterSnapshot:
    topology = Topology("nvl-0", "leaf-0", "rack-0")
    nodes = tuple(Node(f"node-{i}", "train", "cloud", "on-demand", topology, "NVIDIA H100 80GB HBM3", 4, 64000, 2**39)
                  for i in range(2))
    gpus = tuple(Gpu(f"GPU-{n}-{g}", g, f"node-{n}", "NVIDIA H100 80GB HBM3") for n in range(2) for g in range(4))

    def workload(name, team, count, phase, node=None, priority="normal"):
        w = Workload(name, team, "training", team, team, priority, GpuRequest(count=count))
        placements = tuple(Placement(node, f"GPU-{node[-1]}-{g}") for g in range(count)) if node else ()
        return WorkloadState(w, phase, NOW - timedelta(hours=1), NOW - timedelta(minutes=30) if node else None,
                             placements, progress_seconds=1800.0, duration_seconds=3600.0 if node else None)

    return ClusterSnapshot(
        taken_at=NOW, nodes=nodes, gpus=gpus,
        workloads=(workload("big", "alpha", 4, WorkloadPhase.RUNNING, "node-0"),
                   workload("more", "alpha", 2, WorkloadPhase.RUNNING, "node-1"),
                   workload("wait", "beta", 4, WorkloadPhase.PENDING)),
        teams=teams)


def test_quotas_show_what_is_borrowed_and_lent():
    table = qv.quota_table(snapshot(), {"alpha": 3.5}).set_index("team")
    assert table.loc["alpha", "allocated_gpus"] == 6 and table.loc["alpha", "borrowed_gpus"] == 2
    assert table.loc["beta", "lent_gpus"] == 2  # beta's unused guarantee is what alpha borrows
    assert table.loc["alpha", "used_gpus"] == 3.5 and np.isnan(table.loc["beta", "used_gpus"])


def test_pending_workloads_come_from_the_planner_with_a_reason_and_an_estimate():
    snap = snapshot((Team("alpha", 6, 8), Team("beta", 2, 8)))  # alpha within its guarantee: nothing to reclaim
    result = qv.plan_with(snap)
    pending = qv.pending_table(snap, result)
    assert list(pending["workload"]) == ["beta/wait"] and list(pending["position"]) == [1]
    assert pending["reason"].iloc[0]
    # both running jobs end at 12:30 (30 of 60 minutes done): the 4-GPU job fits then.
    assert pending["estimated_start"].iloc[0] == NOW + timedelta(minutes=30)


def test_cluster_state_round_trips_and_a_damaged_file_is_named(tmp_path):
    snap = snapshot()
    cs.write_snapshot(tmp_path, snap)
    assert cs.read_snapshot(tmp_path) == snap
    (tmp_path / "snapshot.json").write_text("{}")
    with pytest.raises(ValueError, match="not a cluster snapshot"):
        cs.read_snapshot(tmp_path)


def test_approver_tokens_from_a_secret_file(tmp_path, monkeypatch):
    secret = tmp_path / "approvers"
    secret.write_text("# name:token per line\ndana:s3cret\nshared-token\n")
    monkeypatch.setenv("GPUWARDEN_APPROVER_TOKEN_FILE", str(secret))
    monkeypatch.delenv("GPUWARDEN_APPROVER_TOKEN", raising=False)
    assert auth.check_token("approver", "anyone", "s3cret") == "dana"  # the file names the holder
    assert auth.check_token("approver", "lee", "shared-token") == "lee"
    assert auth.check_token("approver", "lee", "wrong") is None
    assert auth.check_token("approver", "", "shared-token") is None  # a shared token needs a name to audit


def test_decide_records_who_and_refuses_twice(tmp_path):
    log = tmp_path / "audit.jsonl"
    log.write_text(json.dumps({"at": NOW.isoformat(), "mode": "approve", "outcome": "awaiting-approval", "kind": "cordon",
                               "target": "node-0", "reason": "xid 79", "approval_id": 7}) + "\n")
    [item] = approvals.pending(log)
    approvals.decide(log, item.approval_id, approve=False, by="dana", comment="not now")
    last = json.loads(log.read_text().splitlines()[-1])
    assert (last["outcome"], last["by"], last["comment"]) == ("rejected", "dana", "not now")
    with pytest.raises(ValueError, match="already"):
        approvals.decide(log, item.approval_id, approve=True, by="dana")


def run(monkeypatch, store, page: str) -> AppTest:
    monkeypatch.setenv(STORE_ENV, str(store))
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    at.switch_page(f"views/{page}")
    return at.run()


@pytest.mark.parametrize("page", ["fleet.py", "gpu.py", "idle.py", "cost.py", "health.py"])
def test_a_corrupt_store_file_is_quarantined_and_named_on_the_page(monkeypatch, tmp_path, page):
    store = LocalStore(tmp_path)
    store.append(coerce(fleet()))
    victim = next((tmp_path / "samples").glob("date=*/part-*.parquet"))
    victim.write_bytes(victim.read_bytes()[:100])  # a file cut short
    at = run(monkeypatch, tmp_path, page)
    assert not at.exception
    # The store quarantines the damaged file and reads on; the page says so in one warning.
    assert at.warning and "unreadable store file" in at.warning[0].value and victim.name in at.warning[0].value
    assert all("Traceback" not in element.value for element in [*at.warning, *at.error, *at.info])


def test_the_idle_page_builds_its_ledger_once_per_window(monkeypatch, tmp_path):
    from gpuwarden.analytics import idle_cost_report

    LocalStore(tmp_path).append(coerce(fleet()))
    calls = []
    real = idle_cost_report.build_ledger
    monkeypatch.setattr(idle_cost_report, "build_ledger", lambda *a, **k: calls.append(1) or real(*a, **k))
    at = run(monkeypatch, tmp_path, "idle.py")
    assert not at.exception and len(calls) == 1
    at.run()
    at.switch_page("views/fleet.py").run()  # the fleet page's idle tiles reuse it
    assert not at.exception and len(calls) == 1
    at.switch_page("views/cost.py").run()  # and so does the cost page
    assert not at.exception and len(calls) == 1
    at.selectbox(key="window_preset").set_value("1h").run()
    assert len(calls) == 2


def test_the_shared_window_presets_and_custom_days():
    from gpuwarden.dashboards.data import window_for

    oldest, newest = pd.Timestamp("2026-11-23T00:00:00Z"), pd.Timestamp("2026-11-30T00:00:00Z")
    day = window_for("24h", oldest, newest)
    assert day.end == newest + pd.Timedelta(seconds=1) and day.span == pd.Timedelta(hours=24)
    assert window_for("7d", oldest + pd.Timedelta(days=1), newest).start == oldest + pd.Timedelta(days=1)  # clipped
    custom = window_for("custom", oldest, newest, (datetime(2026, 11, 24).date(), datetime(2026, 11, 25).date()))
    assert (custom.start, custom.end) == (pd.Timestamp("2026-11-24T00:00:00Z"), pd.Timestamp("2026-11-26T00:00:00Z"))


def test_an_approver_signs_in_with_a_token_and_rejects(monkeypatch, tmp_path):
    for name in ("GPUWARDEN_DEMO_APPROVER", "GPUWARDEN_APPROVER_TOKEN_FILE", "GPUWARDEN_AUDIT"):
        monkeypatch.delenv(name, raising=False)
    log = tmp_path / "actuator" / "audit.jsonl"
    log.parent.mkdir()
    log.write_text(json.dumps({"at": NOW.isoformat(), "mode": "approve", "outcome": "awaiting-approval", "kind": "drain",
                               "target": "node-0", "reason": "xid 79", "approval_id": "a1"}) + "\n")
    cs.write_snapshot(tmp_path / "cluster", snapshot())
    monkeypatch.setenv("GPUWARDEN_APPROVER_TOKEN", "t0ken")
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    at = AppTest.from_file(str(APP_PATH.parent / "views" / "actions.py"), default_timeout=60).run()
    assert not at.exception
    assert not [b for b in at.button if b.label in ("Approve", "Reject")]  # nobody signed in
    assert any("Would evict 1 workload(s) of 1 team(s), 4.0 GPUs" in c.value for c in at.caption)
    [name] = [t for t in at.text_input if t.label.startswith("Your name")]
    name.set_value("kim")
    [token] = [t for t in at.text_input if "token" in t.label.lower()]
    token.set_value("t0ken")
    next(b for b in at.button if b.label == "Sign in").click().run()
    [reject] = [b for b in at.button if b.label == "Reject"]
    reject.click().run()
    assert not at.exception, at.exception
    last = json.loads(log.read_text().splitlines()[-1])
    assert (last["outcome"], last["by"], last["approval_id"]) == ("rejected", "kim", "a1")
    assert approvals.pending(log) == []
