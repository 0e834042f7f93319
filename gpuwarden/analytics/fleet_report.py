"""The Fleet overview and GPU detail pages' numbers: small pure functions, fleet samples in, small
frames out, and :func:`fleet_bundle`, everything the Fleet page draws for one window in one
:class:`~gpuwarden.analytics.report_bundle.Bundle`.

Nothing here imports Streamlit, so every number the Fleet page shows can be unit tested on a frame
built by hand. Inputs are fleet samples (``gpuwarden.fleet.samples``) holding at least the columns
each function names; :data:`FLEET_COLUMNS` is all the page reads.

Definitions used throughout:

- **now** is the newest sample in the data, not the wall clock (the demo's simulated clock runs
  apart from it). The *snapshot* is each GPU's (or MIG instance's) last row that is at most
  ``stale_after`` older than the newest sample, so nodes scraped a few seconds apart still count.
- **allocated** means the row's ``pod`` is set. A whole GPU counts 1; a MIG instance counts its
  share of the GPU (``'1:3g.40gb'`` -> 3/7 on an H100), by the rule every room shares
  (:mod:`gpuwarden.fleet.semantics`).
- **XID events** in a window are the increase of each ``xid_*_total`` counter per GPU, as
  Prometheus' ``increase()`` counts it (:func:`gpuwarden.fleet.semantics.counter_increase`): a drop
  is a counter reset (driver reload, GPU replaced), so the drop is never counted and the value after
  it is taken as events since the reset.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from gpuwarden.fleet import XID_COLUMN_NAMES
from gpuwarden.fleet.semantics import counter_increase, mig_shares

from .report_bundle import Bundle
from .windows import Window, bucket_for

FLEET_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "node",
    "gpu_uuid",
    "model",
    "mig_instance",
    "pod",
    "team",
    "gpu_util_ratio",
    "sm_active_ratio",
    "temperature_celsius",
    *XID_COLUMN_NAMES,
)

STALE_AFTER = pd.Timedelta(minutes=5)
NO_TEAM = "(no team)"



def gpu_share(frame: pd.DataFrame) -> pd.Series:
    """How much of a GPU each row is: 1.0 for a whole GPU, a MIG instance by the one rule of
    :func:`gpuwarden.fleet.semantics.mig_shares` (compute slices over its GPU's)."""
    return mig_shares(frame)


def _instance_key(frame: pd.DataFrame) -> pd.Series:
    key = frame["gpu_uuid"].astype(str)
    if "mig_instance" in frame.columns:
        mig = frame["mig_instance"].astype(object)
        key = key.where(mig.isna(), key + "/" + mig.astype(str))
    return key


def latest_snapshot(frame: pd.DataFrame, stale_after: pd.Timedelta = STALE_AFTER) -> pd.DataFrame:
    """Each GPU's (or MIG instance's) last row, if it is at most ``stale_after`` older than the
    newest sample. Empty in, empty out."""
    if frame.empty:
        return frame.iloc[0:0]
    newest = frame["timestamp"].max()
    recent = frame[frame["timestamp"] >= newest - stale_after]
    keys = _instance_key(recent)
    last = recent.assign(_key=keys.to_numpy()).sort_values("timestamp", kind="stable")
    last = last.drop_duplicates("_key", keep="last").drop(columns="_key")
    return last.sort_values(["node", "gpu_uuid"] if "node" in last.columns else ["gpu_uuid"], kind="stable")


def allocated_share(snapshot: pd.DataFrame) -> pd.Series:
    """Per row: the GPU share it holds if allocated (``pod`` set), else 0."""
    holds = snapshot["pod"].notna().to_numpy()
    return gpu_share(snapshot).where(holds, 0.0)


@dataclass(frozen=True)
class Headline:
    gpus: int
    nodes: int
    allocated_gpus: float
    mean_util: float | None
    mean_sm_active: float | None
    sm_measured_gpus: int
    newest: pd.Timestamp | None
    oldest: pd.Timestamp | None


def _mean(series: pd.Series) -> float | None:
    value = series.astype("float64").mean()
    return None if pd.isna(value) else float(value)


def headline(frame: pd.DataFrame, snapshot: pd.DataFrame | None = None) -> Headline:
    """GPUs and nodes now, GPUs allocated now, and the window's mean NVML utilisation and mean SM
    activity (over the samples that measure it; ``None`` when none do)."""
    if snapshot is None:
        snapshot = latest_snapshot(frame)
    if frame.empty:
        return Headline(0, 0, 0.0, None, None, 0, None, None)
    measured = frame.loc[frame["sm_active_ratio"].notna(), "gpu_uuid"]
    return Headline(
        gpus=int(snapshot["gpu_uuid"].nunique()),
        nodes=int(snapshot["node"].nunique()),
        allocated_gpus=float(allocated_share(snapshot).sum()),
        mean_util=_mean(frame["gpu_util_ratio"]),
        mean_sm_active=_mean(frame["sm_active_ratio"]),
        sm_measured_gpus=int(measured.nunique()),
        newest=frame["timestamp"].max(),
        oldest=frame["timestamp"].min(),
    )


def utilisation_over_time(frame: pd.DataFrame, bucket: str = "10min") -> pd.DataFrame:
    """Fleet mean of ``gpu_util_ratio`` and ``sm_active_ratio`` per time bucket (index: bucket
    start, UTC). NaN is skipped, so SM activity is the mean over the GPUs that measure it and is NaN
    in a bucket where none do."""
    columns = ["gpu_util_ratio", "sm_active_ratio"]
    if frame.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns}, index=pd.DatetimeIndex([], tz="UTC", name="timestamp"))
    buckets = frame["timestamp"].dt.floor(bucket).rename("timestamp")
    return frame[columns].astype("float64").groupby(buckets, sort=True).mean()


