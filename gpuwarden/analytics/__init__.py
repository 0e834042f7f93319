"""analytics room: idle capacity and its reasons, fleet efficiency, cost and chargeback.

Reads fleet samples only (a DataFrame or a ``SamplesSource``); emits reports, never acts.

- :func:`build_ledger` classifies every GPU-interval (:mod:`.params` documents the taxonomy and
  thresholds) and prices it with a :class:`PriceBook` and an :class:`Inventory` (node -> pool, tier);
- :mod:`.reports` turns the ledger into the idle, efficiency, cost and chargeback reports, the
  reclaim what-if and buy-vs-rent;
- :func:`headline` gives the demo its summary figures.
"""

from .ledger import COLUMNS, Ledger, LedgerBuilder
from .reader import build_ledger
from .inventory import Inventory, Rule
from .params import (
    IDLE_REASONS,
    IDLE_STATES,
    RECLAIMABLE_STATES,
    STATES,
    TAXONOMY,
    AnalyticsError,
    IdleParams,
    IdleState,
)
from .pricebook import PriceBook, PriceBookError
from .cost_report import buy_vs_rent, cost_report, reclaim_whatif
from .report_schema import REPORT_KINDS, Report
from .reports import (
    build_report,
    chargeback,
    chargeback_report,
    efficiency_report,
    hoarding_pods,
    idle_report,
)
from .summary import headline, headline_from_ledger, headline_lines


def classify(frame, params: IdleParams | None = None):
    """Per-sample states of a small fleet-samples frame (indexed like ``frame``; duplicate rows
    dropped): timestamp, gpu_uuid, mig_instance, node, state, duration_seconds, activity,
    activity_source. No pricing."""
    ledger = build_ledger(frame, params=params, keep_rows=True, price=False)
    return ledger.classified  # type: ignore[attr-defined]


__all__ = [name for name in dir() if not name.startswith("_")]
