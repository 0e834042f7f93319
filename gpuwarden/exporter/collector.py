"""A prometheus_client custom collector: metric families built from one immutable snapshot.

``collect()`` never reads a GPU; it renders whatever snapshot was last swapped in with
:meth:`GpuCollector.update`. Because each snapshot replaces the previous one whole, series of
GPUs or pods that disappeared vanish on the next scrape without any bookkeeping.

A GPU a pod holds through a DRA claim carries dcgm-exporter's ``dra_*`` labels besides the
catalogue's label set (``--kubernetes-enable-dra`` names them so); other series have exactly that set.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from gpuwarden.fleet import THROTTLE_REASONS, GpuReading
from gpuwarden.fleet.catalogue import GPU_LABELS, MetricSpec, load_catalogue

from .snapshot import AttributedReading, ExporterSnapshot

# prometheus_client's float text (untyped there): "+Inf", "1.0e+06" as generate_latest writes them.
go_float: Callable[[float], str] = floatToGoString


def gpu_labels(reading: GpuReading, driver_version: str) -> dict[str, str]:
    """dcgm-exporter's label set for one GPU or MIG instance; empty strings where unknown. A
    reading held through a DRA claim adds its ``dra_*`` labels."""
    labels = {
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
        "node": reading.node,
    }
    if isinstance(reading, AttributedReading) and reading.claim is not None:
        labels.update(reading.claim.labels())
    return labels


def reading_state(reading: GpuReading, state: str | None) -> str | None:
    """The attribution state one reading's series carry: the snapshot's, except "failed" for a GPU
    without a pod label that a DRA device nobody could map may be (its owner is unknown)."""
    if state == "known" and isinstance(reading, AttributedReading) and reading.owner_unknown:
        return "failed"
    return state


def _present(value: object) -> bool:
    """An unsupported field is an absent key; None or NaN are treated the same way."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _source(reading: GpuReading, column: str) -> float | None:
    """One source value of a reading, computing the derived sources; None when absent."""
    values = reading.values
    if column == "gpu_lost":
        return 1.0 if reading.lost else 0.0
    if column == "mem_free_bytes":
        free = values.get("mem_free_bytes")  # set on a pod's series of a shared GPU: the GPU's free memory
        if _present(free):
            return float(free)  # type: ignore[arg-type]
        total, used = values.get("mem_total_bytes"), values.get("mem_used_bytes")
        if not (_present(total) and _present(used)):
            return None
        reserved = values.get("mem_reserved_bytes")  # v2 semantics: reserved is neither used nor free
        return float(total) - float(used) - (float(reserved) if _present(reserved) else 0.0)  # type: ignore[arg-type]
    value = values.get(column)
    return float(value) if _present(value) else None  # type: ignore[arg-type]


def _family(spec: MetricSpec) -> tuple[Metric, str]:
    """An empty family for a spec, and the sample name its series use."""
    if spec.type == "counter" and spec.metric.endswith("_total"):
        return Metric(spec.metric[: -len("_total")], spec.help, "counter"), spec.metric
    if spec.type == "counter":  # keep the DCGM name exactly: untyped, not renamed to *_total
        return Metric(spec.metric, spec.help, "unknown"), spec.metric
    return Metric(spec.metric, spec.help, "gauge"), spec.metric


def _values(spec: MetricSpec, reading: GpuReading, state: str | None = None) -> Iterator[tuple[str | None, float]]:
    """(value of the row's extra label or None, sample value) for one reading; ``state`` is the
    snapshot's attribution state (a ``state`` row's label value)."""
    if spec.transform == "state":
        if state is not None:
            yield state, 1.0 * spec.scale
    elif spec.transform == "value":
        value = _source(reading, spec.source_column)
        if value is not None:
            yield None, value * spec.scale
    elif spec.transform == "pattern":
        regex = spec.source_regex()
        for key in sorted(reading.values):
            match = regex.match(key)
            if match:
                value = reading.values[key]
                if _present(value):
                    yield match.group(1), float(value) * spec.scale
    elif spec.transform == "bits":
        mask = _source(reading, spec.source_column)
        if mask is not None:
            for reason, bit in THROTTLE_REASONS.items():
                yield reason, (1.0 if int(mask) & bit else 0.0) * spec.scale


def _samples(spec: MetricSpec, reading: GpuReading, labels: Mapping[str, str],
             state: str | None = None) -> Iterator[tuple[dict[str, str], float]]:
    for extra, value in _values(spec, reading, state):
        yield ({**labels, spec.label: extra} if extra is not None else dict(labels)), value


def build_families(snapshot: ExporterSnapshot, catalogue: Sequence[MetricSpec]) -> list[Metric]:
    """Every metric family for one snapshot: a pure function of its arguments."""
    families: list[Metric] = []
    labelled = [(r, gpu_labels(r, snapshot.driver_version)) for r in snapshot.readings]
    for spec in catalogue:
        family, sample_name = _family(spec)
        for reading, labels in labelled:
            for sample_labels, value in _samples(spec, reading, labels, reading_state(reading, snapshot.attribution)):
                family.add_sample(sample_name, sample_labels, value)
        if family.samples:
            families.append(family)
    families.extend(_self_metrics(snapshot))
    return families


def _gauge(name: str, documentation: str, node: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["node"])
    family.add_metric([node], value)
    return family


