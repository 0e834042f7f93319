"""The Prometheus collector of ``gpuwarden metrics serve``: a pure ``collect()`` that turns the
latest :class:`~.metrics_snapshot.MetricsSnapshot` into metric families. Nothing is computed on
the scrape path; a part the snapshot lacks (no cluster snapshot: no queue figures) is absent, never
a fake 0. Tests register it in a fresh ``CollectorRegistry`` and read values with
``registry.get_sample_value``.

Every metric name and its help text is in :data:`METRICS`, the one list the Grafana dashboards,
the alert rules and the tests read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .metrics_snapshot import MetricsSnapshot

PREFIX = "gpuwarden_"

# name (without the prefix): (type, help, labels)
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "idle_gpu_hours": ("gauge", "Idle GPU-hours over the analytics window, by idle reason, team and namespace",
                       ("reason", "team", "namespace")),
    "idle_cost_usd": ("gauge", "Cost of the idle GPU-hours over the analytics window, by idle reason, team and namespace",
                      ("reason", "team", "namespace")),
    "fleet_gpus": ("gauge", "GPUs seen in the analytics window", ()),
    "fleet_gpu_hours": ("gauge", "GPU-hours observed in the analytics window", ()),
    "fleet_idle_gpu_hours": ("gauge", "Idle GPU-hours in the analytics window (every idle reason)", ()),
    "fleet_cost_usd": ("gauge", "Cost of every GPU-hour in the analytics window", ()),
    "fleet_idle_cost_usd": ("gauge", "Cost of the idle GPU-hours in the analytics window", ()),
    "fleet_efficiency_ratio": ("gauge", "Used GPU-hours over allocated GPU-hours in the analytics window", ()),
    "fleet_idle_ratio": ("gauge", "Idle GPU-hours over observed GPU-hours in the analytics window", ()),
    "analytics_window_seconds": ("gauge", "Length of the analytics window the figures cover", ()),
    "source_newest_sample_timestamp_seconds": ("gauge", "Unix time of the newest fleet sample the source holds", ()),
    "health_finding": ("gauge", "1 for each open health finding, labelled with its kind, severity, GPU, node and "
                                "recommended action", ("kind", "severity", "gpu", "node", "action")),
    "actuator_breaker_open": ("gauge", "1 while the audit log says the actuator's circuit breaker is open", ()),
    "actuator_pending_approvals": ("gauge", "Actions waiting for a person's approval", ()),
    "actuator_oldest_pending_approval_age_seconds": ("gauge", "Age of the oldest action waiting for approval (0: none)", ()),
    "actuator_actions": ("counter", "Audit-log entries by outcome and action kind", ("outcome", "kind")),
    "actuator_newest_audit_timestamp_seconds": ("gauge", "Unix time of the newest audit-log entry", ()),
    "queue_pending_workloads": ("gauge", "Workloads waiting in the scheduling queue, by team", ("team",)),
    "queue_pending_gpus": ("gauge", "GPUs (equivalents) requested by waiting workloads, by team", ("team",)),
    "queue_oldest_wait_seconds": ("gauge", "Longest wait of a queued workload, by team", ("team",)),
    "cluster_snapshot_timestamp_seconds": ("gauge", "Unix time the cluster snapshot behind the queue figures was taken", ()),
    "metrics_computed_timestamp_seconds": ("gauge", "Unix time the served figures were computed", ()),
    "metrics_compute_duration_seconds": ("gauge", "Seconds the last computation of the served figures took", ()),
    "metrics_compute_errors": ("gauge", "Parts of the figures that could not be computed in the last round, by part",
                               ("part",)),
    "metrics_info": ("gauge", "1, labelled with the price book that priced the cost figures", ("price_book",)),
    "price_book_info": ("gauge", "1, labelled with the price book's version and content hash and the inventory",
                        ("price_book", "version", "sha256", "inventory")),
}


def _family(name: str) -> Metric:
    kind, text, labels = METRICS[name]
    if kind == "counter":
        return CounterMetricFamily(PREFIX + name, text, labels=labels)
    return GaugeMetricFamily(PREFIX + name, text, labels=labels)


class SnapshotCollector(Collector):
    """Serves the snapshot ``latest()`` returns (None before the first computation: nothing)."""

    def __init__(self, latest: Callable[[], MetricsSnapshot | None]) -> None:
        self.latest = latest

    def describe(self) -> list[Metric]:
        return []  # families vary with the snapshot; describe nothing so registration never computes

    def collect(self) -> Iterator[Metric]:
        snapshot = self.latest()
        if snapshot is None:
            return
        families: dict[str, Metric] = {}

        def add(name: str, value: float | None, labels: tuple[str, ...] = ()) -> None:
            if value is None:
                return
            family = families.setdefault(name, _family(name))
            family.add_metric(list(labels), float(value))

        add("metrics_computed_timestamp_seconds", snapshot.computed_at_seconds)
        add("metrics_compute_duration_seconds", snapshot.compute_duration_seconds)
        add("metrics_info", 1.0, (snapshot.price_book,))
        if snapshot.pricing is not None:
            add("price_book_info", 1.0, (snapshot.price_book, *snapshot.pricing))
        for part in snapshot.errors:
            add("metrics_compute_errors", 1.0, (part,))
        fleet = snapshot.fleet
        if fleet is not None:
            add("analytics_window_seconds", fleet.window_seconds)
            add("fleet_gpus", fleet.gpus)
            add("fleet_gpu_hours", fleet.gpu_hours)
            add("fleet_idle_gpu_hours", fleet.idle_gpu_hours)
            add("fleet_cost_usd", fleet.cost_usd)
            add("fleet_idle_cost_usd", fleet.idle_cost_usd)
            add("fleet_efficiency_ratio", fleet.efficiency_ratio)
            add("fleet_idle_ratio", fleet.idle_ratio)
            add("source_newest_sample_timestamp_seconds", fleet.newest_sample_timestamp_seconds)
        for idle in snapshot.idle:
            labels = (idle.reason, idle.team, idle.namespace)
            add("idle_gpu_hours", idle.gpu_hours, labels)
            add("idle_cost_usd", idle.cost_usd, labels)
        for finding in snapshot.findings:
            add("health_finding", 1.0, (finding.kind, finding.severity, finding.gpu, finding.node, finding.action))
        actuator = snapshot.actuator
        if actuator is not None:
            add("actuator_breaker_open", 1.0 if actuator.breaker_open else 0.0)
            add("actuator_pending_approvals", actuator.pending_approvals)
            add("actuator_oldest_pending_approval_age_seconds", actuator.oldest_pending_age_seconds)
            add("actuator_newest_audit_timestamp_seconds", actuator.newest_entry_timestamp_seconds)
            for (outcome, kind), count in sorted(actuator.actions_by_outcome.items()):
                add("actuator_actions", count, (outcome, kind))
        add("cluster_snapshot_timestamp_seconds", snapshot.cluster_snapshot_timestamp_seconds)
        for queued in snapshot.queue or ():
            add("queue_pending_workloads", queued.pending_workloads, (queued.team,))
            add("queue_pending_gpus", queued.pending_gpus, (queued.team,))
            add("queue_oldest_wait_seconds", queued.oldest_wait_seconds, (queued.team,))
        yield from families.values()
