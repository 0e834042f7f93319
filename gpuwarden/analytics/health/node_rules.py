"""Node conditions: what every GPU of a node shows together belongs to the node, reported once.

A node power cap or clock policy slows all its busy GPUs at once; hot inlet air warms (and may
thermal-throttle) all of them; a driver reload resets every counter at once. Judged GPU by GPU
against peers on other nodes, each looks like eight stragglers, eight throttling GPUs, eight
cooling faults. The rule here: at one time, when at least ``node_wide_share`` of the node's GPUs
that can show a condition (and ``node_wide_min_gpus`` of them) do show it, those rows are the
node's. They raise one finding for the node (``gpu_uuid`` None, no recommended action: no GPU is
at fault) and none for its GPUs; a GPU of that node is still a straggler when it is slower than its
node-mates as well as its peers (:func:`node_median`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from gpuwarden.fleet import FindingKind

from .catalogue import NODE_KINDS
from .finding_builder import FindingBuilder


def _node_time(b: FindingBuilder) -> np.ndarray:
    """Per row: a dense code of its (node, time) with the time rounded to the series' step: the GPUs
    of one node are scraped together, but their timestamps need not be equal (an exporter stamps
    each GPU as it reads it; a recording rule or a resampled file shifts them by a few seconds)."""
    key = b.memo.get("node_time")
    if key is None:
        step_ns = max(1, int(b.s.step_s * 1e9))
        ts_code = np.unique(np.rint(b.s["ts"] / step_ns).astype(np.int64), return_inverse=True)[1].astype(np.int64)
        raw = b.s["node"].astype(np.int64) * (int(ts_code.max(initial=0)) + 1) + ts_code
        key = b.memo["node_time"] = np.unique(raw, return_inverse=True)[1].reshape(-1)
    assert isinstance(key, np.ndarray)
    return key


def node_share(b: FindingBuilder, flag: np.ndarray, eligible: np.ndarray, min_gpus: int | None = None,
               share: float | None = None) -> np.ndarray:
    """Per row: at this row's time, at least ``min_gpus`` (default ``node_wide_min_gpus``) of its
    node's ``eligible`` GPUs, and at least ``share`` (default ``node_wide_share``) of them, have
    ``flag`` (only eligible rows count)."""
    key = _node_time(b)
    eligible = np.asarray(eligible, dtype=bool)
    flagged = np.asarray(flag, dtype=bool) & eligible
    n_eligible = np.bincount(key, weights=eligible.astype(float))[key]
    n_flagged = np.bincount(key, weights=flagged.astype(float))[key]
    c = b.config
    share = c.node_wide_share if share is None else share
    return (n_flagged >= (c.node_wide_min_gpus if min_gpus is None else min_gpus)) & (n_flagged >= share * np.maximum(n_eligible, 1))


def node_median(b: FindingBuilder, values: np.ndarray, eligible: np.ndarray, min_count: int = 3) -> np.ndarray:
    """Per row: the median of ``values`` over the node's ``eligible`` rows at this row's time (NaN
    where fewer than ``min_count`` GPUs are eligible: no node-mates to compare with)."""
    values = np.where(np.asarray(eligible, dtype=bool), np.asarray(values, dtype=float), np.nan)
    groups = pd.Series(values).groupby(_node_time(b), sort=False)
    median = groups.transform("median").to_numpy(dtype=float)
    return np.where(groups.transform("count").to_numpy() >= min_count, median, np.nan)


def _node_excess(b: FindingBuilder) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the trailing mean (over ``cooling_window_s``) of ``features``' node temperature
    excess over the model and pool at this power, and how many samples it holds."""
    found = b.memo.get("node_excess")
    if found is None:
        found = b.memo["node_excess"] = b.s.window_mean(b.s["node_temp_excess"], b.config.cooling_window_s)
    assert isinstance(found, tuple)
    return found


def node_warm(b: FindingBuilder) -> np.ndarray:
    """Per row: the node's GPUs together run ``node_hot_celsius`` above their model and pool's at
    this power (:func:`_node_excess`)."""
    warm = b.memo.get("node_warm")
    if warm is None:
        c = b.config
        excess, n_excess = _node_excess(b)
        hot = (n_excess >= b.min_samples(c.cooling_min_s)) & (np.nan_to_num(excess) >= c.node_hot_celsius)
        warm = b.memo["node_warm"] = node_share(b, hot, np.isfinite(excess))
        b.memo["node_warm_gpus"] = warm & hot  # the GPUs that are warm themselves (idle ones are not)
    assert isinstance(warm, np.ndarray)
    return warm


def node_condition_findings(b: FindingBuilder, shared: Mapping[FindingKind, list[tuple[str, np.ndarray]]]) -> None:
    """One finding per episode of each node condition: ``shared`` maps a node kind to (signal,
    node-wide rows) from the per-GPU rules; node temperature and counter resets are judged here."""
    s = b.s
    signals = {kind: list(parts) for kind, parts in shared.items()}
    node_warm(b)
    warm_gpus = b.memo["node_warm_gpus"]
    assert isinstance(warm_gpus, np.ndarray)
    signals.setdefault(FindingKind.NODE_WIDE_THERMAL, []).append(
        ("temperature_celsius of the node's GPUs above their model and pool's", warm_gpus))
    excess = _node_excess(b)[0]
    signals.setdefault(FindingKind.NODE_WIDE_COUNTER_RESET, []).append(
        ("every counter dropped (reset)", node_share(b, s["counter_reset"], np.ones(len(s), dtype=bool))))
    gpus_on_node = np.bincount(np.unique(s["node"] * (int(s["gpu"].max(initial=0)) + 1) + s["gpu"]) // (
        int(s["gpu"].max(initial=0)) + 1), minlength=len(s.nodes))
    # against the model and pool at any power: under a node power cap the node's GPUs are each
    # other's same-power peers, so the same-power ratio reads 1.0 there
    clock = np.exp(s["log_clock_vs_pool"])
    for kind, parts in signals.items():
        flag = np.zeros(len(s), dtype=bool)
        for _, rows in parts:
            flag |= rows
        if not flag.any():
            continue
        severity, note = NODE_KINDS[kind]
        b.emit(kind, flag, severity,
               lambda rows, parts=parts, note=note: {
                   "signal": "; ".join(name for name, part in parts if part[rows].any()),
                   "gpus_affected": int(np.unique(s["gpu"][rows]).size),
                   "gpus_on_node": int(gpus_on_node[s["node"][rows[0]]]),
                   "clock_vs_pool_median": _median(clock[rows]),
                   "node_temperature_excess_celsius_median": _median(excess[rows]),
                   "note": note},
               lambda rows: 0.5 + 0.05 * min(int(np.unique(s["gpu"][rows]).size), 8), unit="node")


def _median(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else None
