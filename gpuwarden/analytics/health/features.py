"""Per-GPU health time series from fleet samples: one row per GPU per timestamp, sorted by GPU then
time, with counter increments (reset-safe), throttle flags, trailing-window sums and peer ratios.

Everything here is causal: the value at time ``t`` uses samples at or before ``t`` only, so the
first time a detector fires on these features is the time a scan running live would have fired.

Bad input is expected and absorbed:

- a missing column (older GPUs, a partial file) reads as "not measured" (NaN), never as 0;
- a counter that goes down was reset (driver reload, GPU reset or replacement): the drop is not an
  event; what the counter shows after the reset counts from zero (Prometheus ``increase`` rules);
- a GPU's first sample in the window has no previous value, so it contributes no increment
  (a counter that was already high when the window opened is history, not a new event);
- a gap (a GPU that vanished and came back) compares with the last value seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping

import numpy as np
import pandas as pd

from gpuwarden.fleet import THROTTLE_REASONS, XID_COLUMN_NAMES
from gpuwarden.fleet.sampling import sampling_step_seconds
from gpuwarden.fleet.semantics import counter_increments, default_pool, group_first_rows

from .peers import DeviceIds, operating_active, power_band, temperature_residual

NVLINK_COUNTERS: tuple[str, ...] = (
    "nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total", "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
)
COUNTERS: tuple[str, ...] = (
    "ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "remapped_rows_correctable_total",
    "remapped_rows_uncorrectable_total", "pcie_replay_total", *NVLINK_COUNTERS, *XID_COLUMN_NAMES,
)
GAUGES: tuple[str, ...] = ("remapped_rows_pending", "remapped_rows_failure", "recovery_action")
ACTIVITY: tuple[str, ...] = (
    "gpu_util_ratio", "sm_active_ratio", "tensor_active_ratio", "dram_active_ratio", "power_watts",
    "temperature_celsius", "sm_clock_mhz",
)
IDENTITY: tuple[str, ...] = ("timestamp", "node", "gpu_uuid", "model", "mig_instance", "pod")
NEEDED_COLUMNS: tuple[str, ...] = IDENTITY + ACTIVITY + ("throttle_reasons_bitmask",) + COUNTERS + GAUGES

THERMAL_BITS = THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_thermal_slowdown"]
HW_THERMAL_BIT = THROTTLE_REASONS["hw_thermal_slowdown"]
POWER_BRAKE_BIT = THROTTLE_REASONS["hw_power_brake_slowdown"]
HW_SLOWDOWN_BIT = THROTTLE_REASONS["hw_slowdown"]

_NS_PER_S = 1_000_000_000


@dataclass
class GpuSeries:
    """Per-GPU rows sorted by (gpu, time), as numpy columns (``cols``) plus labels.

    ``gpu``/``node``/``model``/``pool`` are integer codes into ``gpus``/``nodes``/``models``/``pools``;
    ``key`` is a sortable int64 of (gpu, time) used for trailing windows; ``first`` is the index of
    each row's GPU's first row; ``step_s`` the typical sampling interval.
    """

    cols: dict[str, np.ndarray]
    gpus: np.ndarray
    nodes: np.ndarray
    models: np.ndarray
    pools: np.ndarray
    key: np.ndarray
    first: np.ndarray
    step_s: float

    def __len__(self) -> int:
        return int(self.key.size)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name]

    def window_start(self, seconds: float, floor: np.ndarray | None = None) -> np.ndarray:
        """Index of the first row of each row's trailing window (never before its GPU's first row,
        nor before ``floor`` when given, e.g. the last counter reset)."""
        cache = self.__dict__.setdefault("_starts", {})
        start = cache.get(seconds)
        if start is None:  # the same few window lengths come back many times
            start = np.searchsorted(self.key, self.key - int(seconds * _NS_PER_S), side="right")
            start = cache[seconds] = np.maximum(start, self.first)
        return start if floor is None else np.maximum(start, floor)

    def window_sum(self, values: np.ndarray, seconds: float, floor: np.ndarray | None = None) -> np.ndarray:
        """Sum of ``values`` over the trailing ``seconds`` (the row itself included), per GPU."""
        values = np.nan_to_num(np.asarray(values, dtype=float))
        cumulative = np.concatenate([[0.0], np.cumsum(values)])
        return cumulative[1:] - cumulative[self.window_start(seconds, floor)]

    def window_hours(self, seconds: float, floor: np.ndarray | None = None) -> np.ndarray:
        """How much time (hours) each row's trailing window really covers (one step at least)."""
        start = self.window_start(seconds, floor)
        ts = self.cols["ts"]
        return ((ts - ts[start]) / _NS_PER_S + self.step_s) / 3600.0

    def last_reset(self) -> np.ndarray:
        """Index of the row where each row's GPU last had a counter reset (its first row if none)."""
        n = len(self)
        marks = np.where(self.cols["counter_reset"], np.arange(n), 0)
        return np.maximum(np.maximum.accumulate(marks) if n else marks, self.first)

    def window_count(self, mask: np.ndarray, seconds: float) -> np.ndarray:
        return self.window_sum(np.asarray(mask, dtype=float), seconds)

    def window_mean(self, values: np.ndarray, seconds: float) -> tuple[np.ndarray, np.ndarray]:
        """Trailing mean of the non-null ``values`` and how many there were."""
        values = np.asarray(values, dtype=float)
        valid = ~np.isnan(values)
        count = self.window_count(valid, seconds)
        total = self.window_sum(np.where(valid, values, 0.0), seconds)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1), np.nan), count

    def lag_sum(self, values: np.ndarray, seconds: float, lag_seconds: float) -> np.ndarray:
        """Sum over the window ``(t - lag - seconds, t - lag]``."""
        return self.window_sum(values, seconds + lag_seconds) - self.window_sum(values, lag_seconds)


