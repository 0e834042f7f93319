"""The Health page's tables: findings as rows (GPU index beside the UUID) and an XID / ECC /
row-remap event timeline per node (pure: no Streamlit), and :func:`health_bundle`, both for one
window from one read of the samples. The Fleet, GPU detail and Actions pages read the same
findings table (critical count, one GPU's findings, a node's findings)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuwarden.fleet import XID_COLUMN_NAMES
from gpuwarden.fleet.semantics import counter_increments, group_first_rows

from .health.catalogue import CORDONING_ACTIONS
from .report_bundle import Bundle
from .windows import Window, bucket_for

SEVERITY_ORDER: tuple[str, ...] = ("critical", "warning", "info")  # most urgent first

FINDING_COLUMNS = ["severity", "kind", "node", "gpu_index", "gpu_uuid", "action", "cordons", "confidence",
                   "first_seen", "last_seen", "active", "model", "evidence", "note"]
EVENT_COLUMNS: tuple[str, ...] = (*XID_COLUMN_NAMES, "ecc_sbe_volatile_total", "ecc_dbe_volatile_total",
                                  "remapped_rows_correctable_total", "remapped_rows_uncorrectable_total")
TIMELINE_COLUMNS: tuple[str, ...] = ("timestamp", "node", "gpu_uuid", "gpu_index", *EVENT_COLUMNS)


def event_label(column: str) -> str:
    """'xid_79_total' -> 'XID 79'; 'ecc_dbe_volatile_total' -> 'ECC DBE'; remaps by kind."""
    if column.startswith("xid_"):
        code = column.removeprefix("xid_").removesuffix("_total")
        return "XID other" if code == "other" else f"XID {code}"
    if column.startswith("ecc_"):
        return f"ECC {column.split('_')[1].upper()}"
    return "Row remap (" + column.split("_")[2] + ")"


def findings_table(findings: list[Any], gpu_index: dict[str, int] | None = None) -> pd.DataFrame:
    """One row per finding, critical first; always has :data:`FINDING_COLUMNS` (also when empty)."""
    gpu_index = gpu_index or {}
    rows = []
    for f in findings:
        evidence = {k: v for k, v in f.evidence.items() if k != "note"}
        index = gpu_index.get(f.gpu_uuid) if f.gpu_uuid else None
        rows.append({
            "severity": f.severity.value, "kind": f.kind, "node": f.node,
            "gpu_index": pd.NA if index is None else int(index), "gpu_uuid": f.gpu_uuid or "",
            "action": f.recommended_action.value if f.recommended_action else "",
            "cordons": f.recommended_action in CORDONING_ACTIONS, "confidence": float(f.confidence),
            "first_seen": pd.Timestamp(f.first_seen).tz_convert(None), "last_seen": pd.Timestamp(f.last_seen).tz_convert(None),
            "active": bool(f.active), "model": f.model or "",
            "evidence": ", ".join(f"{k}={v}" for k, v in evidence.items()), "note": f.evidence.get("note", ""),
        })
    table = pd.DataFrame(rows, columns=FINDING_COLUMNS)
    if table.empty:
        return table.astype({"cordons": bool, "active": bool, "confidence": "float64"})
    rank = table["severity"].map({s: i for i, s in enumerate(SEVERITY_ORDER)}).fillna(len(SEVERITY_ORDER))
    return table.assign(_rank=rank).sort_values(["_rank", "last_seen"], ascending=[True, False]).drop(columns="_rank") \
        .reset_index(drop=True)


def gpu_indices(frame: pd.DataFrame) -> dict[str, int]:
    part = frame[["gpu_uuid", "gpu_index"]].dropna().drop_duplicates("gpu_uuid", keep="last")
    return {str(u): int(i) for u, i in zip(part["gpu_uuid"].astype(str), part["gpu_index"])}


def event_timeline(frame: pd.DataFrame, bucket: str = "1h") -> pd.DataFrame:
    """Events per time bucket, GPU and kind: columns time (bucket start, UTC), node, gpu (index and
    UUID), event, count. A counter that drops was reset: the value after it counts as new events,
    as Prometheus' ``increase()`` reads it (:func:`gpuwarden.fleet.semantics.counter_increments`). Rows only where something happened."""
    columns = ["time", "node", "gpu", "event", "count"]
    present = [c for c in EVENT_COLUMNS if c in frame.columns]
    if frame.empty or not present:
        return pd.DataFrame(columns=columns)
    work = frame[["timestamp", "node", "gpu_uuid", "gpu_index", *present]].drop_duplicates(["gpu_uuid", "timestamp"])
    work = work.sort_values(["gpu_uuid", "timestamp"], kind="stable")
    first = group_first_rows(work["gpu_uuid"].astype(str).to_numpy())
    steps = pd.DataFrame({c: counter_increments(work[c].to_numpy(dtype="float64", na_value=np.nan), first)[0]
                          for c in present}, index=work.index)
    moved = steps.to_numpy().sum(axis=1) > 0
    if not moved.any():
        return pd.DataFrame(columns=columns)
    part = work.loc[moved, ["timestamp", "node", "gpu_uuid", "gpu_index"]].copy()
    part[present] = steps[moved]
    part["time"] = pd.DatetimeIndex(part["timestamp"]).floor(bucket)
    index = part["gpu_index"].astype("Int64").astype(str)
    part["gpu"] = "GPU " + index + " · " + part["gpu_uuid"].astype(str)
    long = part.melt(id_vars=["time", "node", "gpu"], value_vars=present, var_name="column", value_name="count")
    long = long[long["count"] > 0]
    long["event"] = long["column"].map(event_label)
    out = long.groupby(["time", "node", "gpu", "event"], as_index=False, observed=True)["count"].sum()
    return out[columns].sort_values(["time", "node", "gpu"], ignore_index=True)


def health_bundle(source: Any, window: Window, version: float = 0.0, pools: dict[str, str] | None = None) -> Bundle:
    """The health scan of ``window`` as the findings table, and its event timeline in the window's
    chart bucket, from one read of the columns both need. ``source``: a store (anything with
    ``LocalStore.read``)."""
    from .health import scan
    from .health.features import NEEDED_COLUMNS

    columns = list(dict.fromkeys([*NEEDED_COLUMNS, *TIMELINE_COLUMNS]))
    frame = source.read(start=window.start, end=window.end, columns=columns)
    found = scan(frame, pools=pools)
    table = findings_table(found, gpu_indices(frame))
    events = event_timeline(frame, bucket_for(window.span))
    return Bundle({"findings": table, "events": events}, window.start, window.end, version)


def active_critical(table: pd.DataFrame) -> int:
    """Active critical findings in a findings table (the Fleet page's tile)."""
    return int(((table["severity"] == "critical") & table["active"]).sum())


def findings_on_node(table: pd.DataFrame, node: str) -> pd.DataFrame:
    """A node's findings (on it or on its GPUs), for an action whose audit entry lists none."""
    part = table[table["node"] == node]
    return part[["kind", "severity", "gpu_uuid", "confidence", "last_seen"]].rename(
        columns={"last_seen": "last_seen (sample time)"}).reset_index(drop=True)
