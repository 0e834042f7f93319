"""The Idle and Cost dashboard pages: their pure helpers on a hand-built fleet, and the pages run
headless through the app's router with Streamlit's AppTest."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from gpuwarden.analytics import cost_report, idle_report
from gpuwarden.analytics import idle_cost_report as icv
from gpuwarden.dashboards import STORE_ENV
from gpuwarden.dashboards.launch import APP_PATH
from gpuwarden.fleet import SAMPLE_COLUMN_NAMES
from gpuwarden.store import LocalStore, coerce

START = pd.Timestamp("2026-03-02T00:00:00Z")
H100 = "NVIDIA H100 80GB HBM3"
GIB = 2**30
MINUTES = 120


def fleet() -> pd.DataFrame:
    """Four H100s on a reserved node for two hours: one busy, one hoarding a notebook, one unallocated,
    one fake busy; and one L40S (no SM activity) serving at 40%."""
    gpus = {
        "GPU-busy": ("train-h100-000", H100, 0.95, 0.9, 70, "train-1", "alpha"),
        "GPU-hoard": ("train-h100-000", H100, 0.0, 0.0, 60, "nb-1", "beta"),
        "GPU-free": ("train-h100-000", H100, 0.0, 0.0, 0.6, None, None),
        "GPU-fake": ("train-h100-000", H100, 0.22, 0.0003, 20, "tiny-1", "beta"),
        "GPU-l40s": ("infer-l40s-000", "NVIDIA L40S", 0.4, np.nan, 30, "svc-1", "alpha"),
    }
    rows = []
    for minute in range(MINUTES):
        for uuid, (node, model, util, sm, mem, pod, team) in gpus.items():
            row = dict.fromkeys(SAMPLE_COLUMN_NAMES, np.nan)
            row.update(timestamp=START + pd.Timedelta(minutes=minute), cluster="test", node=node, gpu_uuid=uuid, gpu_index=0,
                       model=model, mig_instance=None, pod=pod, team=team, namespace=None if pod is None else f"ns-{team}",
                       project=None if pod is None else f"{team}-p", gpu_util_ratio=util, sm_active_ratio=sm,
                       mem_used_bytes=mem * GIB, mem_total_bytes=80.0 * GIB, power_watts=100 + 500 * util)
            for column in SAMPLE_COLUMN_NAMES:
                if column.endswith("_total") or column.startswith("remapped_") or column == "recovery_action":
                    row[column] = 0
            row["throttle_reasons_bitmask"] = 0
            rows.append(row)
    return coerce(pd.DataFrame(rows))


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return fleet()


@pytest.fixture(scope="module")
def ledger(frame):
    return icv.ledger_for(frame)


@pytest.fixture(scope="module")
def idle(ledger):
    return idle_report(ledger)


@pytest.fixture(scope="module")
def cost(ledger):
    return cost_report(ledger)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, frame) -> str:
    root = tmp_path_factory.mktemp("idle-cost-store")
    LocalStore(root).append(frame)
    return str(root)


def test_idle_headline_and_states(ledger, idle):
    head = icv.idle_headline(idle)
    assert head.gpu_hours == pytest.approx(10.0)
    # unallocated 2 h + hoarded notebook 2 h (first 30 min allocated idle) + fake busy 2 h
    assert head.idle_gpu_hours == pytest.approx(6.0)
    assert head.hoarding_pods == 1 and head.fallback_gpus == 1
    states = icv.state_hours(idle).set_index("state")["gpu_hours"]
    assert states["hoarded"] == pytest.approx(1.5) and states["allocated_idle"] == pytest.approx(0.5)
    assert states["fake_busy"] == pytest.approx(2.0) and states["busy"] == pytest.approx(2.0)
    assert states["underutilized"] == pytest.approx(2.0)  # the L40S at 40% (NVML utilisation)
    assert list(icv.state_hours(idle)["gpu_hours"]) == sorted(icv.state_hours(idle)["gpu_hours"], reverse=True)
    assert icv.hoarding_pods(idle)["pod"].tolist() == ["nb-1"]
    assert icv.fallback_gpus(idle)["gpu_uuid"].tolist() == ["GPU-l40s"]
    timeline = icv.states_timeline(ledger)
    assert len(timeline) == 2 and timeline.sum().sum() == pytest.approx(10.0)


def test_cost_helpers_reconcile(ledger, cost):
    head = icv.cost_headline(cost)
    for proportional in (False, True):
        assert icv.chargeback_table(ledger, proportional)["cost"].sum() == pytest.approx(head.fleet_cost)
    assert icv.idle_cost_by_reason(cost)["cost"].sum() == pytest.approx(head.idle_cost)
    what_if = icv.reclaim(ledger, 1.0)
    assert what_if["cost_reduction"] == 0.0  # every idle hour here is on reserved capacity
    assert what_if["committed_value_freed"] > 0
    assert set(icv.buy_vs_rent(cost)["model"]) == {H100, "NVIDIA L40S"}


def run_page(monkeypatch, store: str, page: str) -> AppTest:
    monkeypatch.setenv(STORE_ENV, store)
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    at.switch_page(f"views/{page}")
    at.run()
    return at


def test_idle_page_renders(monkeypatch, store_dir):
    at = run_page(monkeypatch, store_dir, "idle.py")
    assert not at.exception, at.exception
    assert at.title[0].value == "Idle GPUs and why"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Idle GPU-hours"] == "6.0 GPU-h"
    assert metrics["Idle share"] == "60%"
    assert any("fell back to NVML utilisation" in c.value for c in at.caption)
    at.selectbox(key="window_preset").set_value("1h").run()
    assert not at.exception, at.exception
    assert {m.label: m.value for m in at.metric}["Idle GPU-hours"] == "3.0 GPU-h"


def test_cost_page_renders(monkeypatch, store_dir, ledger):
    at = run_page(monkeypatch, store_dir, "cost.py")
    assert not at.exception, at.exception
    assert at.title[0].value == "Cost and chargeback"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Fleet cost"] == f"{ledger.fleet_cost:,.0f} USD"
    assert any("Charged" in c.value and "= fleet cost" in c.value for c in at.caption)
    at.toggle[0].set_value(True).run()
    at.slider[0].set_value(100).run()
    assert not at.exception, at.exception


def test_pages_explain_an_empty_store(monkeypatch, tmp_path):
    at = run_page(monkeypatch, str(tmp_path), "cost.py")
    assert not at.exception
    assert "gpuwarden demo" in at.info[0].value
