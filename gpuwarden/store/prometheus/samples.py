"""The raw sample reader: fleet-samples rows from the exporter's series in Prometheus.

One ``query_range`` per exported metric family per chunk of the window, at ``step`` (aligned to
multiples of the step, so repeated reads see the same grid), turned back into fleet-samples rows
through the metric catalogue (the same inversion the embedded scraper uses,
:class:`~gpuwarden.store.series.SeriesMapper`). Rows are stamped with the grid time; a row holds
the newest sample of the step before it (``last_over_time(metric[lookback])``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pandas as pd

from gpuwarden.fleet import IDENTITY_COLUMN_NAMES

from ..schema import empty_samples
from ..series import FrameAssembler, SeriesMapper
from .client import PrometheusClient, log, promql_duration


def read_samples(client: PrometheusClient, mapper: SeriesMapper, start_s: float, end_s: float, wanted: list[str],
                 step: float, lookback: float) -> pd.DataFrame:
    """Fleet samples with ``start_s <= timestamp < end_s`` on the ``step`` grid, columns ``wanted``."""
    metric_columns = [c for c in wanted if c not in IDENTITY_COLUMN_NAMES]
    # Rows exist where a GPU has series; with only identity columns asked, read a cheap one.
    metrics = mapper.metrics_for(metric_columns or ["mem_total_bytes"])
    if "attribution" in wanted:  # the exporter's gpuwarden_pod_attribution_state, where it serves it
        metrics += [m for m in mapper.state_metrics() if m not in metrics]
    jobs = [(metric, first, last) for first, last in client.chunks(start_s, end_s, step) for metric in metrics]
    if not jobs:
        return empty_samples()[wanted]
    assembler = FrameAssembler(mapper)

    def fetch(job: tuple[str, float, float]) -> tuple[str, list[dict[str, Any]]]:
        metric, first, last = job
        promql = f"last_over_time({client.selected(metric)}[{promql_duration(lookback)}])"
        return metric, client.matrix(promql, first, last, step)

    started = time.perf_counter()
    points = 0
    with ThreadPoolExecutor(max_workers=min(client.concurrency, len(jobs))) as pool:
        for metric, series_list in pool.map(fetch, jobs):
            for series in series_list:
                values = series.get("values") or []
                if not values:
                    continue
                stamps = np.fromiter((v[0] for v in values), dtype=np.float64, count=len(values))
                numbers = np.array([v[1] for v in values], dtype=np.float64)
                times_ns = np.round(stamps * 1000).astype(np.int64) * 1_000_000
                assembler.add(metric, series.get("metric", {}), times_ns, numbers)
                points += len(values)
    frame = assembler.frame(wanted)
    log.info("prometheus read %d metric(s) x %d chunk(s): %d points -> %d rows in %.2fs",
             len(metrics), len(jobs) // len(metrics), points, len(frame), time.perf_counter() - started)
    return frame
