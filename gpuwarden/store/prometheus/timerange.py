"""Time-range discovery: the oldest and newest sample of a series in Prometheus, found with
queries that read little (seeks and counts, never the samples themselves)."""

from __future__ import annotations

import math
import time

import pandas as pd

from .client import MAX_POINTS_PER_SERIES, PrometheusClient, PrometheusQueryError, promql_duration


def sample_span(client: PrometheusClient, anchor: str, history: float) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """Oldest and newest sample of ``anchor`` within ``history`` seconds of now, or None.

    The newest by looking back 1 h, 1 d, 7 d, ... from now (``count(last_over_time(x[W]))``), then
    the 5-minute slot inside that window; the oldest from an instant ``count(x)`` at each day of
    the history (seeks, not a full read), then the 5-minute slot inside the first day; then 15 s
    steps inside each slot. A 30-day store of 100,000 series answers in seconds."""
    series = f"timestamp({anchor})"
    now = time.time()
    newest = client.scalar(f"max({series})", now)
    if newest is None:
        for look in (3600.0, 86400.0, 7 * 86400.0, 31 * 86400.0, history):
            if not client.scalar(f"count(last_over_time({anchor}[{promql_duration(look)}]))", now):
                continue
            slots = active_steps(client, anchor, now - look, now, max(300.0, look / 2000))
            if slots and look > 3600.0:  # narrow a long window to its last day, then 5 minutes
                slots = active_steps(client, anchor, slots[-1] - max(300.0, look / 2000), slots[-1], 300.0) or slots
            slot = slots[-1] if slots else now
            values = client.range_values(f"max({series})", slot - 300.0, slot + 300.0, 15.0)
            newest = max(values) if values else slot
            break
        if newest is None:
            return None
    first_day = newest
    try:
        days = [float(t) for result in client.matrix(f"count({anchor})", math.floor((newest - history) / 86400) * 86400,
                                                     newest, 86400.0) for t, v in result.get("values", [])]
        first_day = min(days) if days else newest
    except PrometheusQueryError:
        pass  # too big to scan here: the oldest day with a sample at midnight is a bound
    slots = active_steps(client, anchor, first_day - 86400.0, first_day, 300.0)
    first = slots[0] if slots else first_day
    values = client.range_values(f"min({series})", first - 300.0, first + 15.0, 15.0)
    oldest = min(values) if values else first - 300.0
    # At a 15 s grid, timestamp() gives each series' newest sample at the grid point, which can
    # be up to 15 s after its first: look again at 1 s around it (a window trimmed to the data
    # must not cut off its first seconds).
    fine = client.range_values(f"min({series})", oldest - 15.0, oldest, 1.0)
    oldest = min([oldest, *fine])
    return pd.Timestamp(min(oldest, newest), unit="s", tz="UTC"), pd.Timestamp(newest, unit="s", tz="UTC")


def active_steps(client: PrometheusClient, anchor: str, start: float, end: float, step: float) -> list[float]:
    """Grid times t (multiples of ``step``, first >= start, last >= end) whose (t - step, t]
    holds a sample of ``anchor``."""
    first = math.floor(start / step) * step + step
    last = math.ceil(end / step) * step
    found: list[float] = []
    while first <= last:
        upper = min(last, first + (MAX_POINTS_PER_SERIES - 2) * step)
        for result in client.matrix(f"count(last_over_time({anchor}[{promql_duration(step - 0.001)}]))", first, upper, step):
            found.extend(float(t) for t, v in result.get("values", []) if float(v) > 0)
        first = upper + step
    return sorted(found)
