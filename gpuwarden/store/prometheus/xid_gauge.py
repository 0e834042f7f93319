"""XID events from dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS``: the code of the LAST XID a GPU had,
a gauge (0 for none). A change of its value to a non-zero code is one event of that code; the same
code again, or two XIDs within one step, cannot be seen. The events become the fleet samples'
``xid_<code>_total`` counters (``xid_other_total`` for codes without a column), counted from the
start of the read, so analytics reads them exactly as gpuwarden's own ``gpuwarden_xid_errors_total``.

A GPU that has that exact counter keeps it: its gauge is not read as events (no double count). A
GPU whose exporter serves ``DCGM_EXP_XID_ERRORS_COUNT`` (XIDs per code over a window) has its events
from that (:mod:`.xid_count`: it sees a code twice), not from the gauge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpuwarden.fleet import TRACKED_XIDS

from .xid_count import COUNT_ONLY_LABELS, add_cumulative, window_events

XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"


def xid_label(code: int) -> str:
    """The ``xid`` label value gpuwarden's counter gives a code (its own column, or "other")."""
    return str(code) if code in TRACKED_XIDS else "other"


def xid_counts(times_ns: np.ndarray, codes: np.ndarray) -> dict[str, np.ndarray]:
    """Per ``xid`` label, the events counted up to each sample (from 0 at the first sample): one
    event where the last-XID code changes to a non-zero code. Labels with no event are absent."""
    codes = np.nan_to_num(np.asarray(codes, dtype=np.float64)).astype(np.int64)
    changed = np.zeros(codes.size, dtype=bool)
    changed[1:] = (codes[1:] != codes[:-1]) & (codes[1:] > 0)
    counts: dict[str, np.ndarray] = {}
    for code in np.unique(codes[changed]).tolist():
        label = xid_label(int(code))
        events = (changed & (codes == code)).astype(np.float64)
        counts[label] = counts.get(label, np.zeros(codes.size)) + events
    return {label: np.cumsum(events) for label, events in counts.items()}


@dataclass
class XidGauges:
    """The gauge series of one read, kept aside until every series is in: a GPU turns out to have
    gpuwarden's counter only once all series are read."""

    parts: dict[tuple[tuple[str, str], ...], list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    counted: set[tuple[str, str]] = field(default_factory=set)  # (node, UUID) with gpuwarden's counter
    windows: dict[tuple[tuple[str, str], ...], list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)

    @staticmethod
    def gpu(labels: Mapping[str, str]) -> tuple[str, str]:
        return labels.get("node") or labels.get("Hostname", ""), labels.get("UUID", "")

    def add(self, labels: dict[str, str], times_ns: np.ndarray, values: np.ndarray, window_count: bool = False) -> None:
        """One chunk of one series (chunks overlap by the baseline step); ``window_count``: a
        ``DCGM_EXP_XID_ERRORS_COUNT`` series, else the last-XID gauge."""
        target = self.windows if window_count else self.parts
        target.setdefault(tuple(sorted(labels.items())), []).append((times_ns, values))

    @property
    def series(self) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
        """Each gauge series over the whole read, in time order, each time once."""
        return _merged(self.parts)

    @property
    def windowed(self) -> set[tuple[str, str]]:
        """GPUs whose XID events come from the windowed count (unless gpuwarden's counter has them)."""
        return {self.gpu(labels) for labels, _, _ in _merged(self.windows)} - self.counted

    def events(self, start_ns: int, step_ns: int | None = None) -> list[tuple[dict[str, str], str, np.ndarray, np.ndarray]]:
        """(labels, xid label, times, cumulative events) for the GPUs read through the gauge or the
        windowed count; the samples before ``start_ns`` (the baseline step) set the previous value
        and are dropped."""
        windowed = self.windowed
        out = []
        for labels, times_ns, values in self.series:
            gpu = self.gpu(labels)
            if gpu in self.counted or gpu in windowed:
                continue
            keep = times_ns >= start_ns
            for label, counts in xid_counts(times_ns, values).items():
                out.append((labels, label, times_ns[keep], counts[keep]))
        by_code: dict[tuple[tuple[tuple[str, str], ...], str], tuple[np.ndarray, np.ndarray]] = {}
        # Every time of the read: a count's events are counted from 0 at the window's first point,
        # not from its first appearance (a counter's first value is its baseline).
        grid = np.unique(np.concatenate([t for parts in (*self.parts.values(), *self.windows.values()) for t, _ in parts]
                                        or [np.empty(0, np.int64)]))
        zeros = (grid, np.zeros(grid.size))
        for labels, times_ns, values in _merged(self.windows):
            code = labels.get("xid", "")
            if self.gpu(labels) in self.counted or not code.isdigit():
                continue
            key = (tuple(sorted((k, v) for k, v in labels.items() if k not in COUNT_ONLY_LABELS)), xid_label(int(code)))
            series = (times_ns, window_events(times_ns, values, start_ns, step_ns))
            by_code[key] = add_cumulative(by_code.get(key, zeros), series)
        for (labels_key, label), (times_ns, counts) in by_code.items():
            keep = times_ns >= start_ns
            if counts[-1] > 0:
                out.append((dict(labels_key), label, times_ns[keep], counts[keep]))
        return out

    def gauge_gpus(self) -> int:
        """GPUs whose XID events come from the gauge in this read."""
        return len({self.gpu(labels) for labels, _, _ in self.series} - self.counted - self.windowed)

    def earlier_codes(self, start_ns: int) -> list[tuple[dict[str, str], int]]:
        """(labels, code) of GPUs whose last XID at the start of the read is non-zero: an XID of
        unknown time before the window, not an event in it."""
        out = []
        skip = self.counted | self.windowed
        for labels, times_ns, values in self.series:
            if self.gpu(labels) in skip or not times_ns.size:
                continue
            first = np.flatnonzero(np.isfinite(values))
            if first.size and times_ns[first[0]] <= start_ns and values[first[0]] > 0:
                out.append((labels, int(values[first[0]])))
        return out


def _merged(series_parts: Mapping[tuple[tuple[str, str], ...], list[tuple[np.ndarray, np.ndarray]]]
            ) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
    """Each series over the whole read, in time order, each time once."""
    out = []
    for key, parts in series_parts.items():
        times_ns = np.concatenate([t for t, _ in parts])
        values = np.concatenate([v for _, v in parts])
        times_ns, first = np.unique(times_ns, return_index=True)
        out.append((dict(key), times_ns, values[first]))
    return out