def allocation_by_team(snapshot: pd.DataFrame) -> pd.DataFrame:
    """GPUs allocated now per team (MIG instances by share), largest first. Pods without a team
    are counted under ``(no team)``. Columns: team, gpus."""
    held = snapshot.assign(gpus=allocated_share(snapshot).to_numpy())
    held = held[snapshot["pod"].notna().to_numpy()]
    if held.empty:
        return pd.DataFrame({"team": pd.Series(dtype=object), "gpus": pd.Series(dtype="float64")})
    team = held["team"].astype(object).where(held["team"].notna(), NO_TEAM)
    out = held.groupby(team.to_numpy())["gpus"].sum().rename_axis("team").reset_index()
    return out.sort_values(["gpus", "team"], ascending=[False, True], ignore_index=True)


def allocation_by_model(snapshot: pd.DataFrame) -> pd.DataFrame:
    """Per GPU model now: GPUs, GPUs allocated (MIG by share), GPUs free. Largest fleet first."""
    if snapshot.empty:
        return pd.DataFrame({"model": pd.Series(dtype=object), "gpus": pd.Series(dtype="int64"),
                             "allocated": pd.Series(dtype="float64"), "free": pd.Series(dtype="float64")})
    work = pd.DataFrame({
        "model": snapshot["model"].astype(object).to_numpy(),
        "gpu_uuid": snapshot["gpu_uuid"].astype(object).to_numpy(),
        "allocated": allocated_share(snapshot).to_numpy(),
    })
    out = work.groupby("model").agg(gpus=("gpu_uuid", "nunique"), allocated=("allocated", "sum")).reset_index()
    out["free"] = (out["gpus"] - out["allocated"]).clip(lower=0.0)
    return out.sort_values(["gpus", "model"], ascending=[False, True], ignore_index=True)


def xid_events(frame: pd.DataFrame, columns: tuple[str, ...] | list[str] = XID_COLUMN_NAMES) -> pd.DataFrame:
    """XID events in the frame per GPU: one column per ``xid_*_total`` present plus ``total``
    (index: gpu_uuid). GPUs without events are included with zeros."""
    present = [c for c in columns if c in frame.columns]
    gpus = pd.Index(frame["gpu_uuid"].astype(object).unique(), name="gpu_uuid")
    out = pd.DataFrame(0, index=gpus, columns=present, dtype="int64")
    if present and not frame.empty:
        # Almost every counter of almost every GPU is flat: only walk the ones that moved.
        grouped = frame.groupby("gpu_uuid", observed=True)[present]
        moved = (grouped.max() > grouped.min()).fillna(False).astype(bool)
        moved.index = moved.index.astype(object)
        moving_columns = [c for c in present if moved[c].any()]
        if moving_columns:
            moving_gpus = moved.index[moved[moving_columns].any(axis=1)]
            part = frame.loc[frame["gpu_uuid"].isin(moving_gpus), ["gpu_uuid", "timestamp", *moving_columns]]
            for column in moving_columns:
                increase = counter_increase(part, column)
                increase.index = increase.index.astype(object)
                out[column] = increase.reindex(gpus).fillna(0.0).round().astype("int64")
    out["total"] = out[present].sum(axis=1).astype("int64")
    return out


