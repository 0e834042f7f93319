"""Reading fleet samples into a :class:`~gpuwarden.analytics.ledger.Ledger`: a DataFrame cut into
UTC days, a samples source read a chunk at a time (the next chunk read in a thread while this one is
classified), or a Prometheus source's recording-rule rollups when it has them."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from gpuwarden.fleet.semantics import to_utc, to_utc_or_none

from .inventory import Inventory
from .ledger import COLUMNS, Ledger, LedgerBuilder
from .params import AnalyticsError, IdleParams
from .pricebook import PriceBook

log = logging.getLogger("gpuwarden.analytics")

# Reading raw samples instead of the recording-rule rollups: points read per GPU-day at the
# default 60 s step, ~16 metric families x 1,440, against 4 rollup figures x 24 hours x ~1.3
# states a GPU visits per hour (docs/scale.md).
RAW_READ_SLOWDOWN = "about 180x more points to read, so"


def _read_bounds(source: Any, start: pd.Timestamp | None, end: pd.Timestamp | None) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """``[start, end)`` with an open bound closed at the source's oldest / newest sample (the end just
    past it); None when a bound is open and the source holds nothing."""
    if start is not None and end is not None:
        return start, end
    span = source.time_range()
    if span is None:
        return None
    return (start if start is not None else to_utc(span[0]),
            end if end is not None else to_utc(span[1]) + pd.Timedelta(microseconds=1))


def _day_windows(start: pd.Timestamp, end: pd.Timestamp, chunk: pd.Timedelta) -> Iterator[tuple[pd.Timestamp, pd.Timestamp]]:
    cursor = start
    while cursor < end:
        boundary = min(end, (cursor.floor(chunk) + chunk) if chunk >= pd.Timedelta(hours=1) else cursor + chunk)
        yield cursor, boundary
        cursor = boundary


def _ledger_from_rollups(source: Any, builder: LedgerBuilder, start: pd.Timestamp | None, end: pd.Timestamp | None,
                         bounds: tuple[pd.Timestamp, pd.Timestamp]) -> Ledger | None:
    """The ledger from a source's recording-rule rollups over ``bounds`` (``[start, end)`` closed by
    :func:`_read_bounds`); None (with a warning) when it has none."""
    read_start, read_end = bounds
    started = time.perf_counter()
    frame = source.read_state_rollup(read_start, read_end, bucket=builder.bucket)
    if frame is None:
        message = ("no gpuwarden recording-rule rollups (gpu:gpuwarden_state_seconds:5m) in this window: reading raw "
                   f"samples instead ({RAW_READ_SLOWDOWN} far slower over long windows); load rules/gpuwarden-recording.rules.yml "
                   "into Prometheus (see docs/prometheus.md)")
        log.warning(message)
        builder.fallback_note = message
        return None
    builder.add_rollup(frame, source.rollup_resolution)
    ledger = builder.finish(start, end)
    ledger.notes.append(f"read from the recording-rule rollups ({len(frame):,} rows at "
                        f"{source.rollup_resolution.total_seconds() / 60:g}-minute resolution, summed per "
                        f"{builder.bucket.total_seconds() / 3600:g} h) in {time.perf_counter() - started:.1f} s; no raw sample read")
    ledger.quality["source"] = "rollup"
    return ledger


def with_source_labels(inventory: Inventory, data: Any, start: pd.Timestamp | None,
                       end: pd.Timestamp | None) -> Inventory:
    """``inventory`` with the price tiers the source's node labels give (a Prometheus source reads
    kube-state-metrics' ``kube_node_labels``); as it is for a source without node labels."""
    read = getattr(data, "node_labels", None)
    if not callable(read):
        return inventory
    if start is None or end is None:
        span = data.time_range()
        if span is None:
            return inventory
        start, end = start or span[0], end or span[1]
    return inventory.with_labels(read(start, end), "kube_node_labels")