def _codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes (-1 for null) and labels of a string-ish column, categorical or not."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy().astype(np.int64), np.asarray(column.cat.categories.astype(str))
    codes, labels = pd.factorize(column, sort=False)
    return codes.astype(np.int64), np.asarray(pd.Index(labels).astype(str))


def _mig_profiles(column: pd.Series) -> np.ndarray:
    """MIG profile code per row (0: a whole GPU): ``'1:3g.40gb'`` and ``'2:3g.40gb'`` share one."""
    codes, labels = _codes(column)
    profiles = pd.Series(labels, dtype=object).str.split(":").str[-1]
    profile_codes = pd.factorize(profiles)[0] + 1
    return np.where(codes >= 0, profile_codes[np.maximum(codes, 0)] if len(labels) else 0, 0).astype(np.int64)


def _reorder(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``values[order]``, without the gather for a column that holds one value (unmeasured, or a
    counter that never moved): most XID columns, on most days."""
    if values.size and (values == values[0]).all() if not np.isnan(values[0]) else np.isnan(values).all():
        return _constant(float(values[0]), order.size)
    return values[order]


def _constant(value: float, size: int) -> np.ndarray:
    """A read-only array of one value, shared (allocating fresh memory is a real cost at 10 M rows)."""
    key = (np.nan if np.isnan(value) else value, size)
    cached = _CONSTANTS.get(key) if not np.isnan(value) else _CONSTANTS.get(("nan", size))
    if cached is None:
        cached = np.full(size, value)
        cached.flags.writeable = False
        if len(_CONSTANTS) > 64:
            _CONSTANTS.clear()
        _CONSTANTS[("nan", size) if np.isnan(value) else key] = cached
    return cached


_CONSTANTS: dict[tuple, np.ndarray] = {}


def _floats(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame.columns:
        return _constant(np.nan, len(frame))
    column = frame[name]
    if column.dtype.kind in "iub" and not isinstance(column.dtype, np.dtype) and column.isna().all():
        return _constant(np.nan, len(frame))  # a nullable column nobody measured
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "fiu":
        return column.to_numpy(dtype=float)
    if column.dtype.kind in "fiub":  # nullable extension ints: pd.NA -> NaN (never an error, never 0)
        return column.to_numpy(dtype=float, na_value=np.nan)
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def gpu_series(frame: pd.DataFrame, pools: Mapping[str, str] | None = None) -> GpuSeries:
    """Collapse fleet samples to one row per GPU and timestamp and add the health features."""
    for name in ("timestamp", "gpu_uuid", "node"):
        if name not in frame.columns:
            raise ValueError(f"fleet samples need the {name} column")
    keep = frame["timestamp"].notna().to_numpy() & frame["gpu_uuid"].notna().to_numpy() & frame["node"].notna().to_numpy()
    if not keep.all():
        frame = frame[keep]
    stamps = pd.to_datetime(frame["timestamp"], utc=True)
    ts = stamps.dt.as_unit("ns").astype("int64").to_numpy()
    gpu, gpus = _codes(frame["gpu_uuid"])
    node, nodes = _codes(frame["node"])
    if "model" in frame.columns:
        model, models = _codes(frame["model"].astype(object).where(frame["model"].notna(), "unknown"))
    else:
        model, models = np.zeros(len(frame), dtype=np.int64), np.array(["unknown"])
    pool_map = dict(pools) if pools is not None else {}
    pool_labels = np.array([pool_map.get(n, default_pool(n)) for n in nodes], dtype=object)
    pools_unique, node_pool = np.unique(pool_labels, return_inverse=True) if len(nodes) else (np.array([]), np.array([], dtype=np.int64))
    pool = node_pool[node] if len(nodes) else np.zeros(0, dtype=np.int64)
    mig = frame["mig_instance"].notna().to_numpy() if "mig_instance" in frame.columns else np.zeros(len(frame), dtype=bool)
    profile = _mig_profiles(frame["mig_instance"]) if mig.any() else np.zeros(len(frame), dtype=np.int64)
    pod = _codes(frame["pod"])[0] if "pod" in frame.columns else np.full(len(frame), -1, dtype=np.int64)
    device = {name: _floats(frame, name) for name in ACTIVITY + COUNTERS + GAUGES}
    if "throttle_reasons_bitmask" in frame.columns:
        mask = pd.to_numeric(frame["throttle_reasons_bitmask"], errors="coerce")
        measured = mask.notna().to_numpy()
        bits = mask.fillna(0).to_numpy(dtype=np.int64)
    else:
        measured, bits = np.zeros(len(frame), dtype=bool), np.zeros(len(frame), dtype=np.int64)
    device["thermal"] = (measured & ((bits & HW_THERMAL_BIT) != 0)).astype(float)
    device["power_brake"] = (measured & ((bits & POWER_BRAKE_BIT) != 0)).astype(float)
    device["hw_slowdown"] = (measured & ((bits & HW_SLOWDOWN_BIT) != 0) & ((bits & POWER_BRAKE_BIT) == 0)).astype(float)
    device["throttle_measured"] = measured.astype(float)
    device["allocated"] = (pod >= 0).astype(float)
    # Peer comparison happens per device (a MIG instance against MIG instances in the same state),
    # before MIG instances are collapsed into their GPU.
    device["active"] = operating_active(device["gpu_util_ratio"], device["sm_active_ratio"]).astype(float)
    band = power_band(device["power_watts"], model, profile)
    ids = DeviceIds(ts, model, pool, pod, profile, device["gpu_util_ratio"], device["tensor_active_ratio"],
                     device["dram_active_ratio"], band)
    for name, column in (("clock", "sm_clock_mhz"), ("power", "power_watts")):
        reference = ids.peer_median(device[column])
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.log(device[column] / reference)
        device[f"log_{name}_ratio"] = np.where(np.isfinite(ratio), ratio, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        pool_ratio = np.log(device["sm_clock_mhz"] / ids.pool_median(device["sm_clock_mhz"]))
    device["log_clock_vs_pool"] = np.where(np.isfinite(pool_ratio), pool_ratio, np.nan)
    device["temp_excess"] = device["temperature_celsius"] - ids.peer_median(device["temperature_celsius"])
    device["temp_residual"], device["node_temp_excess"] = temperature_residual(ts, model, pool, node, device["temperature_celsius"],
                                                   device["power_watts"], profile)
    # Sort by (gpu, time) and collapse rows that share both (the MIG instances of one GPU).
    order = np.lexsort((ts, gpu))
    ts, gpu, node, model, pool = ts[order], gpu[order], node[order], model[order], pool[order]
    device = {name: _reorder(values, order) for name, values in device.items()}
    new_row = np.r_[True, (gpu[1:] != gpu[:-1]) | (ts[1:] != ts[:-1])] if ts.size else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(new_row)
    cols: dict[str, np.ndarray] = {}
    if starts.size == ts.size:
        cols.update(device)
    else:
        for name, values in device.items():
            cols[name] = _segment_reduce(values, starts, _REDUCE.get(name, "max"))
    ts, gpu, node, model, pool = ts[starts], gpu[starts], node[starts], model[starts], pool[starts]
    cols.update(ts=ts, gpu=gpu, node=node, model=model, pool=pool)
    first = group_first_rows(gpu)
    base = int(ts.min()) if ts.size else 0
    span = int(ts.max()) - base + 1 if ts.size else 1
    # GPUs sit further apart in the key than the window spans plus any trailing window (~11 days).
    key = gpu.astype(np.int64) * np.int64(span + 10**15) + (ts - base)
    step_s = sampling_step_seconds(ts, gpu)  # rows are sorted by (gpu, time): no sort
    series = GpuSeries(cols, gpus, nodes, models, np.asarray(pools_unique, dtype=str), key, first, step_s)
    _add_increments(series)
    return series


_REDUCE = {
    "gpu_util_ratio": "mean", "sm_active_ratio": "mean", "tensor_active_ratio": "mean", "dram_active_ratio": "mean",
    "sm_clock_mhz": "mean", "power_watts": "sum", "log_clock_ratio": "mean", "log_power_ratio": "mean",
    "allocated": "max", "active": "max", "temp_residual": "mean", "node_temp_excess": "mean",
    "log_clock_vs_pool": "mean",
}


def _segment_reduce(values: np.ndarray, starts: np.ndarray, how: str) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    valid = ~np.isnan(values)
    count = np.add.reduceat(valid.astype(float), starts)
    if how == "max":
        out = np.fmax.reduceat(values, starts)
        return out
    total = np.add.reduceat(np.where(valid, values, 0.0), starts)
    if how == "sum":
        return np.where(count > 0, total, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _add_increments(series: GpuSeries) -> None:
    cols = series.cols
    any_reset = np.zeros(len(series), dtype=bool)
    for name in COUNTERS:
        values = cols[name]
        if values.size == 0 or (values == values[0]).all() or np.isnan(values).all():
            cols[f"inc_{name}"] = _constant(0.0, values.size)  # never changed or never measured: no events
            continue
        inc, reset = counter_increments(values, series.first)
        cols[f"inc_{name}"] = inc
        any_reset |= reset
    cols["counter_reset"] = any_reset
    ts = cols["ts"]
    dt = np.full(ts.size, series.step_s)
    if ts.size > 1:
        dt[1:] = (ts[1:] - ts[:-1]) / _NS_PER_S
        dt[series.first == np.arange(ts.size)] = series.step_s
    cols["dt_s"] = np.clip(dt, 1.0, None)