def node_table(frame: pd.DataFrame, snapshot: pd.DataFrame | None = None, xids: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per node seen in the window: node, model(s), GPUs, allocated now (MIG by share),
    mean NVML utilisation, max temperature, XID events in the window. ``snapshot`` and ``xids``
    (:func:`latest_snapshot`, :func:`xid_events`) are computed when not given."""
    columns = ["node", "model", "gpus", "allocated", "mean_util", "max_temperature_celsius", "xid_events"]
    if frame.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    if snapshot is None:
        snapshot = latest_snapshot(frame)
    grouped = frame.groupby("node", observed=True, sort=True)
    models = frame[["node", "model"]].drop_duplicates().astype(object)
    out = pd.DataFrame({
        "model": models.groupby("node")["model"].agg(lambda names: ", ".join(sorted(names))),
        "gpus": grouped["gpu_uuid"].nunique(),
        "mean_util": grouped["gpu_util_ratio"].mean().astype("float64"),
        "max_temperature_celsius": grouped["temperature_celsius"].max().astype("float64"),
    })
    out.index = out.index.astype(object)
    held = pd.Series(allocated_share(snapshot).to_numpy(), index=snapshot["node"].astype(object).to_numpy())
    out["allocated"] = held.groupby(level=0).sum().reindex(out.index).fillna(0.0)
    totals = (xid_events(frame) if xids is None else xids)["total"]
    gpu_node = frame[["gpu_uuid", "node"]].drop_duplicates("gpu_uuid", keep="last").astype(object).set_index("gpu_uuid")["node"]
    per_node = totals.groupby(gpu_node.reindex(totals.index).to_numpy()).sum()
    out["xid_events"] = per_node.reindex(out.index).fillna(0).astype("int64")
    return out.rename_axis("node").reset_index()[columns]


def format_gpus(value: float) -> str:
    """``3`` for a whole number of GPUs, ``2.4`` when MIG shares make it fractional."""
    return f"{value:.0f}" if np.isclose(value, round(value)) else f"{value:.1f}"


def reporting(frame: pd.DataFrame, snapshot: pd.DataFrame) -> tuple[int, int]:
    """(GPUs in the latest snapshot, GPUs seen anywhere in the window): "N of M reporting"."""
    if frame.empty:
        return 0, 0
    return int(snapshot["gpu_uuid"].nunique()), int(frame["gpu_uuid"].nunique())


def activity_grid(frame: pd.DataFrame, snapshot: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (node, GPU index): mean SM activity over the window (NVML utilisation where SM
    activity is not measured, named in ``source``), whether the GPU reports now, its UUID."""
    columns = ["node", "gpu_index", "gpu_uuid", "activity", "source", "reporting"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    grouped = frame.groupby("gpu_uuid", observed=True)
    out = pd.DataFrame({
        "node": grouped["node"].last().astype(object),
        "gpu_index": grouped["gpu_index"].last() if "gpu_index" in frame.columns else 0,
        "sm": grouped["sm_active_ratio"].mean().astype("float64"),
        "util": grouped["gpu_util_ratio"].mean().astype("float64"),
    })
    out.index = out.index.astype(object)
    out["activity"] = out["sm"].where(out["sm"].notna(), out["util"])
    out["source"] = np.where(out["sm"].notna(), "SM activity", "NVML utilisation")
    live = set((latest_snapshot(frame) if snapshot is None else snapshot)["gpu_uuid"].astype(object))
    out["reporting"] = [uuid in live for uuid in out.index]
    out = out.rename_axis("gpu_uuid").reset_index()
    out["gpu_index"] = pd.to_numeric(out["gpu_index"], errors="coerce").fillna(-1).astype(int)
    return out[columns].sort_values(["node", "gpu_index"], ignore_index=True)


GPU_DETAIL_COLUMNS: tuple[str, ...] = (
    "timestamp", "node", "gpu_uuid", "gpu_index", "model", "mig_instance", "pod", "dra_claim", "team",
    "gpu_util_ratio", "sm_active_ratio", "tensor_active_ratio", "dram_active_ratio",
    "mem_used_bytes", "mem_total_bytes", "power_watts", "temperature_celsius", "sm_clock_mhz",
)


HISTORY_GROUPS: dict[str, dict[str, str]] = {  # chart -> {history column: line name}
    "Memory (GiB)": {"mem_used_gib": "used GiB", "mem_total_gib": "total GiB"},
    "Power (W)": {"power_watts": "power W"},
    "Temperature (°C)": {"temperature_celsius": "temperature °C"},
    "SM clock (MHz)": {"sm_clock_mhz": "SM clock MHz"},
    "Activity (%)": {"gpu_util_pct": "NVML utilisation %", "sm_active_pct": "SM active %",
                     "tensor_active_pct": "Tensor active %", "dram_active_pct": "DRAM active %"},
}
_MEANS = ("power_watts", "temperature_celsius", "sm_clock_mhz", "gpu_util_ratio", "sm_active_ratio",
          "tensor_active_ratio", "dram_active_ratio")


def bucketed_history(frame: pd.DataFrame, bucket: str) -> pd.DataFrame:
    """Every GPU's history per chart bucket: columns gpu_uuid, time (bucket start, naive UTC) and
    the :data:`HISTORY_GROUPS` columns. A GPU's MIG rows at one timestamp are one reading of it:
    memory summed (total: the GPU's), the rest averaged. Unmeasured stays NaN, never 0."""
    columns = ["gpu_uuid", "time", *(c for group in HISTORY_GROUPS.values() for c in group)]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    work = frame[["gpu_uuid", "timestamp", "mem_used_bytes", "mem_total_bytes", *_MEANS]].copy()
    work["gpu_uuid"] = work["gpu_uuid"].astype(object)
    for column in ("mem_used_bytes", "mem_total_bytes", *_MEANS):
        work[column] = work[column].astype("float64")
    mig = frame["mig_instance"].notna().to_numpy() if "mig_instance" in frame.columns else None
    if mig is not None and mig.any():  # one reading per GPU and time (only MIG rows need it)
        grouped = work[mig].groupby(["gpu_uuid", "timestamp"], sort=False)
        readings = grouped[list(_MEANS)].mean()
        readings["mem_used_bytes"] = grouped["mem_used_bytes"].sum(min_count=1)
        readings["mem_total_bytes"] = grouped["mem_total_bytes"].max()
        work = pd.concat([work[~mig], readings.reset_index()[work.columns]], ignore_index=True)
    work["time"] = pd.DatetimeIndex(work["timestamp"]).floor(bucket).tz_convert(None)
    out = work.groupby(["gpu_uuid", "time"], sort=True)[["mem_used_bytes", "mem_total_bytes", *_MEANS]].mean()
    out = pd.DataFrame({
        "mem_used_gib": out["mem_used_bytes"] / 2**30, "mem_total_gib": out["mem_total_bytes"] / 2**30,
        "power_watts": out["power_watts"], "temperature_celsius": out["temperature_celsius"],
        "sm_clock_mhz": out["sm_clock_mhz"], "gpu_util_pct": out["gpu_util_ratio"] * 100,
        "sm_active_pct": out["sm_active_ratio"] * 100, "tensor_active_pct": out["tensor_active_ratio"] * 100,
        "dram_active_pct": out["dram_active_ratio"] * 100,
    })
    return out.reset_index()[columns]


def history_groups(history: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """One GPU's rows of :func:`bucketed_history` as chart groups (index: bucket start); metrics
    nobody measured are dropped, not drawn as 0."""
    table = history.set_index("time").sort_index()
    groups = {}
    for name, lines in HISTORY_GROUPS.items():
        part = table[list(lines)].rename(columns=lines).dropna(axis=1, how="all")
        if not part.empty and len(part.columns):
            groups[name] = part
    return groups


def gpu_series(frame: pd.DataFrame, bucket: str) -> dict[str, pd.DataFrame]:
    """One GPU's history in chart-ready groups: memory (GiB), power (W), temperature (°C), SM
    clock (MHz) and activity (%) (see :func:`bucketed_history`)."""
    if frame.empty:
        return {}
    return history_groups(bucketed_history(frame, bucket))


def _held(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The distinct (``keys``, team, pod, dra_claim) of the rows a pod held, as text (no claim: None)."""
    claims = frame["dra_claim"] if "dra_claim" in frame.columns else pd.Series(None, index=frame.index, dtype=object)
    rows = frame.assign(dra_claim=claims).dropna(subset=["pod"])
    held = rows[[*keys, "team", "pod"]].astype(str).assign(
        dra_claim=rows["dra_claim"].astype(object).where(rows["dra_claim"].notna(), None).to_numpy())
    return held.drop_duplicates()


def holders_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Who held each GPU in the frame, and its model: gpu_uuid, model, team, pod, dra_claim (one row per
    pod and the DRA claim it held the GPU through, None without one; a GPU nobody held has one row with no pod)."""
    models = frame[["gpu_uuid", "model"]].dropna().astype(str).drop_duplicates("gpu_uuid", keep="last")
    return models.merge(_held(frame, ["gpu_uuid"]), on="gpu_uuid", how="left")


def gpu_histories_bundle(source: SamplesReader, window: Window, version: float = 0.0) -> Bundle:
    """Every GPU's chart history and holders over ``window`` (what the GPU detail page draws for
    whichever GPU is chosen), from one read."""
    frame = source.read(start=window.start, end=window.end, columns=list(GPU_DETAIL_COLUMNS))
    return Bundle({"history": bucketed_history(frame, bucket_for(window.span)), "holders": holders_table(frame)},
                  window.start, window.end, version)


class SamplesReader(Protocol):
    """What the bundles read: a store (``LocalStore``) or anything else with its ``read``."""

    def read(self, start: Any = None, end: Any = None, columns: Sequence[str] | None = None,
             nodes: Iterable[str] | None = None) -> pd.DataFrame: ...


def fleet_bundle(source: SamplesReader, window: Window, version: float = 0.0) -> Bundle:
    """Everything the Fleet page draws over ``window``, from one read of the columns it needs:
    headline figures, "N of M reporting", the node x GPU activity grid (also the GPU list of the
    GPU detail page), utilisation over time, allocation by team and model, the node table and the
    GPUs with XID events. Small frames only: the samples themselves are not kept."""
    frame = source.read(start=window.start, end=window.end, columns=[*FLEET_COLUMNS, "gpu_index"])
    snapshot = latest_snapshot(frame)
    xids = xid_events(frame)
    head = headline(frame, snapshot)
    values: dict[str, Any] = {
        "headline": {"gpus": head.gpus, "nodes": head.nodes, "allocated_gpus": head.allocated_gpus,
                     "mean_util": head.mean_util, "mean_sm_active": head.mean_sm_active,
                     "sm_measured_gpus": head.sm_measured_gpus},
        "reporting": list(reporting(frame, snapshot)),
        "grid": activity_grid(frame, snapshot),
        "series": utilisation_over_time(frame, bucket_for(window.span)),
        "teams": allocation_by_team(snapshot),
        "models": allocation_by_model(snapshot),
        "nodes": node_table(frame, snapshot, xids),
        "xids": xids[xids["total"] > 0],
    }
    return Bundle(values, window.start, window.end, version)


def gpu_history(source: SamplesReader, window: Window, node: str, uuid: str) -> dict[str, Any]:
    """One GPU's chart groups (:func:`gpu_series`), model and holders (team, pod) over the window;
    reads only its node's rows."""
    frame = source.read(start=window.start, end=window.end, columns=list(GPU_DETAIL_COLUMNS), nodes=[node])
    frame = frame[frame["gpu_uuid"].astype(str) == uuid]
    model = frame["model"].dropna().astype(str).iloc[-1] if frame["model"].notna().any() else "unknown model"
    return {"groups": gpu_series(frame, bucket_for(window.span)), "model": model, "holders": _held(frame, [])}
