"""The actuator process's own gauges, on the registry they are handed (or a fresh one), never on
prometheus_client's global registry: two actuators in one process (tests, the demo beside the
scheduler) never collide, and ``gpuwarden actuator run --metrics-listen`` serves the registry
its actuator fills. ``GpuwardenActuatorCircuitOpen`` and ``GpuwardenActuatorRoundsStopped``
(rules/operations) read them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

PACE_LABELS = ["pool", "detector"]


class RemediationMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.breaker_open = Gauge("gpuwarden_actuator_circuit_open", "1 while the actuator's circuit breaker is open "
                                  "(a safety limit was reached; a person must reset it)", registry=r)
        # Set when a round this replica led ends (standbys never set it): a live process whose rounds
        # stop (a hung API call, a round failing every time) is seen by GpuwardenActuatorRoundsStopped.
        self.last_round = Gauge("gpuwarden_actuator_last_round_timestamp_seconds",
                                "When the latest reconcile round this replica led ended (Unix seconds)", registry=r)
        self.pace = Gauge("gpuwarden_remediation_pace",
                          "Disruptive actions allowed in flight per node pool and detector (slow start: 1, doubled "
                          "after each proven success, back to 1 after a failure)", PACE_LABELS, registry=r)
        self.in_flight = Gauge("gpuwarden_remediation_in_flight",
                               "Disruptive actions applied and not yet proven or failed, per node pool and detector",
                               PACE_LABELS, registry=r)
