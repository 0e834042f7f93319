"""The tables a finished ledger holds, built from the sums :class:`~.ledger.LedgerBuilder` kept
per chunk: its rows (per instance, holder and state), its time series (per bucket and state),
when asked every sample's classification; and the window it reports and the data's quality."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuwarden.fleet.semantics import iso_utc

from .ledger_instances import InstanceBook
from .params import STATES, IdleParams
from .quality import QualityCounts
from .state_codes import NS_PER_SECOND as _S
from .state_codes import UNATTRIBUTED

HOLDER = ("namespace", "pod", "team", "project", "dra_claim")  # dra_claim: the ResourceClaim the pod held it through


def ledger_rows(parts: list[pd.DataFrame], instances: pd.DataFrame, book: InstanceBook, holders: list[tuple[int, ...]],
                energy_price_per_kwh: float) -> pd.DataFrame:
    """The ledger's rows: the sums per (instance, holder, state) of every chunk, named, priced and
    weighted by the instance's share of its GPU, in an order that does not depend on the chunking."""
    raw_columns = ["dur", "dur_act", "dur_watts", "dur_fallback", "dur_mem", "gap", "samples"]
    if parts:
        parts = pd.concat(parts, ignore_index=True)
        parts = parts.groupby(["inst", "holder", "state"], sort=True, as_index=False)[raw_columns].sum()
    else:
        parts = pd.DataFrame({c: pd.Series(dtype="int64" if c in ("inst", "holder", "state") else "float64")
                              for c in ["inst", "holder", "state", *raw_columns]})
    meta = instances.set_index("inst")
    inst = parts["inst"].to_numpy()
    out = pd.DataFrame({c: meta[c].reindex(inst).to_numpy() for c in
                        ("cluster", "node", "gpu_uuid", "mig_instance", "model", "pool", "tier")})
    for position, column in enumerate(HOLDER):
        registry = book.strings[column]
        out[column] = [None if h < 0 or holders[h][position] < 0 else registry.values[holders[h][position]]
                       for h in parts["holder"]]
    out["state"] = pd.Categorical.from_codes(parts["state"].astype(int), categories=list(STATES))
    # False where nobody could see who held the GPU (no pod label, attribution off or failed).
    out["attributed"] = parts["holder"].to_numpy() != UNATTRIBUTED
    share = meta["share"].reindex(inst).to_numpy(dtype=np.float64)
    price = meta["price_per_hour"].reindex(inst).to_numpy(dtype=np.float64)
    owned = np.asarray(book.meta["owned"], dtype=bool)[inst] if len(inst) else np.zeros(0, bool)
    to_hours = 1.0 / (3600.0 * _S)
    hours = parts["dur"].to_numpy() * to_hours
    energy = parts["dur_watts"].to_numpy() * to_hours / 1000.0
    out["gpu_hours"] = share * hours
    out["hours"] = hours
    out["used_hours"] = share * parts["dur_act"].to_numpy() * to_hours
    out["cost"] = share * hours * price + np.where(owned, energy * energy_price_per_kwh, 0.0)
    out["energy_kwh"] = energy
    out["fallback_hours"] = share * parts["dur_fallback"].to_numpy() * to_hours
    out["mem_gib_hours"] = parts["dur_mem"].to_numpy() * to_hours / 2**30
    out["gap_hours"] = share * parts["gap"].to_numpy() * to_hours
    out["samples"] = parts["samples"].to_numpy().astype(np.int64)
    # A deterministic order whatever the chunking (codes follow first appearance).
    order = ["gpu_uuid", "mig_instance", "namespace", "pod", "team", "project", "dra_claim"]
    keys = out[order].astype(object).fillna("").astype(str)
    keys["state"] = parts["state"].to_numpy()
    if not len(out):
        return out
    priority = [*order, "state"]
    ranks = np.lexsort(tuple(keys[c].to_numpy() for c in reversed(priority)))
    return out.iloc[ranks].reset_index(drop=True)


def series_table(series_parts: list[pd.DataFrame], book: InstanceBook, energy_price_per_kwh: float) -> pd.DataFrame:
    """GPU-hours, used hours and cost per (time bucket, state, attributed) from the per-price-class
    sums of every chunk; shares not settled while reading are read from ``book`` now."""
    if not series_parts:
        return pd.DataFrame({"bucket": pd.Series(dtype="datetime64[ns, UTC]"), "state": pd.Series(dtype="object"),
                             "attributed": pd.Series(dtype=bool), "gpu_hours": [], "used_hours": [], "cost": []})
    series = pd.concat(series_parts, ignore_index=True)
    classes = book.classes.values
    klass = series["klass"].to_numpy()
    shares = book.meta["share"]
    share = np.array([c[0] if c[0] >= 0 else shares[int(-1 - c[0])] for c in classes], dtype=np.float64)[klass]
    price = np.array([c[1] for c in classes], dtype=np.float64)[klass]
    owned = np.array([c[2] for c in classes], dtype=bool)[klass]
    to_hours = 1.0 / (3600.0 * _S)
    gpu_hours = share * series["dur"].to_numpy() * to_hours
    energy = series["dur_watts"].to_numpy() * to_hours / 1000.0
    work = pd.DataFrame({
        "bucket_ns": series["bucket_ns"], "state": series["state"], "attributed": ~series["unattributed"].to_numpy(),
        "gpu_hours": gpu_hours,
        "used_hours": share * series["dur_act"].to_numpy() * to_hours,
        "cost": gpu_hours * price + np.where(owned, energy * energy_price_per_kwh, 0.0),
    })
    work = work.groupby(["bucket_ns", "state", "attributed"], sort=True, as_index=False)[["gpu_hours", "used_hours", "cost"]].sum()
    work.insert(0, "bucket", pd.to_datetime(work.pop("bucket_ns"), utc=True))
    work["state"] = pd.Categorical.from_codes(work["state"].astype(int), categories=list(STATES))
    return work


