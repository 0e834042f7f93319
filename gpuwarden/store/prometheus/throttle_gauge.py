"""Throttle reasons from dcgm-exporter's extended configuration: ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``
(``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` in newer DCGM), NVML's clocks-event bitmask as one gauge.
Each bit becomes the 0/1 per-reason series gpuwarden's exporter serves
(``gpuwarden_gpu_throttle_reason{reason=...}``), so the throttle detectors read both alike."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from gpuwarden.fleet import THROTTLE_REASONS
from gpuwarden.fleet.catalogue import MetricSpec

THROTTLE_GAUGES: tuple[str, ...] = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")


def bits_spec(catalogue: Sequence[MetricSpec]) -> MetricSpec | None:
    """The catalogue's per-reason throttle series, or None."""
    return next((s for s in catalogue if s.transform == "bits" and s.source_column == "throttle_reasons_bitmask"), None)


def reason_series(spec: MetricSpec, labels: Mapping[str, str], bitmask: np.ndarray) -> Iterator[tuple[dict[str, str], np.ndarray]]:
    """(labels, 0/1 values in the catalogue's scale) of each reason, from the bitmask values."""
    measured = np.isfinite(bitmask)
    mask = np.where(measured, bitmask, 0).astype(np.int64)
    for reason, bit in THROTTLE_REASONS.items():
        values = np.where(measured, ((mask & bit) != 0).astype(np.float64) * spec.scale, np.nan)
        yield {**labels, spec.label: reason}, values
