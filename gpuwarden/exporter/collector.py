"""A prometheus_client custom collector: metric families built from one immutable snapshot.

``collect()`` never reads a GPU; it renders whatever snapshot was last swapped in with
:meth:`GpuCollector.update`. Because each snapshot replaces the previous one whole, series of
GPUs or pods that disappeared vanish on the next scrape without any bookkeeping.
"""

from __future__ import annotations

import math
from typing import Iterator, Mapping, Sequence

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpuwarden.fleet import THROTTLE_REASONS, GpuReading

from gpuwarden.fleet.catalogue import MetricSpec, load_catalogue
from .snapshot import ExporterSnapshot


def gpu_labels(reading: GpuReading, driver_version: str) -> dict[str, str]:
    """dcgm-exporter's label set for one GPU or MIG instance; empty strings where unknown."""
    return {
        "gpu": str(reading.gpu_index),
        "UUID": reading.gpu_uuid,
        "pci_bus_id": reading.pci_bus_id,
        "device": f"nvidia{reading.gpu_index}",
        "modelName": reading.model,
        "Hostname": reading.node,
        "GPU_I_PROFILE": reading.mig_profile or "",
        "GPU_I_ID": "" if reading.mig_instance_id is None else str(reading.mig_instance_id),
        "pod": reading.pod or "",
        "namespace": reading.namespace or "",
        "container": reading.container or "",
        "DCGM_FI_DRIVER_VERSION": driver_version,
    }


def _present(value: object) -> bool:
    """An unsupported field is an absent key; None or NaN are treated the same way."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _source(reading: GpuReading, column: str) -> float | None:
    """One source value of a reading, computing the derived sources; None when absent."""
    values = reading.values
    if column == "gpu_lost":
        return 1.0 if reading.lost else 0.0
    if column == "mem_free_bytes":
        total, used = values.get("mem_total_bytes"), values.get("mem_used_bytes")
        if not (_present(total) and _present(used)):
            return None
        return float(total) - float(used)  # type: ignore[arg-type]
    value = values.get(column)
    return float(value) if _present(value) else None  # type: ignore[arg-type]


def _family(spec: MetricSpec) -> tuple[Metric, str]:
    """An empty family for a spec, and the sample name its series use."""
    if spec.type == "counter" and spec.metric.endswith("_total"):
        return Metric(spec.metric[: -len("_total")], spec.help, "counter"), spec.metric
    if spec.type == "counter":  # keep the DCGM name exactly: untyped, not renamed to *_total
        return Metric(spec.metric, spec.help, "unknown"), spec.metric
    return Metric(spec.metric, spec.help, "gauge"), spec.metric


def _samples(spec: MetricSpec, reading: GpuReading, labels: Mapping[str, str]) -> Iterator[tuple[dict[str, str], float]]:
    if spec.transform == "value":
        value = _source(reading, spec.source_column)
        if value is not None:
            yield dict(labels), value * spec.scale
    elif spec.transform == "pattern":
        regex = spec.source_regex()
        for key in sorted(reading.values):
            match = regex.match(key)
            value = reading.values[key]
            if match and _present(value):
                yield {**labels, spec.label: match.group(1)}, float(value) * spec.scale
    elif spec.transform == "bits":
        mask = _source(reading, spec.source_column)
        if mask is not None:
            for reason, bit in THROTTLE_REASONS.items():
                yield {**labels, spec.label: reason}, (1.0 if int(mask) & bit else 0.0) * spec.scale


def build_families(snapshot: ExporterSnapshot, catalogue: Sequence[MetricSpec]) -> list[Metric]:
    """Every metric family for one snapshot: a pure function of its arguments."""
    families: list[Metric] = []
    labelled = [(r, gpu_labels(r, snapshot.driver_version)) for r in snapshot.readings]
    for spec in catalogue:
        family, sample_name = _family(spec)
        for reading, labels in labelled:
            for sample_labels, value in _samples(spec, reading, labels):
                family.add_sample(sample_name, sample_labels, value)
        if family.samples:
            families.append(family)
    families.extend(_self_metrics(snapshot))
    return families


def _self_metrics(snapshot: ExporterSnapshot) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "gpuwarden_exporter_last_collection_success",
        "Whether the latest collection read the GPUs (1) or failed (0).",
        value=1.0 if snapshot.success else 0.0,
    )
    yield GaugeMetricFamily("gpuwarden_exporter_gpus", "GPUs (and MIG instances) in the served snapshot.", value=len(snapshot.readings))
    if snapshot.timestamp_seconds is not None:
        yield GaugeMetricFamily(
            "gpuwarden_exporter_last_collection_timestamp_seconds",
            "Unix time the latest collection attempt ended.",
            value=snapshot.timestamp_seconds,
        )
    if snapshot.duration_seconds is not None:
        yield GaugeMetricFamily(
            "gpuwarden_exporter_collection_duration_seconds",
            "How long the latest collection attempt took.",
            value=snapshot.duration_seconds,
        )
    if snapshot.last_success_timestamp_seconds is not None:
        yield GaugeMetricFamily(
            "gpuwarden_exporter_last_successful_collection_timestamp_seconds",
            "Unix time of the latest successful collection (the age of the served GPU series).",
            value=snapshot.last_success_timestamp_seconds,
        )


class GpuCollector:
    """Register in a ``CollectorRegistry``; swap snapshots in with :meth:`update`."""

    def __init__(self, snapshot: ExporterSnapshot | None = None, catalogue: Sequence[MetricSpec] | None = None):
        self.catalogue: tuple[MetricSpec, ...] = tuple(catalogue) if catalogue is not None else load_catalogue()
        self._snapshot = snapshot or ExporterSnapshot()

    @property
    def snapshot(self) -> ExporterSnapshot:
        return self._snapshot

    def update(self, snapshot: ExporterSnapshot) -> None:
        """Replace the served snapshot (one atomic reference swap)."""
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from build_families(self._snapshot, self.catalogue)
