"""The actuator's audit log as tables for the Actions page (pure: paths and frames in, frames out)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from gpuwarden.actuator import AuditLog

AUDIT_ENV = "GPUWARDEN_AUDIT"  # the actuator's audit log (JSON lines); default beside the store
AUDIT_COLUMNS = ["at", "mode", "outcome", "kind", "target", "reason", "message", "approval_id"]


def audit_path(store_path: str | None) -> Path | None:
    explicit = os.environ.get(AUDIT_ENV, "").strip()
    if explicit:
        return Path(explicit)
    return Path(store_path) / "actuator" / "audit.jsonl" if store_path else None


def load_audit(path: Path | None) -> pd.DataFrame:
    """Entries newest first; an empty frame (with the columns) when there is no log yet."""
    if path is None or not path.exists():
        return pd.DataFrame(columns=AUDIT_COLUMNS)
    frame = pd.DataFrame(AuditLog.read(path), columns=AUDIT_COLUMNS)
    frame["at"] = pd.to_datetime(frame["at"], utc=True, format="ISO8601")
    return frame.sort_values("at", ascending=False, kind="stable", ignore_index=True)


def outcome_counts(frame: pd.DataFrame) -> pd.DataFrame:
    """How many actions ended each way, per kind (rows) and outcome (columns)."""
    if frame.empty:
        return pd.DataFrame()
    return frame.pivot_table(index="kind", columns="outcome", values="target", aggfunc="count", fill_value=0)