def _counter(name: str, documentation: str, node: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=["node"])
    family.add_metric([node], value)
    return family


def _self_metrics(snapshot: ExporterSnapshot) -> Iterator[Metric]:
    """The exporter's own health; each carries the ``node`` label like every GPU series."""
    node = snapshot.node or (snapshot.readings[0].node if snapshot.readings else "")
    yield _gauge("gpuwarden_exporter_last_collection_success",
                 "Whether the latest collection read the GPUs (1) or failed (0).", node, 1.0 if snapshot.success else 0.0)
    yield _gauge("gpuwarden_exporter_gpus", "GPUs (and MIG instances) in the served snapshot.", node, len(snapshot.readings))
    yield _gauge("gpuwarden_exporter_collection_stale",
                 "1 when the served snapshot is stale: a collection hung past the watchdog or none succeeded lately.",
                 node, 1.0 if snapshot.stale else 0.0)
    if snapshot.pod_attribution is not None:
        yield _gauge("gpuwarden_exporter_pod_attribution_up",
                     "Whether the kubelet pod-resources API answered the latest collection (1) or not (0).",
                     node, 1.0 if snapshot.pod_attribution else 0.0)
    if snapshot.dra is not None:
        yield _gauge("gpuwarden_exporter_dra_devices",
                     "GPUs and MIG devices pods hold through DRA claims (driver gpu.nvidia.com) mapped to a GPU here.",
                     node, snapshot.dra.devices)
        yield _gauge("gpuwarden_exporter_dra_devices_unresolved",
                     "DRA devices (driver gpu.nvidia.com) pods hold now whose name maps to no GPU here: not attributed.",
                     node, snapshot.dra.unresolved)
        yield _counter("gpuwarden_exporter_dra_devices_unresolved_total",
                       "DRA device allocations (pod, container, claim, device) first seen unresolved.",
                       node, snapshot.dra.unresolved_total)
    if snapshot.timestamp_seconds is not None:
        yield _gauge("gpuwarden_exporter_last_collection_timestamp_seconds",
                     "Unix time the latest collection attempt ended.", node, snapshot.timestamp_seconds)
    if snapshot.duration_seconds is not None:
        yield _gauge("gpuwarden_exporter_collection_duration_seconds",
                     "How long the latest collection attempt took.", node, snapshot.duration_seconds)
    if snapshot.last_success_timestamp_seconds is not None:
        yield _gauge("gpuwarden_exporter_last_successful_collection_timestamp_seconds",
                     "Unix time of the latest successful collection (the age of the served GPU series).",
                     node, snapshot.last_success_timestamp_seconds)


def escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _exposed(spec: MetricSpec) -> tuple[str, str]:
    """The name on the HELP/TYPE lines and the type, as the text format 0.0.4 writes them."""
    if spec.type == "counter" and spec.metric.endswith("_total"):
        return spec.metric, "counter"
    if spec.type == "counter":
        return spec.metric, "untyped"
    return spec.metric, "gauge"


def render_text(snapshot: ExporterSnapshot, catalogue: Sequence[MetricSpec]) -> bytes:
    """The text exposition (format 0.0.4) of one snapshot, byte for byte what
    ``generate_latest`` writes for :func:`build_families`, several times faster: each reading's
    label string is escaped and sorted once, not once per sample."""
    base_keys = sorted(GPU_LABELS)
    prepared: list[tuple[GpuReading, list[str], list[str], str | None, dict[object, Any]]] = []
    for reading in snapshot.readings:
        labels = gpu_labels(reading, snapshot.driver_version)
        keys = base_keys if len(labels) == len(base_keys) else sorted(labels)
        prepared.append((reading, keys, [f'{k}="{escape_label_value(labels[k])}"' for k in keys],
                         reading_state(reading, snapshot.attribution), {}))
    out: list[str] = []
    for spec in catalogue:
        lines: list[str] = []
        for reading, keys, parts, state, cache in prepared:
            values = list(_values(spec, reading, state))
            if not values:
                continue
            if spec.label:
                split = cache.get(spec.label)
                if split is None:
                    position = bisect.bisect(keys, spec.label)
                    split = cache[spec.label] = (",".join(parts[:position]), ",".join(parts[position:]))
                head, tail = split
                for extra, value in values:
                    middle = f'{spec.label}="{escape_label_value(extra or "")}"'
                    body = ",".join(p for p in (head, middle, tail) if p)
                    lines.append(f"{spec.metric}{{{body}}} {go_float(value)}\n")
            else:
                joined = cache.get(None)
                if joined is None:
                    joined = cache[None] = ",".join(parts)
                for _, value in values:
                    lines.append(f"{spec.metric}{{{joined}}} {go_float(value)}\n")
        if lines:
            name, kind = _exposed(spec)
            out.append(f"# HELP {name} {spec.help.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n")
            out.append(f"# TYPE {name} {kind}\n")
            out.extend(lines)
    for family in _self_metrics(snapshot):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        out.append(f"# HELP {name} {family.documentation}\n# TYPE {name} {family.type}\n")
        for sample in family.samples:
            body = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(sample.labels.items()))
            out.append(f"{sample.name}{{{body}}} {go_float(sample.value)}\n")
    return "".join(out).encode("utf-8")


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

    def render(self) -> bytes:
        """The current snapshot as text (what ``generate_latest`` would write, faster)."""
        return render_text(self._snapshot, self.catalogue)