def classified_rows(row_parts: list[pd.DataFrame], instances: pd.DataFrame) -> pd.DataFrame:
    """Per sample (``keep_rows``): its state, duration and activity, indexed like the input rows."""
    rows = pd.concat(row_parts, ignore_index=True) if row_parts else pd.DataFrame(
        {"position": [], "inst": [], "timestamp_ns": [], "state": [], "duration_seconds": [], "activity": [], "sm_measured": []})
    meta = instances.set_index("inst")
    out = pd.DataFrame({
        # An array, not a Series: a Series would be aligned on the row positions of the index.
        "timestamp": pd.DatetimeIndex(pd.to_datetime(rows["timestamp_ns"].to_numpy(np.int64), utc=True)),
        "gpu_uuid": meta["gpu_uuid"].reindex(rows["inst"]).to_numpy(),
        "mig_instance": meta["mig_instance"].reindex(rows["inst"]).to_numpy(),
        "node": meta["node"].reindex(rows["inst"]).to_numpy(),
        "state": pd.Categorical.from_codes(rows["state"].astype(int), categories=list(STATES)),
        "duration_seconds": rows["duration_seconds"].to_numpy(),
        "activity": rows["activity"].to_numpy(),
        "activity_source": np.where(rows["sm_measured"].astype(bool), "sm_active", "gpu_util_fallback"),
    }, index=rows["position"].to_numpy())
    return out


def reported_window(instances: pd.DataFrame, start: pd.Timestamp | None, end: pd.Timestamp | None,
                    step: pd.Timedelta) -> tuple[pd.Timestamp, pd.Timestamp, str | None]:
    """The window the ledger reports, and a note when it is narrower than the one asked for."""
    requested = (start, end)
    if len(instances):
        # The window covered by data: its first sample stands for one step before it, its last
        # ends one step after. A window asked wider (--since 7d over 2 days) is trimmed, so
        # averages over time (GPUs in the inventory, buy vs rent) are not diluted by empty days.
        covered_start = instances["first_seen"].min() - step
        covered_end = instances["last_seen"].max() + step
        if start is None or pd.Timestamp(start) < covered_start:
            start = covered_start if start is not None else instances["first_seen"].min()
        if end is None or pd.Timestamp(end) > covered_end:
            end = covered_end
    else:
        start = start if start is not None else pd.Timestamp(0, tz="UTC")
        end = end if end is not None else start
    start, end = pd.Timestamp(start), pd.Timestamp(end)
    if requested[0] is not None and requested[1] is not None and (start, end) != tuple(pd.Timestamp(t) for t in requested):
        return start, end, (f"window trimmed to the data held: asked {iso_utc(requested[0])} to {iso_utc(requested[1])}, "
                            f"reported {iso_utc(start)} to {iso_utc(end)} ({(end - start).total_seconds() / 3600:.2f} h)")
    return start, end, None


def quality_summary(counts: QualityCounts, rows: pd.DataFrame, instances: pd.DataFrame, start: pd.Timestamp,
                    end: pd.Timestamp, params: IdleParams, step_assumed: bool) -> dict[str, Any]:
    """What the data lacked (dropped, duplicate, out-of-range rows, gaps, unmeasured time, counter
    resets, GPUs that came late or left early): the ledger's ``quality``."""
    step = params.step
    late = instances[instances["first_seen"] > start + params.max_gap]
    early = instances[instances["last_seen"] < end - params.max_gap - step]
    return {
        "rows_read": counts.rows_read,
        "rows_dropped_unidentified": counts.rows_dropped_unidentified,
        "duplicate_rows": counts.duplicate_rows,
        "negative_values": dict(counts.negative_values),
        "out_of_range_values": dict(counts.out_of_range_values),
        "gaps": counts.gaps,
        "gap_gpu_hours": float(rows["gap_hours"].sum()),
        "unmeasured_samples": counts.unmeasured_samples,
        "unmeasured_gpu_hours": float(rows.loc[rows["state"] == "unmeasured", "gpu_hours"].sum()),
        "counter_resets": dict(counts.counter_resets),
        "gpus_appearing_late": sorted(set(late["gpu_uuid"].astype(str))),
        "gpus_leaving_early": sorted(set(early["gpu_uuid"].astype(str))),
        "step_seconds": step.total_seconds(),
        "source": "samples",
        "step_assumed": step_assumed,
    }
