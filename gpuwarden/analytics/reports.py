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
- **cost**: every GPU-hour in the fleet is priced (cloud GPUs bill whether allocated or not), so the
  fleet cost is the sum over all states and the chargeback rows add up to it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from gpuwarden.fleet import PriceTier
from gpuwarden.fleet.semantics import iso_utc

from .ledger import Ledger
from .params import IDLE_STATES, RECLAIMABLE_STATES, TAXONOMY, AnalyticsError
from .pricebook import HOURS_PER_MONTH, PriceBookError

SCHEMA_VERSION = 1
REPORT_KINDS = ("idle", "efficiency", "cost", "chargeback")
UNALLOCATED_LABEL = "(unallocated)"
UNATTRIBUTED_LABEL = "(unattributed)"
NO_TEAM_LABEL = "(no team)"
NO_PROJECT_LABEL = "(no project)"
DEFAULT_RECLAIM_FRACTIONS = (0.25, 0.5, 1.0)
HOARDING_POD_SHARE = 0.5
ELASTIC_TIERS = (PriceTier.ON_DEMAND.value, PriceTier.SPOT.value)
WORKING_STATES = ("busy", "underutilized")
EFFICIENCY_DIMENSIONS = ("cluster", "pool", "node", "model", "team", "project")


# The stable JSON layout (schema_version 1), documented in REPORTS.md and checked by the tests.
TOP_LEVEL_KEYS = ("report", "schema_version", "window", "currency", "summary", "tables", "notes", "quality", "params")
SUMMARY_KEYS: dict[str, tuple[str, ...]] = {
    "idle": ("gpus", "gpu_hours", "allocated_gpu_hours", "unattributed_gpu_hours", "unattributed_share", "idle_gpu_hours",
             "idle_share", "idle_cost", "efficiency_score", "fleet_cost", "idle_gpu_hours_by_reason", "idle_cost_by_reason", "hoarding_pods", "hoarding_pod_min_share",
             "gpus_sm_active", "gpus_gpu_util_fallback", "gpus_mixed"),
    "efficiency": ("gpus", "gpu_hours", "allocated_gpu_hours", "unattributed_gpu_hours", "unattributed_share", "used_gpu_hours", "idle_gpu_hours", "allocation_ratio",
                   "utilisation", "idle_share", "efficiency_score", "sm_measured_share", "queue"),
    "cost": ("gpus", "gpu_hours", "unattributed_gpu_hours", "unattributed_share", "used_gpu_hours", "fleet_cost", "idle_cost", "idle_cost_share", "energy_kwh",
             "cost_per_gpu_hour", "cost_per_used_gpu_hour", "idle_cost_by_reason", "price_book"),
    "chargeback": ("fleet_cost", "charged_cost", "reconciles", "unallocated_policy", "unallocated_cost", "unattributed_cost",
                   "teams", "gpu_hours", "charged_gpu_hours", "unattributed_gpu_hours", "unattributed_share"),
}
TABLE_NAMES: dict[str, tuple[str, ...]] = {
    "idle": ("states", "by_pool", "by_team", "hoarding_pods", "activity_source"),
    "efficiency": ("by_cluster", "by_pool", "by_node", "by_model", "by_team", "by_project", "over_time"),
    "cost": ("by_pool", "by_model", "by_tier", "by_state", "reclaim", "buy_vs_rent"),
    "chargeback": ("by_team_project", "by_team"),
}


@dataclass
class Report:
    kind: str
    ledger: Ledger
    summary: dict
    tables: dict[str, pd.DataFrame]
    main: str
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The ledger's notes (window trimmed to the data, an assumed interval) come first.
        self.notes = [*getattr(self.ledger, "notes", []), *self.notes]

    def to_dict(self) -> dict:
        """JSON-ready: plain floats, ints, strings, None; timestamps as ISO-8601 UTC."""
        ledger = self.ledger
        return {
            "report": self.kind,
            "schema_version": SCHEMA_VERSION,
            "window": {"start": _iso(ledger.start), "end": _iso(ledger.end),
                       "hours": _hours(ledger), "step_seconds": ledger.params.step.total_seconds()},
            "currency": ledger.price_book.currency,
            "summary": _plain(self.summary),
            "tables": {name: _records(table) for name, table in self.tables.items()},
            "notes": list(self.notes),
            "quality": _plain(ledger.quality),
            "params": _plain(ledger.params.to_dict()),
        }


# -- helpers ---------------------------------------------------------------------------------------


def _iso(stamp) -> str | None:
    if stamp is None or pd.isna(stamp):
        return None
    return iso_utc(stamp, fraction=True)


