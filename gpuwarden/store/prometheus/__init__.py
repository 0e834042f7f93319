"""Fleet samples from a Prometheus server (or anything with its HTTP API: Thanos, Mimir, VictoriaMetrics).

One module per job:

- :mod:`.client`: the HTTP query client (requests, retries, errors, durations, range chunks);
- :mod:`.samples`: the raw sample reader (exporter series -> fleet-samples rows);
- :mod:`.rollups`: the rollup reader (sums computed inside Prometheus from the recording rules);
- :mod:`.timerange`: time-range discovery (oldest and newest sample, read cheaply);
- :mod:`.expressions`: the PromQL shared with the generated recording rules;
- :mod:`.source`: :class:`PrometheusSource`, the ``SamplesSource`` that wires them together.
"""

from __future__ import annotations

from .client import MAX_POINTS_PER_SERIES, PrometheusClient, PrometheusError, PrometheusQueryError, PrometheusUnavailable
from .expressions import FAKE_BUSY_EXPR, HOARDED_EXPR, IDLE_EXPR, ROLLUP_LABELS, STATE_ROLLUPS
from .rollups import ROLLUP_POD
from .source import PrometheusSource

__all__ = ["FAKE_BUSY_EXPR", "HOARDED_EXPR", "IDLE_EXPR", "MAX_POINTS_PER_SERIES", "ROLLUP_LABELS", "ROLLUP_POD",
           "STATE_ROLLUPS", "PrometheusClient", "PrometheusError", "PrometheusQueryError", "PrometheusSource",
           "PrometheusUnavailable"]
