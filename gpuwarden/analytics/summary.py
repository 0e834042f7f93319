"""A few headline figures for the demo's summary and the dashboards' top row.

``headline(data, window, price_book, inventory)`` classifies and prices the samples and returns a
small JSON-ready dict; ``headline_lines(figures)`` formats it for a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

from .ledger import Ledger
from .reader import build_ledger
from .inventory import Inventory
from .params import IDLE_STATES, IdleParams
from .pricebook import PriceBook
from .report_schema import _iso, _plain
from .report_sums import _state_hours, fleet_totals
from .reports import hoarding_pods


def headline(data, window: Sequence | None = None, price_book: PriceBook | None = None,
             inventory: Inventory | None = None, params: IdleParams | None = None) -> dict:
    """Idle GPU-hours and idle cost by reason, fleet cost and efficiency over ``window``.

    ``data``: a fleet-samples DataFrame, a samples source (``LocalStore``, ``FileSource``), or an
    already built :class:`~gpuwarden.analytics.ledger.Ledger` (then ``window`` and the rest are
    ignored). ``window``: ``(start, end)``, end exclusive, either may be None (the data's range).
    Defaults: the bundled price book and inventory, :class:`IdleParams` defaults.

    Keys: window_start, window_end, currency, gpus, gpu_hours, allocated_gpu_hours, efficiency_score,
    fleet_cost, idle_gpu_hours, idle_cost, idle_gpu_hours_by_reason, idle_cost_by_reason
    (reasons: unallocated, idle_unattributed, allocated_idle, hoarded, fake_busy, starved),
    unattributed_gpu_hours, unattributed_share, hoarding_pods,
    gpus_gpu_util_fallback.
    """
    if isinstance(data, Ledger):
        ledger = data
    else:
        start, end = (window if window is not None else (None, None))
        ledger = build_ledger(data, start, end, price_book=price_book, inventory=inventory, params=params)
    return headline_from_ledger(ledger)


def headline_from_ledger(ledger: Ledger) -> dict:
    rows = ledger.rows
    totals = fleet_totals(ledger)
    instances = ledger.instances
    fallback = instances.loc[instances["activity_source"] != "sm_active", "gpu_uuid"].nunique() if len(instances) else 0
    return _plain({
        "window_start": _iso(ledger.start),
        "window_end": _iso(ledger.end),
        "currency": ledger.price_book.currency,
        "gpus": totals["gpus"],
        "gpu_hours": totals["gpu_hours"],
        "allocated_gpu_hours": totals["allocated_gpu_hours"],
        "unattributed_gpu_hours": totals["unattributed_gpu_hours"],
        "unattributed_share": totals["unattributed_share"],
        "efficiency_score": totals["efficiency_score"],
        "fleet_cost": totals["fleet_cost"],
        "idle_gpu_hours": totals["idle_gpu_hours"],
        "idle_cost": totals["idle_cost"],
        "idle_gpu_hours_by_reason": {s: _state_hours(rows, [s]) for s in IDLE_STATES},
        "idle_cost_by_reason": {s: _state_hours(rows, [s], "cost") for s in IDLE_STATES},
        "hoarding_pods": int(len(hoarding_pods(ledger))),
        "gpus_gpu_util_fallback": int(fallback),
    })


def headline_lines(figures: dict) -> list[str]:
    """Terminal lines for :func:`headline`'s dict (the demo prints them)."""
    currency = figures.get("currency", "USD")
    lines = [
        f"GPU-hours:        {figures['gpu_hours']:,.1f} over {figures['gpus']} GPUs, "
        f"{figures['allocated_gpu_hours']:,.1f} allocated; efficiency score "
        + ("n/a" if figures["efficiency_score"] is None else f"{figures['efficiency_score']:.0%}"),
        f"fleet cost:       {figures['fleet_cost']:,.2f} {currency}; idle {figures['idle_gpu_hours']:,.1f} GPU-h "
        f"costing {figures['idle_cost']:,.2f} {currency}",
    ]
    reasons = ", ".join(f"{reason} {hours:,.1f} h / {figures['idle_cost_by_reason'][reason]:,.2f}"
                        for reason, hours in figures["idle_gpu_hours_by_reason"].items() if hours > 0)
    lines.append(f"idle by reason:   {reasons or 'none'}")
    if figures.get("unattributed_gpu_hours"):
        lines.append(f"unattributed:     {figures['unattributed_share']:.0%} of GPU-hours (no pod attribution: "
                     "classified by activity alone, neither allocated nor unallocated)")
    if figures["hoarding_pods"]:
        lines.append(f"hoarding pods:    {figures['hoarding_pods']} (memory held with no activity; see 'gpuwarden report idle')")
    return lines