def build_ledger(data: Any, start: object = None, end: object = None, price_book: PriceBook | None = None, inventory: Inventory | None = None,
                 params: IdleParams | None = None, bucket: str | pd.Timedelta = "1h",
                 chunk: str | pd.Timedelta = "1D", keep_rows: bool = False, price: bool = True) -> Ledger:
    """Classify and price fleet samples over ``[start, end)``.

    ``data`` is a DataFrame of fleet samples or a samples source (``read(start, end, columns)`` and
    ``time_range()``, e.g. :class:`~gpuwarden.store.LocalStore`), which is read ``chunk`` at a time
    with only the columns analytics needs. A source with a ``sample_interval`` (Prometheus reads on
    a grid) gives the interval, so one sample per GPU is enough; otherwise it is the median interval. ``price=False`` skips pricing (for traces of GPU models no
    price book knows); costs are then 0.
    """
    params = params or IdleParams()
    interval = getattr(data, "sample_interval", None)  # a source that knows its grid (Prometheus) says so
    if params.step is None and interval is not None:
        params = replace(params, step=pd.Timedelta(interval))
    start, end = to_utc_or_none(start), to_utc_or_none(end)
    inventory = with_source_labels(inventory or Inventory.default(), data, start, end)
    builder = LedgerBuilder(price_book, inventory, params, bucket, keep_rows, price)
    bounds: tuple[pd.Timestamp, pd.Timestamp] | None = None  # a source's read window, asked for once
    if not isinstance(data, pd.DataFrame) and not keep_rows and getattr(data, "rollups", False) \
            and callable(getattr(data, "read_state_rollup", None)):
        bounds = _read_bounds(data, start, end)
        if bounds is None:
            return builder.finish(start, end)
        ledger = _ledger_from_rollups(data, builder, start, end, bounds)
        if ledger is not None:
            return ledger
    if isinstance(data, pd.DataFrame):
        if "timestamp" not in data.columns:
            raise AnalyticsError("fleet samples lack column timestamp")
        frame = data
        stamps = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce")
        if start is not None or end is not None:
            mask = np.ones(len(frame), bool)
            if start is not None:
                mask &= (stamps >= start).to_numpy()
            if end is not None:
                mask &= (stamps < end).to_numpy()
            frame, stamps = frame[mask], stamps[mask]
        if frame.empty or stamps.isna().all():
            builder.add(frame)
            return builder.finish(start, end)
        # Same chunks as a source would give (so the carried context is exercised the same way).
        if not stamps.is_monotonic_increasing:
            order = np.argsort(stamps.to_numpy(), kind="stable")
            frame, stamps = frame.iloc[order], stamps.iloc[order]
        values = pd.DatetimeIndex(stamps).as_unit("ns")
        lo_all = start if start is not None else values.min()
        hi_all = end if end is not None else values.max() + pd.Timedelta(1, unit="ns")
        if values.isna().any():
            builder.add(frame[values.isna()])  # counted and dropped as unidentified
        for lo, hi in _day_windows(lo_all, hi_all, pd.Timedelta(chunk)):
            a, b = values.searchsorted(lo, "left"), values.searchsorted(hi, "left")
            if b > a:
                builder.add(frame.iloc[a:b])
        return builder.finish(start, end)
    if not hasattr(data, "read"):
        raise AnalyticsError(f"cannot read fleet samples from {type(data).__name__}; pass a DataFrame or a samples source")
    bounds = bounds or _read_bounds(data, start, end)
    if bounds is None:
        return builder.finish(start, end)
    read_start, read_end = bounds
    # Read the next chunk in a thread while this one is classified (Parquet decoding releases the
    # GIL). A source with ``read_arrow`` (the local store) hands over Arrow tables: no pandas.
    arrow = callable(getattr(data, "read_arrow", None))
    read, add = (data.read_arrow, builder.add_arrow) if arrow else (data.read, builder.add)
    windows = list(_day_windows(read_start, read_end, pd.Timedelta(chunk)))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuwarden-read") as pool:
        pending = pool.submit(read, *windows[0], columns=list(COLUMNS)) if windows else None
        for position in range(len(windows)):
            assert pending is not None  # one read is submitted per window
            part = pending.result()
            pending = (pool.submit(read, *windows[position + 1], columns=list(COLUMNS))
                       if position + 1 < len(windows) else None)
            if part is not None:
                add(part)
            del part
    # An open window ends one step after the newest sample, as for a DataFrame.
    return builder.finish(start, end)
