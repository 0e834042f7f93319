"""The report windows every dashboard page shares: presets that end at the newest sample, or whole
UTC days, and the one chart-bucket rule. Pure (no Streamlit), so the demo can precompute the
reports of exactly the window a page will ask for.

A window's end is the newest sample plus one second, not the wall clock (the demo's clock is
simulated). Its ``key`` names it independently of where the data ends ("24h", or
"custom:2026-11-23:2026-11-24"), so a report computed a few samples ago can stand in for it while a
fresh one is computed (:mod:`gpuwarden.analytics.report_bundle`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pandas as pd

PRESETS: dict[str, pd.Timedelta] = {
    "1h": pd.Timedelta(hours=1),
    "6h": pd.Timedelta(hours=6),
    "24h": pd.Timedelta(hours=24),
    "7d": pd.Timedelta(days=7),
}
PRESET_LABELS: dict[str, str] = {"1h": "Last 1 hour", "6h": "Last 6 hours", "24h": "Last 24 hours",
                                 "7d": "Last 7 days", "custom": "Custom range"}
DEFAULT_PRESET = "24h"


@dataclass(frozen=True)
class Window:
    start: pd.Timestamp  # inclusive
    end: pd.Timestamp  # exclusive (newest sample + 1 s for presets)
    label: str
    key: str = ""  # the preset or custom day range this window stands for

    @property
    def span(self) -> pd.Timedelta:
        return self.end - self.start


def window_for(preset: str, oldest: pd.Timestamp, newest: pd.Timestamp,
               custom: tuple[dt.date, dt.date] | None = None) -> Window:
    """The window a preset (or a custom day range) means over a store whose newest sample is ``newest``."""
    end = newest + pd.Timedelta(seconds=1)
    if preset == "custom" and custom and len(custom) == 2:
        first = pd.Timestamp(custom[0], tz="UTC")
        last = pd.Timestamp(custom[1], tz="UTC") + pd.Timedelta(days=1)
        start, end = max(first, oldest), min(last, end)
        if start >= end:
            start = end - pd.Timedelta(hours=1)
        return Window(start, end, "custom range", f"custom:{custom[0]}:{custom[1]}")
    if preset not in PRESETS:
        preset = DEFAULT_PRESET
    start = max(end - PRESETS[preset], oldest)
    return Window(start, end, PRESET_LABELS[preset].lower(), preset)


def bucket_for(span: pd.Timedelta | str) -> str:
    """Resampling bucket for a chart over ``span``: about 60-150 points whatever the window."""
    span = PRESETS[span] if isinstance(span, str) else pd.Timedelta(span)
    if span <= pd.Timedelta(hours=1):
        return "1min"
    if span <= pd.Timedelta(hours=6):
        return "5min"
    if span <= pd.Timedelta(hours=24):
        return "10min"
    return "1h"


def report_bucket_for(span: pd.Timedelta) -> pd.Timedelta:
    """A report's over-time bucket for a window of ``span``: hourly up to 2 days, 6-hourly up to 14
    days, daily beyond (at most about 60 rows of a table, where charts want more points). A long
    window read from the recording rules costs one point per series and bucket, so a 30-day report
    reads 30 points per series, not 720 (docs/scale.md)."""
    if span <= pd.Timedelta(days=2):
        return pd.Timedelta(hours=1)
    if span <= pd.Timedelta(days=14):
        return pd.Timedelta(hours=6)
    return pd.Timedelta(days=1)