def _hours(ledger: Ledger) -> float:
    return max((ledger.end - ledger.start).total_seconds() / 3600.0, 0.0)


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (pd.Timestamp, np.datetime64)):
        return _iso(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def _records(table: pd.DataFrame) -> list[dict]:
    out = []
    columns = list(table.columns)
    for row in table.itertuples(index=False, name=None):
        out.append({column: _plain(None if (not isinstance(v, str) and pd.isna(v)) else v) for column, v in zip(columns, row)})
    return out


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


# -- idle --------------------------------------------------------------------------------------------


def hoarding_pods(ledger: Ledger, min_share: float = HOARDING_POD_SHARE) -> pd.DataFrame:
    """Pods that spend at least ``min_share`` of their allocated GPU-hours hoarded (memory held, no
    activity past the grace period), most hoarded hours first."""
    rows = ledger.rows[_allocated(ledger.rows)]
    keys = ["namespace", "pod", "team", "project"]
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


# -- cost ----------------------------------------------------------------------------------------------


def _cost_table(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    idle = rows["state"].astype(str).isin(IDLE_STATES).to_numpy()
    work = rows[keys].astype(object).fillna("(none)").assign(
        gpu_hours=rows["gpu_hours"].to_numpy(), used_gpu_hours=rows["used_hours"].to_numpy(),
        cost=rows["cost"].to_numpy(), idle_gpu_hours=np.where(idle, rows["gpu_hours"], 0.0),
        idle_cost=np.where(idle, rows["cost"], 0.0), energy_kwh=rows["energy_kwh"].to_numpy())
    grouped = work.groupby(keys, sort=False).sum().reset_index()
    grouped["idle_cost_share"] = _ratio(grouped["idle_cost"], grouped["cost"])
    grouped["cost_per_used_gpu_hour"] = _ratio(grouped["cost"], grouped["used_gpu_hours"])
    return grouped.sort_values(["cost", *keys], ascending=[False] + [True] * len(keys), ignore_index=True)


def reclaim_whatif(ledger: Ledger, fractions: Sequence[float] = DEFAULT_RECLAIM_FRACTIONS,
                   states: Sequence[str] = RECLAIMABLE_STATES) -> pd.DataFrame:
    """If ``fraction`` of the GPU-hours in ``states`` were reclaimed:

    - ``cost_reduction``: the bill falls by that share of their cost on elastic tiers (on-demand,
      spot), which can be released; reserved and owned capacity is paid for anyway;
    - ``committed_value_freed``: that share of their cost on reserved and owned capacity, which is
      not saved but becomes available to other work;
    - ``throughput_gain``: the reclaimed hours, put to work at the fleet's measured productivity
      (used over GPU-hours in the working states busy and underutilized), over today's used hours.
    """
    for fraction in fractions:
        if not 0.0 <= fraction <= 1.0:
            raise AnalyticsError(f"reclaim fraction {fraction} is not in 0..1")
    rows = ledger.rows
    state = rows["state"].astype(str)
    reclaimable = state.isin(list(states)).to_numpy()
    elastic = rows["tier"].astype(str).isin(ELASTIC_TIERS).to_numpy()
    hours = float(rows.loc[reclaimable, "gpu_hours"].sum())
    elastic_cost = float(rows.loc[reclaimable & elastic, "cost"].sum())
    committed_cost = float(rows.loc[reclaimable & ~elastic, "cost"].sum())
    working = state.isin(WORKING_STATES).to_numpy()
    productivity = _ratio(float(rows.loc[working, "used_hours"].sum()), float(rows.loc[working, "gpu_hours"].sum()))
    used = float(rows["used_hours"].sum())
    fleet_cost = float(rows["cost"].sum())
    out = []
    for fraction in fractions:
        gain_hours = fraction * hours * (productivity if np.isfinite(productivity) else 0.0)
        out.append({
            "fraction": float(fraction),
            "reclaimed_gpu_hours": fraction * hours,
            "cost_reduction": fraction * elastic_cost,
            "cost_reduction_share": _ratio(fraction * elastic_cost, fleet_cost),
            "committed_value_freed": fraction * committed_cost,
            "throughput_gain": _ratio(gain_hours, used),
            "extra_used_gpu_hours": gain_hours,
        })
    return pd.DataFrame(out, columns=["fraction", "reclaimed_gpu_hours", "cost_reduction", "cost_reduction_share",
                                      "committed_value_freed", "throughput_gain", "extra_used_gpu_hours"])


def buy_vs_rent(ledger: Ledger) -> pd.DataFrame:
    """Per GPU model: months until owning the GPUs the fleet runs costs less than renting the
    GPU-hours it actually allocates, at the measured allocation and power.

    rent per month = average GPUs x allocation ratio x 730 h x on-demand price (a perfectly elastic
    cloud bill); own per month = average GPUs x 730 h x measured mean power x PUE x kWh price;
    break-even months = capex x average GPUs / (rent - own); ``None`` when owning never pays off.
    """
    rows = ledger.rows
    hours = _hours(ledger)
    book = ledger.price_book
    out = []
    for model, part in rows.groupby(rows["model"].astype(object), sort=True):
        gpu_hours = float(part["gpu_hours"].sum())
        allocated = float(part.loc[_allocated(part), "gpu_hours"].sum())
        gpus = gpu_hours / hours if hours > 0 else 0.0
        try:
            prices = book.model(model)
            on_demand = book.hourly(model, PriceTier.ON_DEMAND)
            reserved = book.hourly(model, PriceTier.RESERVED)
        except PriceBookError:
            continue  # a model priced only by tiers it uses; nothing to compare
        if prices.capex is None:
            continue
        watts = 1000.0 * float(part["energy_kwh"].sum()) / gpu_hours if gpu_hours > 0 else prices.typical_watts
        allocation = allocated / gpu_hours if gpu_hours > 0 else 0.0
        rent = gpus * allocation * HOURS_PER_MONTH * on_demand
        rent_reserved = gpus * HOURS_PER_MONTH * reserved
        own = gpus * HOURS_PER_MONTH * watts / 1000.0 * book.energy_price_per_kwh()
        capex = gpus * prices.capex
        saving = rent - own
        months = capex / saving if saving > 0 else None
        lifetime = prices.lifetime_years * 12
        out.append({
            "model": model, "avg_gpus": gpus, "allocation_ratio": allocation,
            "utilisation": _ratio(float(part["used_hours"].sum()), gpu_hours), "mean_watts": watts,
            "rent_on_demand_monthly": rent, "rent_reserved_monthly": rent_reserved, "own_opex_monthly": own,
            "capex": capex, "break_even_months": months, "lifetime_months": lifetime,
            "verdict": "buy" if months is not None and months <= lifetime else "rent",
            "break_even_allocation_ratio": _break_even_allocation(capex, lifetime, own, gpus, on_demand),
        })
    columns = ["model", "avg_gpus", "allocation_ratio", "utilisation", "mean_watts", "rent_on_demand_monthly",
               "rent_reserved_monthly", "own_opex_monthly", "capex", "break_even_months", "lifetime_months", "verdict",
               "break_even_allocation_ratio"]
    return pd.DataFrame(out, columns=columns)


def _break_even_allocation(capex: float, lifetime_months: float, own_monthly: float, gpus: float, on_demand: float) -> float | None:
    """The allocation ratio at which owning pays off exactly over the hardware's lifetime."""
    if gpus <= 0 or on_demand <= 0 or lifetime_months <= 0:
        return None
    needed = (capex / lifetime_months + own_monthly) / (gpus * HOURS_PER_MONTH * on_demand)
    return float(needed)


def cost_report(ledger: Ledger, reclaim_fractions: Sequence[float] = DEFAULT_RECLAIM_FRACTIONS) -> Report:
    rows = ledger.rows
    totals = fleet_totals(ledger)
    summary = {k: totals[k] for k in ("gpus", "gpu_hours", "unattributed_gpu_hours", "unattributed_share", "used_gpu_hours",
                                      "fleet_cost", "idle_cost", "idle_cost_share", "energy_kwh")}
    summary["cost_per_gpu_hour"] = _ratio(totals["fleet_cost"], totals["gpu_hours"])
    summary["cost_per_used_gpu_hour"] = _ratio(totals["fleet_cost"], totals["used_gpu_hours"])
    summary["idle_cost_by_reason"] = {s: _state_hours(rows, [s], "cost") for s in IDLE_STATES}
    summary["price_book"] = ledger.price_book.to_dict()
    by_reason = _by_state(rows)
    tables = {
        "by_pool": _cost_table(rows, ["pool", "tier", "model"]),
        "by_model": _cost_table(rows, ["model"]),
        "by_tier": _cost_table(rows, ["tier"]),
        "by_state": by_reason,
        "reclaim": reclaim_whatif(ledger, reclaim_fractions),
        "buy_vs_rent": buy_vs_rent(ledger),
    }
    return Report("cost", ledger, summary, tables, "by_pool", _unattributed_note(totals))


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
    return Report("chargeback", ledger, summary, {"by_team_project": table, "by_team": teams}, "by_team_project",
                  _unattributed_note(totals))


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
