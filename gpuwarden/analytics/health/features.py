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
    ids = _DeviceIds(ts, model, pool, pod, profile, device["gpu_util_ratio"], device["tensor_active_ratio"],
                     device["dram_active_ratio"], band)
    for name, column in (("clock", "sm_clock_mhz"), ("power", "power_watts")):
        reference = ids.peer_median(device[column])
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.log(device[column] / reference)
        device[f"log_{name}_ratio"] = np.where(np.isfinite(ratio), ratio, np.nan)
    device["temp_excess"] = device["temperature_celsius"] - ids.peer_median(device["temperature_celsius"])
    device["temp_residual"] = temperature_residual(ts, model, pool, node, device["temperature_celsius"],
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
    "allocated": "max", "active": "max", "temp_residual": "mean",
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


# "The same load": utilisation, and where GPM measures them, tensor and DRAM activity (a matmul and a
# memory copy both read ~100% utilisation at very different clocks).
UTIL_BUCKETS = np.array([0.01, 0.15, 0.5, 0.9])
TENSOR_BUCKETS = np.array([0.05, 0.3])
DRAM_BUCKETS = np.array([0.1, 0.4])


def _bucket(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return np.where(np.isnan(values), edges.size + 1, np.searchsorted(edges, np.nan_to_num(values), side="right"))


ACTIVE_UTIL = 0.5  # a GPU running kernels at least half the time is "active": its clock means something
ACTIVE_SM = 0.3
POWER_BANDS = np.array([0.3, 0.55, 0.8])  # shares of the model's typical full power


def operating_active(util: np.ndarray, sm: np.ndarray) -> np.ndarray:
    """Active operating point: utilisation (or, where only GPM is measured, SM activity) high."""
    util, sm = np.asarray(util, dtype=float), np.asarray(sm, dtype=float)
    return np.where(np.isnan(util), np.nan_to_num(sm) >= ACTIVE_SM, np.nan_to_num(util) >= ACTIVE_UTIL)


def power_band(power: np.ndarray, model: np.ndarray, profile: np.ndarray) -> np.ndarray:
    """Coarse power band (0..3, 4 unmeasured) relative to the model's typical full power."""
    power = np.asarray(power, dtype=float)
    if not np.isfinite(power).any():
        return np.full(power.size, 4, dtype=np.int64)
    key = model.astype(np.int64) * 64 + profile
    full = np.full(power.size, np.nan)
    for k in np.unique(key):
        rows = key == k
        values = power[rows]
        values = values[np.isfinite(values)]
        full[rows] = np.quantile(values, 0.95) if values.size else np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        share = power / full
    return np.where(np.isfinite(share), np.searchsorted(POWER_BANDS, np.nan_to_num(share), side="right"), 4).astype(np.int64)


def _group_median(values: np.ndarray, key: np.ndarray, min_count: int = 1) -> np.ndarray:
    series = pd.Series(values)
    groups = series.groupby(key, sort=False)
    median = groups.transform("median").to_numpy(dtype=float)
    if min_count > 1:
        median = np.where(groups.transform("count").to_numpy() >= min_count, median, np.nan)
    return median


def temperature_residual(ts, model, pool, node, temperature, power, profile) -> np.ndarray:
    """Temperature no load, ambient or node explains: minus the model's temperature at this power
    (a robust fit over the window), minus the fleet-wide drift of that model and pool at this time,
    minus what the GPU's node-mates show at this time (a node running warm together is its cooling
    or its rack, not one GPU). What is left is the GPU's own: a slot offset (removed later against
    its own history) or a GPU warming alone."""
    temperature = np.asarray(temperature, dtype=float)
    power = np.asarray(power, dtype=float)
    out = np.full(temperature.size, np.nan)
    ok = np.isfinite(temperature) & np.isfinite(power) & (profile == 0)
    if ok.sum() < 10:
        return out
    expected = np.full(temperature.size, np.nan)
    for m in np.unique(model[ok]):
        rows = ok & (model == m)
        bins = np.round(power[rows] / 25.0)
        table = pd.Series(temperature[rows]).groupby(bins).median()
        xs, ys = table.index.to_numpy(dtype=float) * 25.0, table.to_numpy(dtype=float)
        expected[rows] = np.interp(power[rows], xs, ys)
    residual = np.where(ok, temperature - expected, np.nan)
    ts_code = pd.factorize(ts)[0].astype(np.int64)
    n_pools = int(pool.max(initial=0)) + 1
    fleet = _group_median(residual, (ts_code * (int(model.max(initial=0)) + 1) + model) * n_pools + pool)
    residual = residual - fleet
    node_mates = _group_median(residual, ts_code * (int(node.max(initial=0)) + 1) + node, min_count=3)
    return residual - np.where(np.isfinite(node_mates), node_mates, 0.0)


class _DeviceIds:
    """Peer groups of device rows at one timestamp: the device's own pod when the pod spans at
    least ``MIN_POD`` devices (a gang or multi-GPU pod runs the same step on all of them), else the
    devices of the same model and node pool at the same operating point (utilisation, tensor and
    DRAM activity buckets and a power band; a MIG instance only with instances of its own profile)
    when there are at least ``MIN_GROUP``. Whether a pod is known never decides the group: an idle
    GPU is never judged against busy ones."""

    MIN_POD = 3
    MIN_GROUP = 5

    def __init__(self, ts, model, pool, pod, profile, util, tensor, dram, band) -> None:
        ts_code = pd.factorize(ts)[0].astype(np.int64)
        load = _bucket(util, UTIL_BUCKETS) * 16 + _bucket(tensor, TENSOR_BUCKETS) * 4 + _bucket(dram, DRAM_BUCKETS)
        n_profiles = int(profile.max(initial=0)) + 1
        state = (load * 5 + band) * n_profiles + profile  # MIG instances against the same profile
        n_models, n_pools = int(model.max(initial=0)) + 1, int(pool.max(initial=0)) + 1
        self.group_key = ((ts_code * n_models + model) * n_pools + pool) * (640 * n_profiles) + state
        # Where the fine group is too small: the same model, pool and activity (active or not).
        coarse = (np.nan_to_num(util) >= ACTIVE_UTIL) * n_profiles + profile
        self.coarse_key = ((ts_code * n_models + model) * n_pools + pool) * (10 * n_profiles) + coarse
        self.has_pod = pod >= 0
        self.pod_key = np.where(self.has_pod, ts_code * (int(pod.max(initial=0)) + 2) + pod, -1)

    def peer_median(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        series = pd.Series(values)
        reference = np.full(values.size, np.nan)
        if self.has_pod.any():
            pods = series[self.has_pod].groupby(self.pod_key[self.has_pod], sort=False)
            size = pods.transform("count").to_numpy()
            median = pods.transform("median").to_numpy()
            index = np.flatnonzero(self.has_pod)
            use = size >= self.MIN_POD
            reference[index[use]] = median[use]
        groups = series.groupby(self.group_key, sort=False)
        size = groups.transform("count").to_numpy()
        median = groups.transform("median").to_numpy()
        fill = np.isnan(reference) & (size >= self.MIN_GROUP)
        reference[fill] = median[fill]
        if np.isnan(reference).any():
            coarse = series.groupby(self.coarse_key, sort=False)
            size = coarse.transform("count").to_numpy()
            median = coarse.transform("median").to_numpy()
            fill = np.isnan(reference) & (size >= self.MIN_GROUP)
            reference[fill] = median[fill]
        return reference


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
