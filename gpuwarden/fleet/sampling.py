"""The sampling step of fleet samples: one rule for every room that needs the scrape interval.

The step is the median spacing between consecutive samples of one series (a GPU, or a MIG
instance), over every series, counting only spacings above zero (rows repeating a time, such as a
GPU's MIG instances collapsed onto it, are not a spacing). The median holds on what real scrapes
give: a gap (a GPU that vanished and came back, a scraper restart) is one long spacing among many
regular ones, and jitter of a few hundred milliseconds around the interval leaves the middle where
it was. Numpy only: the rule sees timestamps, not frames.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

NS_PER_SECOND = 1_000_000_000


def _nanoseconds(times: npt.ArrayLike) -> npt.NDArray[np.int64]:
    values = np.asarray(times)
    if np.issubdtype(values.dtype, np.datetime64):
        return values.astype("datetime64[ns]").astype(np.int64)
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"times are {values.dtype}; expected datetime64 values or integer nanoseconds")
    return values.astype(np.int64)


def sampling_step_ns(times: npt.ArrayLike, series: npt.ArrayLike | None = None) -> int | None:
    """The sampling step in nanoseconds (rule in the module doc), or None where no spacing can be
    measured (fewer than two distinct times in every series).

    ``times`` are datetime64 values or integer nanoseconds; ``series`` labels each row's series
    (any values numpy can sort; None: all rows are one series, e.g. a fleet scraped in step).
    Rows need not be sorted.
    """
    ts = _nanoseconds(times)
    if ts.size < 2:
        return None
    if series is None:
        spacing = np.diff(np.unique(ts))
    else:
        keys = np.asarray(series)
        if keys.shape != ts.shape:
            raise ValueError(f"series has {keys.size} labels for {ts.size} times; expected one per time")
        if not np.issubdtype(keys.dtype, np.integer):
            keys = np.unique(keys.astype(str), return_inverse=True)[1]
        ordered = bool(np.all((keys[1:] > keys[:-1]) | ((keys[1:] == keys[:-1]) & (ts[1:] >= ts[:-1]))))
        if not ordered:  # most callers hold rows sorted by series and time already: then no sort
            order = np.lexsort((ts, keys))
            ts, keys = ts[order], keys[order]
        spacing = np.diff(ts)[keys[1:] == keys[:-1]]
        spacing = spacing[spacing > 0]
    return int(np.median(spacing)) if spacing.size else None


def sampling_step_seconds(times: npt.ArrayLike, series: npt.ArrayLike | None = None,
                          default_seconds: float = 60.0) -> float:
    """:func:`sampling_step_ns` in seconds, ``default_seconds`` where no spacing can be measured."""
    step = sampling_step_ns(times, series)
    return default_seconds if step is None else step / NS_PER_SECOND
