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

from gpuwarden.fleet import IDENTITY_COLUMN_NAMES, XID_COLUMN_NAMES

from ..schema import empty_samples
from ..series import FrameAssembler, SeriesMapper
from .client import PrometheusClient, log, promql_duration
from .series_checks import ReadNotes, check_series
from .throttle_gauge import THROTTLE_GAUGES, bits_spec, reason_series
from .xid_count import XID_COUNT
from .xid_gauge import XID_GAUGE, XidGauges


def read_samples(client: PrometheusClient, mapper: SeriesMapper, start_s: float, end_s: float, wanted: list[str],
                 step: float, lookback: float, notes: ReadNotes | None = None) -> pd.DataFrame:
    """Fleet samples with ``start_s <= timestamp < end_s`` on the ``step`` grid, columns ``wanted``.

    Series that name no GPU are skipped and odd ones kept, each with a note in ``notes``
    (:mod:`.series_checks`); where XID columns are wanted, dcgm-exporter's last-XID gauge gives
    the XID events of GPUs without gpuwarden's counter (:mod:`.xid_gauge`), and its throttle
    bitmask, where enabled, the throttle reasons (:mod:`.throttle_gauge`)."""
    notes = notes if notes is not None else ReadNotes()
    metric_columns = [c for c in wanted if c not in IDENTITY_COLUMN_NAMES]
    # Rows exist where a GPU has series; with only identity columns asked, read a cheap one.
    metrics = mapper.metrics_for(metric_columns or ["mem_total_bytes"])
    if "attribution" in wanted:  # the exporter's gpuwarden_pod_attribution_state, where it serves it
        metrics += [m for m in mapper.state_metrics() if m not in metrics]
    chunks = client.chunks(start_s, end_s, step)
    jobs = [(metric, first, last) for first, last in chunks for metric in metrics]
    counter_metric = _xid_counter(mapper) if any(c in XID_COLUMN_NAMES for c in wanted) else None
    if counter_metric is not None:
        # One step before each chunk: the value a change at the chunk's first point is a change from.
        jobs += [(metric, first - step, last) for first, last in chunks for metric in (XID_GAUGE, XID_COUNT)]
    bits = bits_spec(mapper.catalogue) if "throttle_reasons_bitmask" in wanted else None
    if bits is not None:  # dcgm-exporter's bitmask gauge, where its configuration enables it
        jobs += [(metric, first, last) for first, last in chunks for metric in THROTTLE_GAUGES]
    if not jobs:
        return empty_samples()[wanted]
    assembler = FrameAssembler(mapper)
    counters = {spec.metric for spec in mapper.catalogue if spec.type == "counter"}
    gauges = XidGauges()

    def fetch(job: tuple[str, float, float]) -> tuple[str, float, list[dict[str, Any]]]:
        metric, first, last = job
        promql = f"last_over_time({client.selected(metric)}[{promql_duration(lookback)}])"
        return metric, first, client.matrix(promql, first, last, step)

    started = time.perf_counter()
    points = 0
    with ThreadPoolExecutor(max_workers=min(client.concurrency, len(jobs))) as pool:
        for metric, _, series_list in pool.map(fetch, jobs):
            for series in series_list:
                values = series.get("values") or []
                if not values:
                    continue
                labels = series.get("metric", {})
                stamps = np.fromiter((v[0] for v in values), dtype=np.float64, count=len(values))
                numbers = np.array([v[1] for v in values], dtype=np.float64)
                if not check_series(metric, labels, numbers, metric in counters, notes):
                    continue
                times_ns = np.round(stamps * 1000).astype(np.int64) * 1_000_000
                if metric in (XID_GAUGE, XID_COUNT):
                    gauges.add(labels, times_ns, numbers, window_count=metric == XID_COUNT)
                    continue
                if metric == counter_metric:
                    gauges.counted.add(gauges.gpu(labels))
                if bits is not None and metric in THROTTLE_GAUGES:
                    for reason_labels, reason_values in reason_series(bits, labels, numbers):
                        assembler.add(bits.metric, reason_labels, times_ns, reason_values)
                    continue
                assembler.add(metric, labels, times_ns, numbers)
                points += len(values)
    if counter_metric is not None:
        _add_gauge_events(assembler, gauges, counter_metric, start_s, step, notes)
    frame = assembler.frame(wanted)
    log.info("prometheus read %d metric(s) x %d chunk(s): %d points -> %d rows in %.2fs",
             len(metrics), len(chunks), points, len(frame), time.perf_counter() - started)
    return frame


def _xid_counter(mapper: SeriesMapper) -> str | None:
    """The catalogue's per-code XID counter (``gpuwarden_xid_errors_total``), or None."""
    return next((s.metric for s in mapper.catalogue if s.transform == "pattern" and s.source_column == "xid_*_total"), None)


def _add_gauge_events(assembler: FrameAssembler, gauges: XidGauges, counter_metric: str, start_s: float,
                      step: float, notes: ReadNotes) -> None:
    """The gauge's (or windowed count's) XID events, added as the per-code counter gpuwarden's
    exporter would serve."""
    start_ns = int(round(start_s * 1000)) * 1_000_000
    for labels, xid, times_ns, counts in gauges.events(start_ns, int(round(step * 1e9))):
        assembler.add(counter_metric, {**labels, "xid": xid}, times_ns, counts)
    if gauges.windowed:
        notes.add(f"XID events of {len(gauges.windowed)} GPU(s) come from dcgm-exporter's {XID_COUNT} (XIDs per code "
                  "over its window): each rise of the count is that many new XIDs; an XID replacing an older one of "
                  "the same code leaving the window within one step is not visible")
    if gauges.gauge_gpus():
        notes.add(f"XID events of {gauges.gauge_gpus()} GPU(s) come from dcgm-exporter's {XID_GAUGE} (the last XID, a "
                  "gauge): a change of its value is one event; the same code again, or two XIDs within one step, is "
                  "not visible (gpuwarden's exporter counts every XID: gpuwarden_xid_errors_total)")
    for labels, code in gauges.earlier_codes(start_ns):
        notes.add(f"GPU {labels.get('UUID')} on {labels.get('node') or labels.get('Hostname')}: its last XID before the "
                  f"window was {code}, at an unknown time: not counted as an event of this window")
