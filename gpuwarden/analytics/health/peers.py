"""Who a GPU is compared with: operating points (load buckets, power bands), peer groups of device
rows at one timestamp, and the temperature no load, ambient or node explains. Split from
:mod:`.features`, which builds the per-GPU series these feed."""

from __future__ import annotations

import numpy as np
import pandas as pd


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


def temperature_residual(ts, model, pool, node, temperature, power, profile) -> tuple[np.ndarray, np.ndarray]:
    """Temperature no load, ambient or node explains: minus the model's temperature at this power
    (a robust fit over the window), minus the fleet-wide drift of that model and pool at this time,
    minus what the GPU's node-mates show at this time (a node running warm together is its cooling
    or its rack, not one GPU). What is left is the GPU's own: a slot offset (removed later against
    its own history) or a GPU warming alone. Also returns what the node-mates share (the node's own
    excess over its model and pool, NaN with fewer than 3 GPUs measured): a node running warm."""
    temperature = np.asarray(temperature, dtype=float)
    power = np.asarray(power, dtype=float)
    out = np.full(temperature.size, np.nan)
    ok = np.isfinite(temperature) & np.isfinite(power) & (profile == 0)
    if ok.sum() < 10:
        return out, out
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
    # the drift of the model and pool at this time, where at least 3 GPUs show it: a GPU alone in its
    # group (a one-GPU fleet, a model's only card) is its own "fleet" and would cancel itself out
    fleet = _group_median(residual, (ts_code * (int(model.max(initial=0)) + 1) + model) * n_pools + pool, min_count=3)
    residual = residual - np.where(np.isfinite(fleet), fleet, 0.0)
    node_mates = _group_median(residual, ts_code * (int(node.max(initial=0)) + 1) + node, min_count=3)
    return residual - np.where(np.isfinite(node_mates), node_mates, 0.0), node_mates


class DeviceIds:
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

    def pool_median(self, values: np.ndarray) -> np.ndarray:
        """Median over the devices of the same model, pool and activity (active or not) at this time,
        whatever their power: the reference a node power cap cannot move (its GPUs draw less power, so
        at the same power band they would be each other's peers)."""
        series = pd.Series(np.asarray(values, dtype=float)).groupby(self.coarse_key, sort=False)
        median = series.transform("median").to_numpy(dtype=float)
        return np.where(series.transform("count").to_numpy() >= self.MIN_GROUP, median, np.nan)

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
