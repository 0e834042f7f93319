"""The sums every report takes from the ledger's rows: fleet totals, GPU-hours by state, and the
labels under which unallocated and unattributed time is shown (see :mod:`.reports` for the
definitions of allocated, unattributed, used and idle GPU-hours)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from .ledger import Ledger
from .params import IDLE_STATES, TAXONOMY

UNALLOCATED_LABEL = "(unallocated)"
UNATTRIBUTED_LABEL = "(unattributed)"
NO_TEAM_LABEL = "(no team)"
NO_PROJECT_LABEL = "(no project)"


def _ratio(numerator, denominator):
    numerator = np.asarray(numerator, dtype="float64")
    denominator = np.asarray(denominator, dtype="float64")
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), np.nan)
    return out if out.ndim else float(out)


def _attributed(rows: pd.DataFrame) -> pd.Series:
    if "attributed" not in rows.columns:
        return pd.Series(True, index=rows.index)
    return rows["attributed"].astype(bool)


def _allocated(rows: pd.DataFrame) -> pd.Series:
    """A pod held the GPU: attributed and not unallocated (unattributed time is neither)."""
    return (rows["state"].astype(str) != "unallocated") & _attributed(rows)


def _unattributed_note(totals: dict) -> list[str]:
    share = totals["unattributed_share"]
    if not totals["unattributed_gpu_hours"] or not np.isfinite(share):
        return []
    return [f"{100 * share:.1f}% of GPU-hours are unattributed (no pod label, and the exporter's pod attribution was "
            "off or failed): nobody can tell whether a pod held those GPUs, so they are classified by activity alone "
            "(busy, idle_unattributed, fake_busy, ...), counted as neither allocated nor unallocated, and charged to "
            f"{UNATTRIBUTED_LABEL}."]


def _state_hours(rows: pd.DataFrame, states: Iterable[str], column: str = "gpu_hours") -> float:
    return float(rows.loc[rows["state"].astype(str).isin(list(states)), column].sum())


def _labelled(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with team/project labels: unallocated time under ``(unallocated)``, pods without a team
    under ``(no team)``."""
    rows = rows.copy()
    allocated = _allocated(rows).to_numpy()
    attributed = _attributed(rows).to_numpy()
    for column, missing in (("team", NO_TEAM_LABEL), ("project", NO_PROJECT_LABEL), ("namespace", NO_TEAM_LABEL)):
        values = rows[column].astype(object)
        rows[column] = np.where(~attributed, UNATTRIBUTED_LABEL, np.where(
            ~allocated, UNALLOCATED_LABEL, np.where(values.isna(), missing, values)))
    return rows


def fleet_totals(ledger: Ledger) -> dict:
    rows = ledger.rows
    allocated = _allocated(rows)
    gpu_hours = float(rows["gpu_hours"].sum())
    allocated_hours = float(rows.loc[allocated, "gpu_hours"].sum())
    used_alloc = float(rows.loc[allocated, "used_hours"].sum())
    fallback_alloc = float(rows.loc[allocated, "fallback_hours"].sum())
    idle_hours = _state_hours(rows, IDLE_STATES)
    fleet_cost = float(rows["cost"].sum())
    idle_cost = _state_hours(rows, IDLE_STATES, "cost")
    unattributed = float(rows.loc[~_attributed(rows), "gpu_hours"].sum())
    return {
        "gpus": int(ledger.instances["gpu_uuid"].nunique()) if len(ledger.instances) else 0,
        "gpu_hours": gpu_hours,
        "allocated_gpu_hours": allocated_hours,
        "unattributed_gpu_hours": unattributed,
        "unattributed_share": _ratio(unattributed, gpu_hours),
        "used_gpu_hours": float(rows["used_hours"].sum()),
        "idle_gpu_hours": idle_hours,
        "idle_share": _ratio(idle_hours, gpu_hours),
        "allocation_ratio": _ratio(allocated_hours, gpu_hours),
        "utilisation": _ratio(float(rows["used_hours"].sum()), gpu_hours),
        "efficiency_score": _ratio(used_alloc, allocated_hours),
        "sm_measured_share": _ratio(allocated_hours - fallback_alloc - _state_hours(rows, ["unmeasured"]), allocated_hours),
        "fleet_cost": fleet_cost,
        "idle_cost": idle_cost,
        "idle_cost_share": _ratio(idle_cost, fleet_cost),
        "energy_kwh": float(rows["energy_kwh"].sum()),
    }


def _by_state(rows: pd.DataFrame) -> pd.DataFrame:
    present = set(rows["state"].astype(str))
    states = list(TAXONOMY) + (["unmeasured"] if "unmeasured" in present else [])
    grouped = rows.groupby(rows["state"].astype(str))[["gpu_hours", "cost", "used_hours"]].sum().reindex(states, fill_value=0.0)
    total = grouped["gpu_hours"].sum()
    return pd.DataFrame({
        "state": states,
        "gpu_hours": grouped["gpu_hours"].to_numpy(),
        "share": _ratio(grouped["gpu_hours"].to_numpy(), np.full(len(states), total)),
        "cost": grouped["cost"].to_numpy(),
        "idle": [s in IDLE_STATES for s in states],
    })


def _wide_states(rows: pd.DataFrame, by: str) -> pd.DataFrame:
    if rows.empty:
        return pd.DataFrame({by: pd.Series(dtype=object), **{s: pd.Series(dtype="float64") for s in TAXONOMY},
                             "gpu_hours": pd.Series(dtype="float64"), "idle_share": pd.Series(dtype="float64")})
    keys = rows[by].astype(object).fillna("(none)")
    table = rows.pivot_table(index=keys.to_numpy(), columns=rows["state"].astype(str).to_numpy(), values="gpu_hours",
                             aggfunc="sum", fill_value=0.0)
    table = table.reindex(columns=list(TAXONOMY) + (["unmeasured"] if "unmeasured" in table.columns else []), fill_value=0.0)
    table["gpu_hours"] = table.sum(axis=1)
    table["idle_share"] = _ratio(table[list(IDLE_STATES)].sum(axis=1), table["gpu_hours"])
    table = table.rename_axis(by).reset_index()
    return table.sort_values(["gpu_hours", by], ascending=[False, True], ignore_index=True)
