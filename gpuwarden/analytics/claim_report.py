"""Idle time and cost per ResourceClaim (Dynamic Resource Allocation) and per device a claim held.

A pod holding GPUs through a DRA claim has the claim in its samples' ``dra_claim``
(``<namespace>/<name>``, from dcgm-exporter's ``dra_claim_*`` labels, which gpuwarden's exporter writes
too). The idle, cost and chargeback reports gain two tables where any row has a claim:

- ``by_claim``: one row per claim, most expensive first: the pods that held its devices, their team and
  project, how many devices (and how many of them MIG devices), GPU-hours, used, idle and hoarded
  GPU-hours, cost and idle cost;
- ``claim_devices``: one row per (claim, device): the GPU and MIG instance, its share of its GPU, the
  hours it was held and what they cost.

A MIG device is its share of its GPU (:func:`gpuwarden.fleet.semantics.mig_share`, the one rule: a
``1g.10gb`` instance of an A100 is 1/7), so its GPU-hours and cost are that share of the GPU's: the ledger
weights them already (:mod:`.ledger_tables`). Nothing here is new arithmetic: the ledger's rows grouped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .ledger import Ledger
from .params import IDLE_STATES
from .report_sums import _ratio

CLAIM_COLUMNS = ("claim", "namespace", "pods", "team", "project", "devices", "mig_devices", "gpu_hours",
                 "used_gpu_hours", "idle_gpu_hours", "hoarded_gpu_hours", "idle_share", "efficiency_score", "cost",
                 "idle_cost")
DEVICE_COLUMNS = ("claim", "node", "gpu_uuid", "mig_instance", "model", "gpu_share", "hours", "gpu_hours",
                  "idle_gpu_hours", "cost", "idle_cost", "cost_per_hour")


def _claimed(ledger: Ledger) -> pd.DataFrame:
    """The ledger's rows held through a claim, with the figures the tables sum."""
    rows = ledger.rows
    if "dra_claim" not in rows.columns:
        return rows.iloc[0:0]
    rows = rows[rows["dra_claim"].notna().to_numpy()]
    state = rows["state"].astype(str).to_numpy()
    idle = np.isin(state, IDLE_STATES)
    return rows.assign(
        claim=rows["dra_claim"].astype(str).to_numpy(),
        device=rows["gpu_uuid"].astype(str).str.cat(rows["mig_instance"].astype(object).fillna("").astype(str), sep="/").to_numpy(),
        is_mig=rows["mig_instance"].notna().to_numpy(),
        idle_gpu_hours=np.where(idle, rows["gpu_hours"], 0.0), idle_cost=np.where(idle, rows["cost"], 0.0),
        hoarded_gpu_hours=np.where(state == "hoarded", rows["gpu_hours"], 0.0),
    )


def _joined(values: pd.Series) -> str:
    return ", ".join(sorted({str(v) for v in values.dropna()}))


def by_claim(ledger: Ledger) -> pd.DataFrame:
    """GPU-hours, idle time and cost per claim (see the module doc), most expensive first."""
    rows = _claimed(ledger)
    if rows.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in CLAIM_COLUMNS})
    grouped = rows.groupby("claim", sort=False).agg(
        pods=("pod", _joined), team=("team", _joined), project=("project", _joined), devices=("device", "nunique"),
        gpu_hours=("gpu_hours", "sum"), used_gpu_hours=("used_hours", "sum"), idle_gpu_hours=("idle_gpu_hours", "sum"),
        hoarded_gpu_hours=("hoarded_gpu_hours", "sum"), cost=("cost", "sum"), idle_cost=("idle_cost", "sum"),
    ).reset_index()
    mig = rows[rows["is_mig"]].groupby("claim")["device"].nunique()
    grouped["mig_devices"] = grouped["claim"].map(mig).fillna(0).astype(int)
    grouped["namespace"] = grouped["claim"].str.partition("/")[0]
    grouped["idle_share"] = _ratio(grouped["idle_gpu_hours"], grouped["gpu_hours"])
    grouped["efficiency_score"] = _ratio(grouped["used_gpu_hours"], grouped["gpu_hours"])
    grouped = grouped.replace({c: {"": None} for c in ("team", "project")})
    return grouped[list(CLAIM_COLUMNS)].sort_values(["cost", "claim"], ascending=[False, True], ignore_index=True)


def claim_devices(ledger: Ledger) -> pd.DataFrame:
    """Per claim and device (a whole GPU, or one MIG instance): its share of its GPU, the hours it was
    held, their GPU-hours (hours x share) and cost."""
    rows = _claimed(ledger)
    if rows.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in DEVICE_COLUMNS})
    keys = ["claim", "node", "gpu_uuid", "mig_instance", "model"]
    work = rows[keys].astype(object).fillna("").assign(
        hours=rows["hours"].to_numpy(), gpu_hours=rows["gpu_hours"].to_numpy(),
        idle_gpu_hours=rows["idle_gpu_hours"].to_numpy(), cost=rows["cost"].to_numpy(), idle_cost=rows["idle_cost"].to_numpy())
    grouped = work.groupby(keys, sort=False).sum().reset_index()
    grouped["gpu_share"] = _ratio(grouped["gpu_hours"], grouped["hours"])
    grouped["cost_per_hour"] = _ratio(grouped["cost"], grouped["hours"])
    grouped["mig_instance"] = grouped["mig_instance"].replace({"": None})
    return grouped[list(DEVICE_COLUMNS)].sort_values(["cost", "claim", "gpu_uuid"], ascending=[False, True, True],
                                                     ignore_index=True)


def claim_tables(ledger: Ledger) -> dict[str, pd.DataFrame]:
    """``by_claim`` and ``claim_devices`` where any GPU-hour was held through a claim; else none."""
    if "dra_claim" not in ledger.rows.columns or not ledger.rows["dra_claim"].notna().any():
        return {}
    return {"by_claim": by_claim(ledger), "claim_devices": claim_devices(ledger)}
