"""The Idle and Cost pages' numbers: small pure functions over analytics reports (no Streamlit).

A page gets its ledger and its idle / cost reports once per window from :mod:`.data` (cached) and
hands them to the functions here, which only pick, label and order what analytics computed (every
definition is analytics' own, ``gpuwarden/analytics/REPORTS.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from gpuwarden.analytics import (
    IDLE_STATES,
    Ledger,
    Report,
    build_ledger,
    chargeback,
    reclaim_whatif,
)
from gpuwarden.analytics.engine import COLUMNS as ANALYTICS_COLUMNS
from gpuwarden.analytics.reports import states_over_time

from .palette import STATE_LABELS

COLUMNS: tuple[str, ...] = tuple(ANALYTICS_COLUMNS)


def ledger_for(frame: pd.DataFrame) -> Ledger:
    return build_ledger(frame)


def _finite(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


@dataclass(frozen=True)
class IdleHeadline:
    gpu_hours: float
    idle_gpu_hours: float
    idle_share: float | None
    idle_cost: float
    efficiency_score: float | None
    hoarding_pods: int
    fallback_gpus: int
    currency: str


def idle_headline(report: Report) -> IdleHeadline:
    s = report.summary
    return IdleHeadline(
        gpu_hours=s["gpu_hours"], idle_gpu_hours=s["idle_gpu_hours"], idle_share=_finite(s["idle_share"]),
        idle_cost=s["idle_cost"], efficiency_score=_finite(s["efficiency_score"]), hoarding_pods=s["hoarding_pods"],
        fallback_gpus=s["gpus_gpu_util_fallback"] + s["gpus_mixed"], currency=report.ledger.price_book.currency,
    )


def state_hours(report: Report) -> pd.DataFrame:
    """GPU-hours, share and cost per state, labelled, largest first (states with no time dropped)."""
    table = report.tables["states"] if "states" in report.tables else report.tables["by_state"]
    table = table.assign(label=table["state"].map(STATE_LABELS).fillna(table["state"]))
    table = table[table["gpu_hours"] > 0]
    return table.sort_values(["gpu_hours", "state"], ascending=[False, True], ignore_index=True)


def _whole_buckets(table: pd.DataFrame, ledger: Ledger) -> pd.DataFrame:
    """Drop the edge buckets the window covers only in part (they would dip toward 0)."""
    if table.empty:
        return table
    starts = pd.DatetimeIndex(table.index)
    whole = (starts >= ledger.start) & (starts + ledger.bucket <= ledger.end + pd.Timedelta(seconds=1))
    return table[whole] if whole.any() else table


def states_timeline(ledger: Ledger) -> pd.DataFrame:
    """GPU-hours per bucket (rows, UTC) and state (columns, state names), whole buckets only."""
    return _whole_buckets(states_over_time(ledger), ledger)


def cost_timeline(ledger: Ledger) -> pd.DataFrame:
    """Cost per bucket (rows, UTC) and state (columns, state names), whole buckets only."""
    series = ledger.timeseries
    if series.empty:
        return pd.DataFrame()
    table = series.pivot_table(index="bucket", columns=series["state"].astype(str), values="cost", aggfunc="sum",
                               fill_value=0.0, observed=True)
    return _whole_buckets(table, ledger)


def idle_by(report: Report, dimension: str) -> pd.DataFrame:
    """Idle report's wide table by ``pool`` or ``team``."""
    return report.tables[f"by_{dimension}"]


def hoarding_pods(report: Report) -> pd.DataFrame:
    return report.tables["hoarding_pods"]


def fallback_gpus(report: Report) -> pd.DataFrame:
    table = report.tables["activity_source"]
    return table[table["activity_source"] != "sm_active"].reset_index(drop=True)


@dataclass(frozen=True)
class CostHeadline:
    fleet_cost: float
    idle_cost: float
    idle_cost_share: float | None
    cost_per_used_gpu_hour: float | None
    energy_kwh: float
    currency: str


def cost_headline(report: Report) -> CostHeadline:
    s = report.summary
    return CostHeadline(s["fleet_cost"], s["idle_cost"], _finite(s["idle_cost_share"]), _finite(s["cost_per_used_gpu_hour"]),
                        s["energy_kwh"], report.ledger.price_book.currency)


def idle_cost_by_reason(report: Report) -> pd.DataFrame:
    table = state_hours(report)
    table = table[table["state"].isin(IDLE_STATES)]
    return table[["state", "label", "gpu_hours", "cost"]].rename(columns={"label": "reason"}).reset_index(drop=True)


def chargeback_table(ledger: Ledger, proportional: bool = False) -> pd.DataFrame:
    return chargeback(ledger, ("team", "project"), "proportional" if proportional else "separate")


def reclaim(ledger: Ledger, fraction: float) -> dict:
    row = reclaim_whatif(ledger, (fraction,)).iloc[0]
    return {k: (None if pd.isna(v) else float(v)) for k, v in row.items()}


def buy_vs_rent(report: Report) -> pd.DataFrame:
    return report.tables["buy_vs_rent"]
