"""The :class:`Report` every analytics report is, and its stable JSON layout (``schema_version`` 1,
documented in ``gpuwarden/analytics/REPORTS.md`` and checked by the tests): ``Report.to_dict()``
turns DataFrames, numpy scalars and timestamps into plain JSON values."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuwarden.fleet.semantics import iso_utc

from .ledger import Ledger

SCHEMA_VERSION = 1
REPORT_KINDS = ("idle", "efficiency", "cost", "chargeback")

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
