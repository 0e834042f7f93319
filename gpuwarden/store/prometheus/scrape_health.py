"""Scrape health per node: how Prometheus' scrapes of each GPU exporter target went.

Prometheus records, for every target it scrapes, ``up`` (1: the scrape succeeded),
``scrape_duration_seconds`` and ``scrape_samples_scraped``. The targets that serve GPU series are
found from the series index of the anchor metric (``/api/v1/series``: their ``job`` and
``instance``, and the node their series name by ``node`` or ``Hostname``, as the sample reader maps
them); their scrape series are then read on the samples' grid, one row per target per step
(columns: :data:`gpuwarden.fleet.scrape_health.SCRAPE_HEALTH_COLUMNS`). A target that never served a
GPU series in the window is not a GPU exporter and is not read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuwarden.fleet.scrape_health import SCRAPE_HEALTH_COLUMN_NAMES

from .client import PrometheusClient, promql_duration

# column -> (range function, Prometheus' per-target series)
SCRAPE_QUERIES: dict[str, tuple[str, str]] = {
    "up_ratio": ("avg_over_time", "up"),
    "up_drops": ("resets", "up"),
    "scrape_duration_seconds": ("max_over_time", "scrape_duration_seconds"),
    "scrape_samples_scraped": ("max_over_time", "scrape_samples_scraped"),
}


def empty_scrape_health() -> pd.DataFrame:
    frame = pd.DataFrame({name: pd.Series(dtype="float64") for name in SCRAPE_HEALTH_COLUMN_NAMES})
    frame["timestamp"] = pd.Series(dtype="datetime64[ns, UTC]")
    for name in ("node", "job", "instance"):
        frame[name] = pd.Series(dtype="object")
    return frame[list(SCRAPE_HEALTH_COLUMN_NAMES)]


def gpu_targets(client: PrometheusClient, anchor: str, start_s: float, end_s: float) -> dict[tuple[str, str], str]:
    """(job, instance) -> node, for the targets whose series of ``anchor`` (a selected metric) name a
    node within the window. A target without ``job`` or ``instance`` labels cannot be matched to its
    scrape series and is left out."""
    out: dict[tuple[str, str], str] = {}
    for labels in client.series(anchor, start_s, end_s):
        node = labels.get("node") or labels.get("Hostname")
        job, instance = labels.get("job"), labels.get("instance")
        if node and job and instance:
            out.setdefault((job, instance), node)
    return out


def read_scrape_health(client: PrometheusClient, anchor: str, start_s: float, end_s: float, step: float,
                       lookback: float) -> pd.DataFrame:
    """One row per GPU exporter target per grid time in [start_s, end_s), each column summing up
    that target's scrapes of the ``lookback`` before it (:data:`SCRAPE_QUERIES`)."""
    targets = gpu_targets(client, anchor, start_s, end_s)
    if not targets:
        return empty_scrape_health()
    rows: dict[tuple[int, str, str], dict[str, Any]] = {}
    window = promql_duration(lookback)
    for job in sorted({job for job, _ in targets}):
        matchers = ",".join(m for m in (f'job="{_escape(job)}"', client.selector) if m)
        for column, (function, metric) in SCRAPE_QUERIES.items():
            promql = f"{function}({metric}{{{matchers}}}[{window}])"
            for first, last in client.chunks(start_s, end_s, step):
                for series in client.matrix(promql, first, last, step):
                    labels = series.get("metric", {})
                    node = targets.get((job, labels.get("instance", "")))
                    if node is None:
                        continue
                    for stamp, value in series.get("values") or []:
                        key = (int(round(float(stamp) * 1000)), job, labels["instance"])
                        rows.setdefault(key, {"node": node})[column] = float(value)
    if not rows:
        return empty_scrape_health()
    keys = list(rows)
    frame = pd.DataFrame({
        "timestamp": pd.to_datetime(np.array([k[0] for k in keys], dtype=np.int64), unit="ms", utc=True),
        "node": [rows[k]["node"] for k in keys], "job": [k[1] for k in keys], "instance": [k[2] for k in keys],
        **{column: [rows[k].get(column, np.nan) for k in keys] for column in SCRAPE_QUERIES},
    })
    return frame[list(SCRAPE_HEALTH_COLUMN_NAMES)].sort_values(["timestamp", "node", "instance"], ignore_index=True)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
