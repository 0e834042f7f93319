"""XID events from dcgm-exporter's ``DCGM_EXP_XID_ERRORS_COUNT``: per GPU and XID code (label
``xid``), how many XIDs of that code the GPU had within the exporter's sliding window
(``--xid-count-window-size``, 5 minutes by default), a gauge. Each rise of the count is that many
new XIDs, so unlike the last-XID gauge it sees the same code twice. Not visible: an XID that enters
the window within one step of an older one of the same code leaving it (the count stays level).

A point after a gap (no series: the exporter had no XID of that code in its window) rises from 0;
the read's baseline point (one step before the window) only sets where the count starts.
"""

from __future__ import annotations

import numpy as np

XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
COUNT_ONLY_LABELS = ("xid", "window_size_in_ms")  # the count's own labels: not the GPU's


def window_events(times_ns: np.ndarray, counts: np.ndarray, start_ns: int, step_ns: int | None) -> np.ndarray:
    """Cumulative XIDs up to each point of one count series (time order, each time once)."""
    counts = np.nan_to_num(np.asarray(counts, dtype=np.float64))
    previous = np.r_[0.0, counts[:-1]]
    if step_ns is not None:
        previous[1:][np.diff(times_ns) > step_ns] = 0.0  # absent in between: its window held none
    rises = np.maximum(counts - previous, 0.0)
    if times_ns.size and times_ns[0] < start_ns:
        rises[0] = 0.0  # the baseline: XIDs before the window
    return np.cumsum(rises)


def add_cumulative(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Two cumulative series (times, counts) summed on the union of their times (two codes that
    both land in the ``other`` column)."""
    times = np.union1d(a[0], b[0])

    def at(series: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        index = np.searchsorted(series[0], times, side="right") - 1
        return np.where(index >= 0, series[1][np.maximum(index, 0)], 0.0)

    return times, at(a) + at(b)
