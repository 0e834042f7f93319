"""Idle and cost per DRA claim and per MIG device (issue 34 item 4): the idle, cost and chargeback
reports gain ``by_claim`` and ``claim_devices`` where GPUs were held through ResourceClaims, a MIG
device costing its share of its GPU (a 1g.10gb instance of an A100 is 1/7 of the GPU's hour)."""

from __future__ import annotations

from builders import sample_row, samples_frame

import pandas as pd
import pytest

from gpuwarden.analytics import PriceBook, build_ledger, build_report
from gpuwarden.fleet.semantics import mig_share
from gpuwarden.store import LocalStore

START = pd.Timestamp("2026-11-02T00:00:00Z")
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
TRAIN = "ml/train-0-gpu-4bq7z"
SERVE = "serve/infer-0-gpu-x8k2m"
IDLE = {"gpu_util_ratio": 0.0, "sm_active_ratio": None, "mem_used_bytes": 1e9, "power_watts": 60.0}


def two_claims(minutes: int = 60) -> pd.DataFrame:
    """An hour of: a whole H100 busy under claim TRAIN; a 1g.10gb MIG device of an A100 idle under claim
    SERVE (its sibling 3g.20gb instance unallocated); an H100 a device-plugin pod holds (no claim)."""
    rows = []
    for minute in range(minutes):
        at = START + pd.Timedelta(minutes=minute)
        rows.append(sample_row(at, "gpu-a", 0, pod="train-0", team="ml", dra_claim=TRAIN))
        rows.append(sample_row(at, "gpu-a", 1, pod="legacy-0", team="ml"))
        mig = dict(model=A100, gpu_uuid="GPU-a100", mem_total_bytes=10e9, attribution="known")
        rows.append(sample_row(at, "infer-a100-001", 0, pod="infer-0", team="serve", mig_instance="1:1g.10gb",
                               dra_claim=SERVE, **mig, **IDLE))
        rows.append(sample_row(at, "infer-a100-001", 0, pod=None, mig_instance="2:3g.20gb", **mig, **IDLE))
    return samples_frame(rows)


def test_idle_and_cost_per_claim_and_per_mig_device():
    ledger = build_ledger(two_claims())
    book = PriceBook.default()
    h100, a100 = book.hourly(H100, "on-demand"), book.hourly(A100, "on-demand")
    assert mig_share("1g.10gb", A100) == pytest.approx(1 / 7)
    for kind in ("idle", "cost", "chargeback"):
        tables = build_report(kind, ledger).tables
        claims = tables["by_claim"].set_index("claim")
        assert list(claims.index) == [TRAIN, SERVE]  # most expensive first; the device-plugin pod is in no claim
        train, serve = claims.loc[TRAIN], claims.loc[SERVE]
        assert (train["namespace"], train["pods"], train["team"], train["devices"], train["mig_devices"]) == (
            "ml", "train-0", "ml", 1, 0)
        assert train["gpu_hours"] == pytest.approx(1.0) and train["cost"] == pytest.approx(h100)
        assert train["idle_gpu_hours"] == pytest.approx(0.0) and train["efficiency_score"] == pytest.approx(0.9)
        # the MIG device: 1/7 of the A100's hour, all of it idle
        assert (serve["pods"], serve["devices"], serve["mig_devices"]) == ("infer-0", 1, 1)
        assert serve["gpu_hours"] == pytest.approx(1 / 7) and serve["cost"] == pytest.approx(a100 / 7)
        assert serve["idle_gpu_hours"] == pytest.approx(1 / 7) and serve["idle_cost"] == pytest.approx(a100 / 7)
        assert serve["idle_share"] == pytest.approx(1.0)
        devices = tables["claim_devices"].set_index("claim")
        device = devices.loc[SERVE]
        assert (device["gpu_uuid"], device["mig_instance"], device["model"]) == ("GPU-a100", "1:1g.10gb", A100)
        assert device["gpu_share"] == pytest.approx(1 / 7) and device["hours"] == pytest.approx(1.0)
        assert device["cost_per_hour"] == pytest.approx(a100 / 7)
        assert devices.loc[TRAIN, "gpu_share"] == pytest.approx(1.0) and devices.loc[TRAIN, "mig_instance"] is None
    # the claims' cost is part of the fleet's, never counted beside it
    chargeback = build_report("chargeback", ledger)
    assert chargeback.summary["reconciles"]
    assert chargeback.tables["by_claim"]["cost"].sum() == pytest.approx(h100 + a100 / 7)


def test_hoarding_pods_name_their_claim():
    hoard = {"gpu_util_ratio": 0.0, "sm_active_ratio": 0.0, "mem_used_bytes": 7e10}
    frame = samples_frame(sample_row(START + pd.Timedelta(minutes=m), "gpu-a", 0, pod="train-0", team="ml",
                                     dra_claim=TRAIN, **hoard) for m in range(120))
    pods = build_report("idle", build_ledger(frame)).tables["hoarding_pods"]
    assert pods[["namespace", "pod", "claim"]].values.tolist() == [["ml", "train-0", TRAIN]]


def test_without_claims_the_reports_have_no_claim_table():
    frame = two_claims(10).assign(dra_claim=None)
    for kind in ("idle", "cost", "chargeback"):
        tables = build_report(kind, build_ledger(frame)).tables
        assert "by_claim" not in tables and "claim_devices" not in tables
    assert "claim" not in build_report("idle", build_ledger(frame)).tables["hoarding_pods"].columns
    # samples without the column at all (a file written before it) read the same
    old = build_report("idle", build_ledger(frame.drop(columns=["dra_claim"])))
    assert "by_claim" not in old.tables and old.summary == build_report("idle", build_ledger(frame)).summary


def test_the_store_keeps_claims_for_the_reports(tmp_path):
    """Through the embedded store (read as Arrow, a day at a time) the tables are the frame's."""
    store = LocalStore(tmp_path / "store")
    frame = two_claims()
    store.append(frame, validate=True)
    from_store = build_report("cost", build_ledger(store)).tables
    from_frame = build_report("cost", build_ledger(frame)).tables
    for name in ("by_claim", "claim_devices"):
        pd.testing.assert_frame_equal(from_store[name], from_frame[name])


def test_holders_stay_distinct_when_their_key_would_overflow():
    """namespace x pod x team x project x claim values of one chunk past 2^62 combinations: still one
    holder per distinct combination (the key is renumbered densely before it would overflow)."""
    import numpy as np

    from gpuwarden.analytics.ledger import HOLDER, LedgerBuilder

    values = 1 << 13  # (2^13 + 1)^5 > 2^64
    rows = np.array([[0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [values - 1] * 5, [0, 0, 0, 0, 1], [5, 6, 7, 8, values - 1]])
    local = {name: (rows[:, i].copy(), np.arange(values, dtype=np.int64)) for i, name in enumerate(HOLDER)}
    codes = LedgerBuilder()._holder_codes(local, np.zeros(len(rows), bool))
    assert len(set(codes.tolist())) == 4 and codes[1] == codes[3] and codes[0] != codes[1]
