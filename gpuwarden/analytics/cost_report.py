"""The cost report, the reclaim what-if and buy-vs-rent: what the fleet's GPU-hours cost, by pool,
model, tier and state, and what reclaiming idle time or owning the GPUs would change."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from gpuwarden.fleet import PriceTier

from .claim_report import claim_tables
from .ledger import Ledger
from .params import IDLE_STATES, RECLAIMABLE_STATES, AnalyticsError
from .pricebook import HOURS_PER_MONTH, PriceBookError
from .report_schema import Report, _hours
from .report_sums import _allocated, _by_state, _ratio, _state_hours, _unattributed_note, fleet_totals

DEFAULT_RECLAIM_FRACTIONS = (0.25, 0.5, 1.0)
ELASTIC_TIERS = (PriceTier.ON_DEMAND.value, PriceTier.SPOT.value)
WORKING_STATES = ("busy", "underutilized")


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
        **claim_tables(ledger),
    }
    return Report("cost", ledger, summary, tables, "by_pool", _unattributed_note(totals))
