"""The Idle and Cost pages' numbers: small pure functions over an analytics ledger.

Nothing here imports Streamlit. A page reads a window of fleet samples (the columns in
:data:`COLUMNS`), builds a ledger with :func:`ledger_for` (the bundled price book and inventory, the
default idle thresholds) and shows the tables below; every definition is analytics' own
(``gpuwarden/analytics/REPORTS.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from gpuwarden.analytics import (
    IDLE_STATES,
    Ledger,
    build_ledger,
    chargeback,
    cost_report,
    idle_report,
    reclaim_whatif,
)
from gpuwarden.analytics.engine import COLUMNS as ANALYTICS_COLUMNS
from gpuwarden.analytics.reports import over_time, states_over_time

COLUMNS: tuple[str, ...] = tuple(ANALYTICS_COLUMNS)
STATE_LABELS = {
    "unallocated": "Unallocated",
    "allocated_idle": "Allocated, idle",
    "hoarded": "Hoarded (memory held, idle)",
    "fake_busy": "Fake busy (util without SM activity)",
    "starved": "Starved (bursts, long gaps)",
    "underutilized": "Underutilised",
    "busy": "Busy",
    "unmeasured": "Unmeasured",
}


def ledger_for(frame: pd.DataFrame) -> Ledger:
    return build_ledger(frame)


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


def idle_headline(ledger: Ledger) -> IdleHeadline:
    report = idle_report(ledger)
    s = report.summary
    return IdleHeadline(
        gpu_hours=s["gpu_hours"], idle_gpu_hours=s["idle_gpu_hours"], idle_share=_finite(s["idle_share"]),
        idle_cost=s["idle_cost"], efficiency_score=_finite(s["efficiency_score"]), hoarding_pods=s["hoarding_pods"],
        fallback_gpus=s["gpus_gpu_util_fallback"] + s["gpus_mixed"], currency=ledger.price_book.currency,
    )


def _finite(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def state_hours(ledger: Ledger) -> pd.DataFrame:
    """GPU-hours and cost per state, labelled, in taxonomy order (states with no time kept)."""
    table = idle_report(ledger).tables["states"]
    return table.assign(label=table["state"].map(STATE_LABELS))


def states_timeline(ledger: Ledger) -> pd.DataFrame:
    """GPU-hours per hour bucket and state, columns labelled, index naive UTC (for st.area_chart)."""
    table = states_over_time(ledger)
    if table.empty:
        return table
    table = table.rename(columns=STATE_LABELS)
    table.index = pd.DatetimeIndex(table.index).tz_convert(None)
    return table


def efficiency_timeline(ledger: Ledger) -> pd.DataFrame:
    table = over_time(ledger)
    if table.empty:
        return pd.DataFrame()
    out = table.set_index("bucket")[["efficiency_score", "allocation_ratio", "idle_share"]] * 100
    out.index = pd.DatetimeIndex(out.index).tz_convert(None)
    return out.rename(columns={"efficiency_score": "Efficiency score %", "allocation_ratio": "Allocated %",
                               "idle_share": "Idle share %"})


def idle_by(ledger: Ledger, dimension: str) -> pd.DataFrame:
    """Idle report's wide table by ``pool`` or ``team``."""
    return idle_report(ledger).tables[f"by_{dimension}"]


def hoarding_pods(ledger: Ledger) -> pd.DataFrame:
    return idle_report(ledger).tables["hoarding_pods"]


def fallback_gpus(ledger: Ledger) -> pd.DataFrame:
    table = idle_report(ledger).tables["activity_source"]
    return table[table["activity_source"] != "sm_active"].reset_index(drop=True)


@dataclass(frozen=True)
class CostHeadline:
    fleet_cost: float
    idle_cost: float
    idle_cost_share: float | None
    cost_per_used_gpu_hour: float | None
    energy_kwh: float
    currency: str


def cost_headline(ledger: Ledger) -> CostHeadline:
    s = cost_report(ledger).summary
    return CostHeadline(s["fleet_cost"], s["idle_cost"], _finite(s["idle_cost_share"]), _finite(s["cost_per_used_gpu_hour"]),
                        s["energy_kwh"], ledger.price_book.currency)


def cost_by_pool(ledger: Ledger) -> pd.DataFrame:
    return cost_report(ledger).tables["by_pool"]


def idle_cost_by_reason(ledger: Ledger) -> pd.DataFrame:
    table = state_hours(ledger)
    table = table[table["state"].isin(IDLE_STATES)]
    return table[["label", "gpu_hours", "cost"]].rename(columns={"label": "reason"}).reset_index(drop=True)


def chargeback_table(ledger: Ledger, proportional: bool = False) -> pd.DataFrame:
    return chargeback(ledger, ("team", "project"), "proportional" if proportional else "separate")


def reclaim(ledger: Ledger, fraction: float) -> dict:
    row = reclaim_whatif(ledger, (fraction,)).iloc[0]
    return {k: (None if pd.isna(v) else float(v)) for k, v in row.items()}


def buy_vs_rent(ledger: Ledger) -> pd.DataFrame:
    return cost_report(ledger).tables["buy_vs_rent"]

