"""The four reports (idle, efficiency, cost, chargeback), the reclaim what-if and buy-vs-rent.

Each report is a :class:`Report`: a ``summary`` dict, named ``tables`` (DataFrames) and the window,
built from a :class:`~gpuwarden.analytics.ledger.Ledger`. ``Report.to_dict()`` is the JSON output;
its keys are stable and documented in ``gpuwarden/analytics/REPORTS.md``.

Definitions (GPU-hours are weighted by the GPU share of a MIG instance):

- **allocated GPU-hours**: hours a pod held the GPU (attributed rows in every state but ``unallocated``);
- **unattributed GPU-hours**: hours nobody could tell whether a pod held the GPU (no pod label and
  pod attribution off or failed); classified by activity alone, neither allocated nor
  unallocated; ``unattributed_share`` is their share of all GPU-hours, stated by every report;
- **used GPU-hours**: GPU-hours times activity, i.e. useful SM-time where GPM measures SM activity,
  NVML utilisation elsewhere (``sm_measured_share`` says how much of the time is SM-measured);
- **cluster efficiency score**: used GPU-hours over allocated GPU-hours (0..1);
- **utilisation**: used GPU-hours over all GPU-hours (allocated or not);
- **idle GPU-hours**: hours in ``unallocated`` and ``idle_unattributed`` plus the idle reasons ``allocated_idle``, ``hoarded``,
  ``fake_busy``, ``starved``; **idle share** is their share of all GPU-hours;
- **cost** (:mod:`.cost_report`): every GPU-hour in the fleet is priced (cloud GPUs bill whether allocated or not), so the
  fleet cost is the sum over all states and the chargeback rows add up to it exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .claim_report import claim_tables
from .cost_report import cost_report
from .ledger import Ledger
from .params import IDLE_STATES, TAXONOMY, AnalyticsError
from .report_schema import REPORT_KINDS, Report, _hours, _plain
from .report_sums import (
    UNALLOCATED_LABEL,
    UNATTRIBUTED_LABEL,
    _allocated,
    _attributed,
    _by_state,
    _labelled,
    _ratio,
    _state_hours,
    _unattributed_note,
    _wide_states,
    fleet_totals,
)

HOARDING_POD_SHARE = 0.5
EFFICIENCY_DIMENSIONS = ("cluster", "pool", "node", "model", "team", "project")


# -- idle --------------------------------------------------------------------------------------------


def hoarding_pods(ledger: Ledger, min_share: float = HOARDING_POD_SHARE) -> pd.DataFrame:
    """Pods that spend at least ``min_share`` of their allocated GPU-hours hoarded (memory held, no
    activity past the grace period), most hoarded hours first; with the DRA claim they held the GPUs
    through (column ``claim``) where any pod held one."""
    rows = ledger.rows[_allocated(ledger.rows)]
    keys = ["namespace", "pod", "team", "project"]
    if "dra_claim" in rows.columns and rows["dra_claim"].notna().any():
        rows = rows.rename(columns={"dra_claim": "claim"})
        keys.insert(2, "claim")
    columns = [*keys, "gpus", "nodes", "allocated_gpu_hours", "hoarded_gpu_hours", "hoarded_share",
               "hoarded_cost", "mean_hoarded_mem_gib"]
    if rows.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    frame = rows[keys].astype(object).fillna("")
    hoarded = rows["state"].astype(str).to_numpy() == "hoarded"
    frame = frame.assign(
        gpu_uuid=rows["gpu_uuid"].astype(object).to_numpy(), node=rows["node"].astype(object).to_numpy(),
        allocated=rows["gpu_hours"].to_numpy(), hoarded=np.where(hoarded, rows["gpu_hours"], 0.0),
        hoarded_cost=np.where(hoarded, rows["cost"], 0.0), hoarded_samples=np.where(hoarded, rows["samples"], 0),
        mem=np.where(hoarded, rows["mem_gib_hours"], 0.0), hoarded_raw_hours=np.where(hoarded, rows["hours"], 0.0),
    )
    grouped = frame.groupby(keys, sort=False).agg(
        gpus=("gpu_uuid", "nunique"), nodes=("node", "nunique"), allocated_gpu_hours=("allocated", "sum"),
        hoarded_gpu_hours=("hoarded", "sum"), hoarded_cost=("hoarded_cost", "sum"), mem=("mem", "sum"),
        raw=("hoarded_raw_hours", "sum"),
    ).reset_index()
    grouped["hoarded_share"] = _ratio(grouped["hoarded_gpu_hours"], grouped["allocated_gpu_hours"])
    grouped["mean_hoarded_mem_gib"] = _ratio(grouped["mem"], grouped["raw"])
    grouped = grouped[(grouped["hoarded_gpu_hours"] > 0) & (grouped["hoarded_share"] >= min_share)]
    grouped = grouped.replace({k: {"": None} for k in keys})
    return grouped[columns].sort_values(["hoarded_gpu_hours", "pod"], ascending=[False, True], ignore_index=True)


def activity_sources(ledger: Ledger) -> pd.DataFrame:
    """Per GPU (or MIG instance): where its activity came from. ``gpu_util_fallback``: no SM activity
    was measured, so NVML utilisation stood in (and ``fake_busy`` could not be seen); ``mixed``: some
    samples had it."""
    inst = ledger.instances
    table = pd.DataFrame({
        "node": inst["node"], "gpu_uuid": inst["gpu_uuid"], "mig_instance": inst["mig_instance"], "model": inst["model"],
        "activity_source": inst["activity_source"],
        "sm_measured_share": _ratio(inst["sm_samples"], inst["samples"]),
        "samples": inst["samples"],
    })
    order = {"gpu_util_fallback": 0, "mixed": 1, "sm_active": 2}
    return table.sort_values(["activity_source", "node", "gpu_uuid"], key=lambda s: s.map(order) if s.name == "activity_source" else s,
                             ignore_index=True)


def idle_report(ledger: Ledger, hoarding_share: float = HOARDING_POD_SHARE) -> Report:
    rows = ledger.rows
    totals = fleet_totals(ledger)
    states = _by_state(rows)
    pods = hoarding_pods(ledger, hoarding_share)
    sources = activity_sources(ledger)
    counts = sources.drop_duplicates("gpu_uuid")["activity_source"].value_counts()  # GPUs, not MIG instances
    summary = {
        **{k: totals[k] for k in ("gpus", "gpu_hours", "allocated_gpu_hours", "unattributed_gpu_hours", "unattributed_share",
                                  "idle_gpu_hours", "idle_share", "idle_cost", "efficiency_score", "fleet_cost")},
        "idle_gpu_hours_by_reason": {s: _state_hours(rows, [s]) for s in IDLE_STATES},
        "idle_cost_by_reason": {s: _state_hours(rows, [s], "cost") for s in IDLE_STATES},
        "hoarding_pods": int(len(pods)),
        "hoarding_pod_min_share": hoarding_share,
        "gpus_sm_active": int(counts.get("sm_active", 0)),
        "gpus_gpu_util_fallback": int(counts.get("gpu_util_fallback", 0)),
        "gpus_mixed": int(counts.get("mixed", 0)),
    }
    notes = _unattributed_note(totals)
    if summary["gpus_gpu_util_fallback"] or summary["gpus_mixed"]:
        notes.append(f"{summary['gpus_gpu_util_fallback'] + summary['gpus_mixed']} GPU(s) lack SM activity (GPM) in some or all "
                     "samples: the classifier fell back to NVML utilisation there (see table activity_source), "
                     "and fake_busy cannot be detected on them.")
    tables = {
        "states": states,
        "by_pool": _wide_states(rows, "pool"),
        "by_team": _wide_states(_labelled(rows), "team"),
        "hoarding_pods": pods,
        "activity_source": sources,
        **claim_tables(ledger),
    }
    return Report("idle", ledger, summary, tables, "states", notes)


# -- efficiency ---------------------------------------------------------------------------------------


def _efficiency_table(rows: pd.DataFrame, by: str, window_hours: float) -> pd.DataFrame:
    allocated = _allocated(rows).to_numpy()
    idle = rows["state"].astype(str).isin(IDLE_STATES).to_numpy()
    sm_alloc = np.where(allocated & (rows["state"].astype(str) != "unmeasured"), rows["gpu_hours"] - rows["fallback_hours"], 0.0)
    work = pd.DataFrame({
        by: rows[by].astype(object).fillna("(none)").to_numpy(),
        "gpu_uuid": rows["gpu_uuid"].astype(object).to_numpy(),
        "gpu_hours": rows["gpu_hours"].to_numpy(),
        "allocated_gpu_hours": np.where(allocated, rows["gpu_hours"], 0.0),
        "used_gpu_hours": rows["used_hours"].to_numpy(),
        "used_allocated": np.where(allocated, rows["used_hours"], 0.0),
        "idle_gpu_hours": np.where(idle, rows["gpu_hours"], 0.0),
        "sm_alloc": sm_alloc,
    })
    grouped = work.groupby(by, sort=False).agg(
        gpus=("gpu_uuid", "nunique"), gpu_hours=("gpu_hours", "sum"), allocated_gpu_hours=("allocated_gpu_hours", "sum"),
        used_gpu_hours=("used_gpu_hours", "sum"), used_allocated=("used_allocated", "sum"),
        idle_gpu_hours=("idle_gpu_hours", "sum"), sm_alloc=("sm_alloc", "sum"),
    ).reset_index()
    grouped["avg_gpus"] = grouped["gpu_hours"] / window_hours if window_hours > 0 else np.nan
    grouped["allocation_ratio"] = _ratio(grouped["allocated_gpu_hours"], grouped["gpu_hours"])
    grouped["utilisation"] = _ratio(grouped["used_gpu_hours"], grouped["gpu_hours"])
    grouped["idle_share"] = _ratio(grouped["idle_gpu_hours"], grouped["gpu_hours"])
    grouped["efficiency_score"] = _ratio(grouped["used_allocated"], grouped["allocated_gpu_hours"])
    grouped["sm_measured_share"] = _ratio(grouped["sm_alloc"], grouped["allocated_gpu_hours"])
    columns = [by, "gpus", "avg_gpus", "gpu_hours", "allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours",
               "allocation_ratio", "utilisation", "idle_share", "efficiency_score", "sm_measured_share"]
    return grouped[columns].sort_values(["gpu_hours", by], ascending=[False, True], ignore_index=True)


def over_time(ledger: Ledger) -> pd.DataFrame:
    series = ledger.timeseries
    columns = ["bucket", "gpu_hours", "allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours", "cost",
               "allocation_ratio", "utilisation", "idle_share", "efficiency_score"]
    if series.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})
    state = series["state"].astype(str)
    allocated = ((state != "unallocated") & _attributed(series)).to_numpy()
    work = pd.DataFrame({
        "bucket": series["bucket"], "gpu_hours": series["gpu_hours"],
        "allocated_gpu_hours": np.where(allocated, series["gpu_hours"], 0.0),
        "used_gpu_hours": series["used_hours"], "used_allocated": np.where(allocated, series["used_hours"], 0.0),
        "idle_gpu_hours": np.where(state.isin(IDLE_STATES), series["gpu_hours"], 0.0), "cost": series["cost"],
    })
    grouped = work.groupby("bucket", sort=True).sum().reset_index()
    grouped["allocation_ratio"] = _ratio(grouped["allocated_gpu_hours"], grouped["gpu_hours"])
    grouped["utilisation"] = _ratio(grouped["used_gpu_hours"], grouped["gpu_hours"])
    grouped["idle_share"] = _ratio(grouped["idle_gpu_hours"], grouped["gpu_hours"])
    grouped["efficiency_score"] = _ratio(grouped["used_allocated"], grouped["allocated_gpu_hours"])
    return grouped[columns]


def states_over_time(ledger: Ledger) -> pd.DataFrame:
    """GPU-hours per time bucket and state (wide: one column per state), for charts."""
    series = ledger.timeseries
    if series.empty:
        return pd.DataFrame(columns=list(TAXONOMY))
    table = series.pivot_table(index="bucket", columns=series["state"].astype(str), values="gpu_hours", aggfunc="sum",
                               fill_value=0.0, observed=True)
    return table.reindex(columns=list(TAXONOMY), fill_value=0.0)


def efficiency_report(ledger: Ledger, pending: pd.DataFrame | None = None,
                      dimensions: Sequence[str] = EFFICIENCY_DIMENSIONS) -> Report:
    """Utilisation, idle share, allocation and the cluster efficiency score by each dimension and
    over time. ``pending`` (optional; columns ``timestamp`` and ``gpus``: pending GPU demand, from the
    scheduler or the cluster) adds queue depth; fleet samples alone do not carry it."""
    rows = _labelled(ledger.rows)
    hours = _hours(ledger)
    totals = fleet_totals(ledger)
    unknown = [d for d in dimensions if d not in EFFICIENCY_DIMENSIONS]
    if unknown:
        raise AnalyticsError(f"unknown dimension(s) {', '.join(unknown)}; allowed: {', '.join(EFFICIENCY_DIMENSIONS)}")
    summary = {k: totals[k] for k in ("gpus", "gpu_hours", "allocated_gpu_hours", "unattributed_gpu_hours",
                                      "unattributed_share", "used_gpu_hours", "idle_gpu_hours",
                                      "allocation_ratio", "utilisation", "idle_share", "efficiency_score",
                                      "sm_measured_share")}
    summary["queue"] = queue_depth(pending, ledger)
    tables = {f"by_{d}": _efficiency_table(rows, d, hours) for d in dimensions}
    tables["over_time"] = over_time(ledger)
    notes = _unattributed_note(totals)
    notes += [] if pending is not None else ["queue depth (pending GPU demand) is not in fleet samples; pass it to "
                                            "efficiency_report(pending=...) to include it"]
    return Report("efficiency", ledger, summary, tables, f"by_{dimensions[0]}" if dimensions else "over_time", notes)


def queue_depth(pending: pd.DataFrame | None, ledger: Ledger) -> dict | None:
    if pending is None:
        return None
    if not {"timestamp", "gpus"} <= set(pending.columns):
        raise AnalyticsError("pending demand needs columns timestamp and gpus")
    stamps = pd.to_datetime(pending["timestamp"], utc=True)
    window = pending[(stamps >= ledger.start) & (stamps < ledger.end)]
    gpus = pd.to_numeric(window["gpus"], errors="coerce").clip(lower=0)
    return {"samples": int(gpus.notna().sum()), "mean_pending_gpus": _plain(gpus.mean()) if len(gpus) else None,
            "max_pending_gpus": _plain(gpus.max()) if len(gpus) else None}


# -- chargeback -----------------------------------------------------------------------------------------


def chargeback(ledger: Ledger, by: Sequence[str] = ("team", "project"), unallocated: str = "separate") -> pd.DataFrame:
    """GPU-hours and cost per team and project. Every GPU-hour is charged somewhere, so the ``cost``
    column sums to the fleet cost: with ``unallocated="separate"`` capacity nobody held is its own
    ``(unallocated)`` row; with ``"proportional"`` its cost is spread over the holders in proportion
    to their allocated GPU-hours (columns ``unallocated_share_cost``)."""
    if unallocated not in ("separate", "proportional"):
        raise AnalyticsError(f"unallocated policy {unallocated!r} is not one of: separate, proportional")
    rows = _labelled(ledger.rows)
    by = list(by)
    state = rows["state"].astype(str).to_numpy()
    work = rows[by].astype(object).assign(
        gpu_hours=rows["gpu_hours"].to_numpy(), used_gpu_hours=rows["used_hours"].to_numpy(), cost=rows["cost"].to_numpy(),
        idle_gpu_hours=np.where(np.isin(state, IDLE_STATES), rows["gpu_hours"], 0.0),
        idle_cost=np.where(np.isin(state, IDLE_STATES), rows["cost"], 0.0),
    )
    for reason in IDLE_STATES:
        mask = state == reason
        work[f"{reason}_gpu_hours"] = np.where(mask, rows["gpu_hours"], 0.0)
        work[f"{reason}_cost"] = np.where(mask, rows["cost"], 0.0)
    grouped = work.groupby(by, sort=False).sum().reset_index()
    grouped["efficiency_score"] = np.where(grouped[by[0]].isin([UNALLOCATED_LABEL, UNATTRIBUTED_LABEL]), np.nan,
                                           _ratio(grouped["used_gpu_hours"], grouped["gpu_hours"]))
    grouped["unallocated_share_cost"] = 0.0
    if unallocated == "proportional":  # unattributed time stays its own row: nobody knows whose it was
        spare = grouped[by[0]] == UNALLOCATED_LABEL
        holders = ~spare & (grouped[by[0]] != UNATTRIBUTED_LABEL)
        pool_cost = float(grouped.loc[spare, "cost"].sum())
        held = grouped.loc[holders, "gpu_hours"]
        if pool_cost and held.sum() > 0:
            grouped.loc[holders, "unallocated_share_cost"] = pool_cost * held / held.sum()
            grouped.loc[holders, "cost"] += grouped.loc[holders, "unallocated_share_cost"]
            grouped = grouped[~spare].reset_index(drop=True)
    columns = [*by, "gpu_hours", "used_gpu_hours", "idle_gpu_hours", "efficiency_score", "cost", "idle_cost",
               "unallocated_share_cost"]
    columns += [f"{r}_gpu_hours" for r in IDLE_STATES] + [f"{r}_cost" for r in IDLE_STATES]
    grouped = grouped[columns]
    last = grouped[by[0]].isin([UNATTRIBUTED_LABEL, UNALLOCATED_LABEL])
    tail = grouped[last].sort_values(by[0], ascending=False)  # (unattributed), then (unallocated)
    ordered = pd.concat([grouped[~last].sort_values(["cost", *by], ascending=[False] + [True] * len(by)), tail])
    return ordered.reset_index(drop=True)


def chargeback_report(ledger: Ledger, unallocated: str = "separate") -> Report:
    table = chargeback(ledger, ("team", "project"), unallocated)
    teams = chargeback(ledger, ("team",), unallocated)
    fleet_cost = ledger.fleet_cost
    charged = float(table["cost"].sum())
    summary = {
        "fleet_cost": fleet_cost,
        "charged_cost": charged,
        "reconciles": bool(abs(charged - fleet_cost) <= 1e-6 * max(1.0, abs(fleet_cost))),
        "unallocated_policy": unallocated,
        "unallocated_cost": _state_hours(ledger.rows, ["unallocated"], "cost"),
        "unattributed_cost": float(ledger.rows.loc[~_attributed(ledger.rows), "cost"].sum()),
        "teams": int((~teams["team"].isin([UNALLOCATED_LABEL, UNATTRIBUTED_LABEL])).sum()),
        "gpu_hours": ledger.gpu_hours,
        "charged_gpu_hours": float(table["gpu_hours"].sum()),
    }
    totals = fleet_totals(ledger)
    summary["unattributed_gpu_hours"] = totals["unattributed_gpu_hours"]
    summary["unattributed_share"] = totals["unattributed_share"]
    return Report("chargeback", ledger, summary, {"by_team_project": table, "by_team": teams, **claim_tables(ledger)},
                  "by_team_project", _unattributed_note(totals))


def build_report(kind: str, ledger: Ledger, **options) -> Report:
    if kind == "idle":
        return idle_report(ledger, **options)
    if kind == "efficiency":
        return efficiency_report(ledger, **options)
    if kind == "cost":
        return cost_report(ledger, **options)
    if kind == "chargeback":
        return chargeback_report(ledger, **options)
    raise AnalyticsError(f"unknown report {kind!r}; allowed: {', '.join(REPORT_KINDS)}")
