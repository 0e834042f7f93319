"""Series presence and scrape health on one time grid, per node and per GPU: what the
observability-collapse rule (:mod:`.collapse_rules`) and the presence rule (:mod:`.presence_rules`)
read of how well a node was observed.

The grid is the fleet's sampling step from the first sample scanned. Scrape health is the optional
frame the Prometheus source reads beside the samples (columns:
:data:`gpuwarden.fleet.scrape_health.SCRAPE_HEALTH_COLUMNS`; several targets of one node are
combined: the worst ``up``, the slowest scrape, the samples summed). Without it, only presence is
known and every scrape figure is NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .features import GpuSeries

_NS = 1_000_000_000


def window_sum(values: np.ndarray, w: int) -> np.ndarray:
    """Trailing sum over ``w`` grid points (the point itself included), along the last axis."""
    values = np.nan_to_num(np.asarray(values, dtype=np.float64))
    cumulative = np.concatenate([np.zeros(values.shape[:-1] + (1,)), np.cumsum(values, axis=-1)], axis=-1)
    start = np.maximum(np.arange(values.shape[-1]) + 1 - w, 0)
    return np.asarray(cumulative[..., 1:] - cumulative[..., start])


def failed_scrape_times(scrape: pd.DataFrame | None) -> dict[str, np.ndarray]:
    """node -> the sorted times (ns) at which a scrape of one of its targets failed (``up`` below 1
    in the step, or a drop counted)."""
    if scrape is None or len(scrape) == 0:
        return {}
    failed = (scrape["up_ratio"].astype(float) < 1.0) | (scrape["up_drops"].astype(float).fillna(0.0) > 0)
    rows = scrape[failed.to_numpy()]
    stamps = pd.to_datetime(rows["timestamp"], utc=True).dt.as_unit("ns").astype("int64").to_numpy()
    nodes = rows["node"].astype(str).to_numpy()
    return {node: np.unique(stamps[nodes == node]) for node in np.unique(nodes).tolist()}


class ScrapeGrid:
    """Presence (node, GPU) and scrape health (node) of one scan on the fleet's grid."""

    def __init__(self, s: GpuSeries, scrape: pd.DataFrame | None = None, settle_s: float = 300.0) -> None:
        self.s = s
        self.step_ns = max(1, int(round(s.step_s * _NS)))
        ts = s["ts"]
        t0 = int(ts.min())
        n = int(round((int(ts.max()) - t0) / self.step_ns)) + 1
        self.times = t0 + np.arange(n, dtype=np.int64) * self.step_ns
        index = np.clip(np.round((ts - t0) / self.step_ns).astype(np.int64), 0, n - 1)
        self.node_codes, node_of_row = np.unique(s["node"], return_inverse=True)
        self.gpu_codes, gpu_of_row = np.unique(s["gpu"], return_inverse=True)
        self.gpu_node = np.zeros(self.gpu_codes.size, dtype=np.int64)
        self.gpu_node[gpu_of_row] = node_of_row
        self.node_present = np.zeros((self.node_codes.size, n), dtype=bool)
        self.node_present[node_of_row, index] = True
        self.gpu_present = np.zeros((self.gpu_codes.size, n), dtype=bool)
        self.gpu_present[gpu_of_row, index] = True
        self.gpu_seen_before = np.maximum.accumulate(self.gpu_present, axis=1)
        node_seen = np.maximum.accumulate(self.node_present, axis=1)
        self._rows = {(int(node_of_row[r]), int(gpu_of_row[r])): r for r in range(len(ts) - 1, -1, -1)}
        self.memo: dict[str, Any] = {}
        self._scrape(scrape, t0, n)
        # a node or target gap of two steps or more: the GPUs of a node that comes back return one by one
        absent = (~self.node_present & node_seen) | (self.up_ratio == 0.0)
        run = window_sum(absent, 2) >= 2
        self.settling = window_sum(run, self.steps(settle_s) + 1) > 0
        fleet_share = self.node_present.sum(axis=0) / np.maximum(node_seen.sum(axis=0), 1)
        vanished = ~self.node_present & node_seen & (fleet_share >= 0.5)
        self._presence_flaps = vanished & np.concatenate([np.zeros((vanished.shape[0], 1), dtype=bool),
                                                          self.node_present[:, :-1]], axis=1)

    def _scrape(self, scrape: pd.DataFrame | None, t0: int, n: int) -> None:
        shape = (self.node_codes.size, n)
        self.up_ratio, self.up_drops = np.full(shape, np.nan), np.full(shape, np.nan)
        self.duration, self.samples = np.full(shape, np.nan), np.full(shape, np.nan)
        self.has_scrape = scrape is not None and len(scrape) > 0
        if not self.has_scrape or scrape is None:
            self.scrape_ok = np.zeros(shape, dtype=bool)
            return
        names = {str(self.s.nodes[code]): i for i, code in enumerate(self.node_codes)}
        node = scrape["node"].astype(str).map(names)
        stamps = pd.to_datetime(scrape["timestamp"], utc=True).dt.as_unit("ns").astype("int64").to_numpy()
        step = np.round((stamps - t0) / self.step_ns).astype(np.int64)
        keep = node.notna().to_numpy() & (step >= 0) & (step < n)
        frame = pd.DataFrame({"node": node.to_numpy()[keep].astype(np.int64), "step": step[keep],
                              **{c: scrape[c].astype(float).to_numpy()[keep] for c in
                                 ("up_ratio", "up_drops", "scrape_duration_seconds", "scrape_samples_scraped")}})
        agg = frame.groupby(["node", "step"]).agg(up_ratio=("up_ratio", "min"), up_drops=("up_drops", "sum"),
                                                  duration=("scrape_duration_seconds", "max"),
                                                  samples=("scrape_samples_scraped", lambda v: v.sum(min_count=1)))
        i, j = agg.index.get_level_values(0).to_numpy(), agg.index.get_level_values(1).to_numpy()
        for name in ("up_ratio", "up_drops", "duration", "samples"):
            getattr(self, name)[i, j] = agg[name].to_numpy()
        self.scrape_ok = ~(self.up_ratio < 1.0) & np.isfinite(self.duration)

    def steps(self, seconds: float) -> int:
        """Grid points that cover ``seconds``."""
        return max(1, int(np.ceil(seconds * _NS / self.step_ns - 1e-9)))

    def flaps(self, w: int) -> np.ndarray:
        """(node, grid) -> 1 -> 0 transitions of ``up`` in the trailing ``w`` points: from scrape
        health where read, else (and at least) the node's series vanishing while most of the fleet
        reports."""
        if "flaps" not in self.memo:
            up = self.up_ratio
            previous = np.concatenate([np.full((up.shape[0], 1), np.nan), up[:, :-1]], axis=1)
            starts = (up < 1.0) & (previous >= 1.0)
            scrape = np.maximum(np.nan_to_num(self.up_drops), starts.astype(np.float64))
            self.memo["flaps"] = np.maximum(window_sum(scrape, w), window_sum(self._presence_flaps, w))
        flaps: np.ndarray = self.memo["flaps"]
        return flaps

    def first_row(self, node: int, gpu: int | None) -> int:
        """A row of the GPU (or of the node's first GPU) in the series, for its model and pool."""
        if gpu is None:
            gpu = int(np.flatnonzero(self.gpu_node == node)[0])
        return self._rows[(node, gpu)]

    def evidence(self, node: int, gpu: int | None, i: int, window_s: float) -> dict[str, Any]:
        """What was measured at grid point ``i`` over the trailing window."""
        w = self.steps(window_s)
        lo = max(0, i + 1 - w)
        mates = self.gpu_node == node
        out: dict[str, Any] = {"gpus_on_node": int(mates.sum()),
                               "gpus_reporting_now": int(self.gpu_present[mates, i].sum()),
                               "up_flaps": int(self.flaps(w)[node, i])}
        if gpu is not None:
            reported = self.node_present[node, lo:i + 1]
            out["missed_samples"] = int((reported & ~self.gpu_present[gpu, lo:i + 1]).sum())
            out["node_samples"] = int(reported.sum())
        if self.has_scrape:
            duration, samples = self.duration[node, lo:i + 1], self.samples[node, lo:i + 1]
            out.update({
                "scrape_duration_max_s": _round(np.nanmax(duration) if np.isfinite(duration).any() else np.nan),
                "scrape_duration_baseline_s": _round(self.memo.get("duration_baseline", np.full_like(self.duration, np.nan))[node, i]),
                "samples_scraped_min": _round(np.nanmin(samples) if np.isfinite(samples).any() else np.nan),
                "samples_scraped_baseline": _round(self.memo.get("samples_baseline", np.full_like(self.samples, np.nan))[node, i]),
                "failed_scrape_steps": int((self.up_ratio[node, lo:i + 1] < 1.0).sum()),
            })
        return out


def _round(value: float) -> float | None:
    return None if not np.isfinite(value) else round(float(value), 3)
