"""Bad input, handled explicitly: what analytics does with each kind, and the counts it reports.

=====================  ==========================================================================
input                  handling
=====================  ==========================================================================
negative value         a negative ratio, memory or power is not a measurement: set to null
                       (counted per column in ``negative_values``); the row is kept.
ratio above 1          same (``out_of_range_values``): a percent written as a ratio is not guessed.
no timestamp / GPU     the row is dropped (``rows_dropped_unidentified``).
duplicated timestamp   two rows of one GPU (or MIG instance) at one timestamp: the last one read is
                       kept (``duplicate_rows``).
gap                    a silence longer than ``max_gap`` between two samples of a GPU is missing data:
                       the sample after it stands for one nominal step, the rest is counted in
                       ``gap_gpu_hours`` (never classified, never charged), and windows and idle
                       stretches restart after it.
GPU appearing late     a GPU's time starts at its first sample, so a GPU that joins mid-window adds
                       no unallocated hours before it existed (``gpus_appearing_late`` lists them;
                       ``gpus_leaving_early`` the ones whose samples stop before the end).
counter reset          analytics reads gauges only (utilisation, SM activity, memory, power); the
                       cumulative ``*_total`` counters are not used for idle or cost, so a reset
                       cannot disturb them. Where a frame carries counters, drops are counted in
                       ``counter_resets``; :func:`gpuwarden.fleet.semantics.counter_increase`
                       gives reset-aware increases.
no activity at all     an allocated sample with neither SM activity nor NVML utilisation is
                       ``unmeasured`` (its hours and cost still count; ``unmeasured_gpu_hours``).
=====================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuwarden.fleet.semantics import counter_resets

# Gauges analytics reads, and their allowed range.
RATIO_COLUMNS = ("gpu_util_ratio", "sm_active_ratio")
NON_NEGATIVE_COLUMNS = ("mem_used_bytes", "mem_total_bytes", "power_watts")


@dataclass
class QualityCounts:
    rows_read: int = 0
    rows_dropped_unidentified: int = 0
    duplicate_rows: int = 0
    negative_values: dict[str, int] = field(default_factory=dict)
    out_of_range_values: dict[str, int] = field(default_factory=dict)
    gaps: int = 0
    gap_gpu_hours: float = 0.0
    unmeasured_samples: int = 0
    counter_resets: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, key: str, count: int) -> None:
        if count:
            bucket = getattr(self, name)
            bucket[key] = bucket.get(key, 0) + int(count)


def sanitize_gauges(frame: pd.DataFrame, counts: QualityCounts) -> dict[str, np.ndarray]:
    """The gauges as float arrays, with negative and out-of-range values set to NaN (and counted)."""
    values: dict[str, np.ndarray] = {}
    for name in (*RATIO_COLUMNS, *NON_NEGATIVE_COLUMNS):
        if name not in frame.columns:
            values[name] = np.full(len(frame), np.nan)
            continue
        series = frame[name]
        if series.dtype == np.float64:  # the usual case: no to_numeric copy
            values[name] = series.to_numpy()
        else:
            values[name] = pd.to_numeric(series, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    return sanitize_arrays(values, counts)


def sanitize_arrays(values: dict[str, np.ndarray], counts: QualityCounts) -> dict[str, np.ndarray]:
    """:func:`sanitize_gauges` for float arrays already read (NaN for null); the arrays are not
    modified (a cleaned copy replaces one that needs cleaning)."""
    out: dict[str, np.ndarray] = {}
    for name in (*RATIO_COLUMNS, *NON_NEGATIVE_COLUMNS):
        column = values[name]
        # The usual case, every value in range (or NaN), costs two passes and no temporaries:
        # fmin / fmax skip NaN (and give NaN only when every value is NaN).
        low, high = (np.fmin.reduce(column), np.fmax.reduce(column)) if len(column) else (0.0, 0.0)
        if np.isnan(low):
            clean = True
        elif name in RATIO_COLUMNS:
            clean = low >= 0 and high <= 1.0 + 1e-9
        elif name == "mem_total_bytes":
            clean = low > 0  # a GPU with no memory is not a measurement
        else:
            clean = low >= 0
        if clean:
            out[name] = column
            continue
        with np.errstate(invalid="ignore"):
            negative = column < 0
            if name in RATIO_COLUMNS:
                too_big = column > 1.0 + 1e-9
            elif name == "mem_total_bytes":
                too_big = column == 0
            else:
                too_big = np.zeros(len(column), dtype=bool)
        column = column.copy()
        column[negative | too_big] = np.nan
        counts.add("negative_values", name, int(negative.sum()))
        counts.add("out_of_range_values", name, int(too_big.sum()))
        out[name] = column
    return out


def count_counter_resets(frame: pd.DataFrame, counts: QualityCounts, key: str = "gpu_uuid") -> None:
    """Count drops of each ``*_total`` counter the frame carries, per GPU in time order."""
    counters = [c for c in frame.columns if c.endswith("_total")]
    if not counters or key not in frame.columns or "timestamp" not in frame.columns:
        return
    for column, resets in counter_resets(frame, counters, key).items():
        counts.add("counter_resets", column, resets)
