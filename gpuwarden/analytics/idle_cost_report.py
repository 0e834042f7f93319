"""The Idle, Cost and Queue pages' numbers: small pure functions over the analytics reports (no
Streamlit), and :func:`ledger_bundle`, which builds one ledger per window and keeps from it exactly
what those pages show (headlines, states, timelines, chargeback both ways, the reclaim what-if at
every slider step, buy vs rent, used GPUs per team).

The functions here only pick and order what the reports computed (every definition is analytics'
own, ``gpuwarden/analytics/REPORTS.md``); labels and colours are the dashboards' business.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from .engine import COLUMNS as ANALYTICS_COLUMNS
from .engine import Ledger, build_ledger
from .inventory import TIER_NOTE_PREFIX, Inventory
from .pricebook import PriceBook
from .params import IDLE_STATES
from .report_bundle import Bundle
from .cost_report import cost_report, reclaim_whatif
from .report_schema import Report
from .reports import (
    chargeback,
    efficiency_report,
    idle_report,
    states_over_time,
)
from .windows import Window

COLUMNS: tuple[str, ...] = tuple(ANALYTICS_COLUMNS)
RECLAIM_STEPS: tuple[float, ...] = tuple(round(i / 20, 2) for i in range(21))  # the Cost page's 5 % slider


def ledger_for(frame: pd.DataFrame) -> Ledger:
    return build_ledger(frame)


def _finite(value: Any) -> float | None:
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
    """GPU-hours, share and cost per state, largest first (states with no time dropped)."""
    table = report.tables["states"] if "states" in report.tables else report.tables["by_state"]
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
    return table[["state", "gpu_hours", "cost"]].reset_index(drop=True)


def chargeback_table(ledger: Ledger, proportional: bool = False) -> pd.DataFrame:
    return chargeback(ledger, ("team", "project"), "proportional" if proportional else "separate")


def reclaim(ledger: Ledger, fraction: float) -> dict[str, float | None]:
    row = reclaim_whatif(ledger, (fraction,)).iloc[0]
    return {k: (None if pd.isna(v) else float(v)) for k, v in row.items()}


def buy_vs_rent(report: Report) -> pd.DataFrame:
    return report.tables["buy_vs_rent"]


def used_gpus_by_team(ledger: Ledger) -> pd.DataFrame:
    """Mean GPUs doing useful work (SM activity) per team over the ledger's window: team, used_gpus."""
    by_team = efficiency_report(ledger).tables["by_team"]
    hours = max((ledger.end - ledger.start).total_seconds() / 3600.0, 1e-9)
    return pd.DataFrame({"team": by_team["team"].astype(str).to_numpy(),
                         "used_gpus": by_team["used_gpu_hours"].astype("float64").to_numpy() / hours})


def pricing_names(ledger: Ledger) -> dict[str, str]:
    """Which price book and inventory priced ``ledger`` and where each node's tier came from (the
    Cost page prints them)."""
    return {"price_book": ledger.price_book.identity,
            "price_tiers": next((note for note in ledger.notes if note.startswith(TIER_NOTE_PREFIX)), "")}


def ledger_bundle(source: Any, window: Window, version: float = 0.0, price_book: PriceBook | None = None,
                  inventory: Inventory | None = None) -> Bundle:
    """One ledger over ``window`` and, from it, everything the Idle, Cost and Queue pages show.
    ``source``: a store or a fleet-samples frame (as :func:`build_ledger` takes); ``price_book``
    and ``inventory``: the bundled ones unless given."""
    ledger = build_ledger(source, window.start, window.end, price_book=price_book, inventory=inventory)
    idle = idle_report(ledger)
    cost = cost_report(ledger)
    reclaim_table = reclaim_whatif(ledger, RECLAIM_STEPS)
    values: dict[str, Any] = {
        "idle_headline": asdict(idle_headline(idle)),
        "cost_headline": asdict(cost_headline(cost)),
        "states": state_hours(idle).reset_index(drop=True),
        "states_timeline": states_timeline(ledger),
        "cost_timeline": cost_timeline(ledger),
        "idle_by_pool": idle_by(idle, "pool"),
        "idle_by_team": idle_by(idle, "team"),
        "hoarding_pods": hoarding_pods(idle),
        "fallback_gpus": fallback_gpus(idle),
        "cost_by_pool": cost.tables["by_pool"],
        "idle_cost_by_reason": idle_cost_by_reason(cost),
        "chargeback": chargeback_table(ledger, False),
        "chargeback_proportional": chargeback_table(ledger, True),
        "reclaim": reclaim_table,
        "buy_vs_rent": buy_vs_rent(cost),
        "cost_by_claim": cost.tables.get("by_claim", pd.DataFrame()),  # empty where no DRA claim held a GPU
        "used_by_team": used_gpus_by_team(ledger),
        **pricing_names(ledger),
    }
    return Bundle(values, window.start, window.end, version)
