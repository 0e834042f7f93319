"""GPU-time semantics every room shares: one home, so two pages never disagree on the same GPU.

- **MIG share**: how much of its GPU a MIG instance is. A readable profile (``3g.40gb``,
  ``1:3g.40gb``, ``mig-3g.40gb``) counts its compute slices over the GPU's compute slices (the GPU
  catalogue's, from NVIDIA's MIG user guide: 7 on A100 / H100 / H200 / B200, 4 on A30). A profile
  whose slices cannot be read gets what its readable siblings (the other instances of the same GPU at the same time) leave,
  split evenly among the unreadable ones, so a GPU's instances never add up to more than the GPU.
  Only when nothing is known about the siblings does it count as one slice. A whole GPU
  (no profile) is 1.0. :func:`mig_share` is the scalar form, :func:`mig_shares` the one over a
  frame of fleet samples.
- **Counter increase**: a cumulative ``*_total`` counter read as Prometheus' ``increase()`` reads
  it: a drop is a reset (driver reload, GPU reset or replaced), after which the new value counts
  from zero. Nulls (not measured) are skipped, never read as 0. :func:`counter_increments` works on
  sorted numpy arrays, :func:`counter_increase` on a frame.
- **UTC**: every timestamp is tz-aware UTC; a naive one is read as UTC (:func:`to_utc`,
  :func:`utc_times`).
- **Pool** of a node no inventory names: the node name without its trailing ``-<number>``
  (:func:`default_pool`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd

from .semantics_scalar import (
    PROFILE_SLICES,
    default_pool,
    gpu_compute_slices,
    mig_share,
    profile_slices,
    request_gpu_equivalents,
)

__all__ = [
    "counter_increase", "counter_increments", "counter_resets", "default_pool",
    "gpu_compute_slices", "group_first_rows", "iso_utc", "mig_share", "mig_shares",
    "profile_slices", "request_gpu_equivalents", "to_utc", "to_utc_or_none", "utc_times",
]


FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


# -- counter increments over arrays ----------------------------------------------------------------

def counter_increments(values: npt.ArrayLike, first: npt.ArrayLike) -> tuple[FloatArray, BoolArray]:
    """Increments of a cumulative counter per row, and where it was reset.

    Rows are sorted by (group, time); ``first`` is the index of each row's group's first row. A row
    compares with the last non-null value before it in its group; a drop means a reset, after which
    the new value counts from zero. Null rows and each group's first valid row add nothing.
    """
    v = np.asarray(values, dtype=np.float64)
    starts = np.asarray(first, dtype=np.int64)
    n = v.size
    inc = np.zeros(n, dtype=np.float64)
    reset = np.zeros(n, dtype=np.bool_)
    if n == 0:
        return inc, reset
    valid = ~np.isnan(v)
    last_valid = np.maximum.accumulate(np.where(valid, np.arange(n), -1))
    prev = np.empty(n, dtype=np.int64)
    prev[0] = -1
    prev[1:] = last_valid[:-1]
    prev[prev < starts] = -1
    has = valid & (prev >= 0)
    current = v[has]
    delta = current - v[prev[has]]
    dropped = delta < 0
    inc[has] = np.where(dropped, current, delta)
    reset[np.flatnonzero(has)[dropped]] = True
    return inc, reset


def group_first_rows(keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """For rows sorted by group, the index of each row's group's first row."""
    k = np.asarray(keys)
    n = len(k)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.ones(n, dtype=np.bool_)
    starts[1:] = k[1:] != k[:-1]
    return np.maximum.accumulate(np.where(starts, np.arange(n), 0)).astype(np.int64)


# -- MIG share over a frame ------------------------------------------------------------------------


def mig_shares(frame: pd.DataFrame, gpu: str = "gpu_uuid", at: str | None = "timestamp") -> pd.Series:
    """:func:`mig_share` for every row of fleet samples (float64, the frame's index).

    Siblings are the MIG rows with the same ``gpu`` at the same ``at`` (all of the GPU's rows when
    ``at`` is None or absent). The GPU model, where a ``model`` column is present, gives the GPU's
    slice count.
    """
    share = pd.Series(1.0, index=frame.index, dtype="float64")
    if frame.empty or "mig_instance" not in frame.columns:
        return share
    mig = frame["mig_instance"].astype(object)
    is_mig = mig.notna().to_numpy()
    if not is_mig.any():
        return share
    part = frame.loc[is_mig]
    slices = part["mig_instance"].astype(str).str.extract(PROFILE_SLICES, expand=False).astype("float64")
    slices = slices.where(slices > 0)
    if "model" in part.columns:
        models = part["model"].astype(object)
        per_model = {m: gpu_compute_slices(str(m)) for m in models.dropna().unique()}  # one look-up per model
        totals = models.map(per_model).fillna(float(gpu_compute_slices(None))).astype("float64")
    else:
        totals = pd.Series(float(gpu_compute_slices(None)), index=part.index)
    readable = (slices / totals).clip(upper=1.0)
    unknown = readable.isna()
    if unknown.any():
        if gpu in part.columns:
            keys = [part[gpu].astype(object).to_numpy()]
            if at is not None and at in part.columns:
                keys.append(part[at].to_numpy())
            grouped_used = readable.fillna(0.0).groupby(keys, sort=False, dropna=False).transform("sum")
            grouped_unknown = unknown.astype("float64").groupby(keys, sort=False, dropna=False).transform("sum")
            left = (1.0 - grouped_used).clip(lower=0.0) / grouped_unknown
        else:
            left = 1.0 / totals  # nothing known about siblings: one slice
        readable = readable.where(~unknown, left)
    share.loc[is_mig] = readable.to_numpy(dtype="float64")
    return share


# -- counters over a frame -------------------------------------------------------------------------


def _per_time(frame: pd.DataFrame, column: str, by: str) -> pd.DataFrame:
    """One value per (``by``, timestamp), sorted: MIG rows repeat their GPU's counters."""
    part = frame[[by, "timestamp", column]].dropna(subset=[column])
    part = part.assign(**{column: pd.to_numeric(part[column], errors="coerce").astype("float64")})
    part = part.groupby([by, "timestamp"], observed=True, sort=True, as_index=False)[column].max()
    return part


def counter_increase(frame: pd.DataFrame, column: str, by: str = "gpu_uuid") -> pd.Series:
    """Reset-aware increase of a cumulative counter per ``by`` over the frame (float64, indexed by
    ``by``; groups with no measured value are left out)."""
    part = _per_time(frame, column, by)
    if part.empty:
        return pd.Series(dtype="float64", name=column)
    keys = part[by].astype(object).to_numpy()
    inc, _reset = counter_increments(part[column].to_numpy(dtype="float64"), group_first_rows(keys))
    return pd.Series(inc, index=part.index).groupby(keys, sort=True).sum().rename(column)


def counter_resets(frame: pd.DataFrame, columns: Sequence[str], by: str = "gpu_uuid") -> dict[str, int]:
    """How many times each cumulative counter dropped (was reset) within its ``by`` group, in time
    order. One sort for all the columns (rows repeating a value, as MIG siblings do, add none)."""
    ordered = frame.sort_values([by, "timestamp"], kind="stable")
    first = group_first_rows(pd.factorize(ordered[by], use_na_sentinel=True)[0])
    out: dict[str, int] = {}
    for column in columns:
        values = pd.to_numeric(ordered[column], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
        out[column] = int(counter_increments(values, first)[1].sum())
    return out


# -- UTC -------------------------------------------------------------------------------------------


def to_utc(value: object) -> pd.Timestamp:
    """A timestamp in UTC; a naive one is read as UTC. Raises ``ValueError`` on what is not a time."""
    stamp = pd.Timestamp(value)
    if stamp is pd.NaT:
        raise ValueError(f"not a time: {value!r}")
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def to_utc_or_none(value: object) -> pd.Timestamp | None:
    """:func:`to_utc`, passing None through."""
    return None if value is None else to_utc(value)


def utc_times(values: object) -> pd.Series:
    """A column of times as tz-aware UTC (naive read as UTC; what is not a time becomes NaT)."""
    series = values if isinstance(values, pd.Series) else pd.Series(values)
    if isinstance(series.dtype, pd.DatetimeTZDtype):
        return series.dt.tz_convert("UTC")
    return pd.to_datetime(series, utc=True, errors="coerce", format="ISO8601" if series.dtype == object else None)


def iso_utc(value: object, fraction: bool = False) -> str:
    """``2026-01-02T03:04:05Z`` (with microseconds when ``fraction``)."""
    return str(to_utc(value).strftime("%Y-%m-%dT%H:%M:%S.%fZ" if fraction else "%Y-%m-%dT%H:%M:%SZ"))
