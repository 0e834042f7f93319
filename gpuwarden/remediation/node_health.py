"""What the actuator tells other tools about each GPU node's health, in every mode.

A ``Cluster`` that can take it (:class:`ConditionSink`: ``KubeCluster`` writes the ``GPUHealthy``
NodeCondition, :mod:`.kube.conditions`) is handed the round's open health findings per node; one
that cannot (the simulated fleet) is left alone. A failure is logged and never stops the round:
the condition is a courtesy to other tools, the audit log is the actuator's record.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from gpuwarden.fleet import Cluster, Finding

log = logging.getLogger("gpuwarden.actuator")


@runtime_checkable
class ConditionSink(Protocol):
    """Optional for a ``Cluster``: where each GPU node's health is published for other tools."""

    def publish_conditions(self, health: Mapping[str, Sequence[Finding]]) -> int: ...


def publish_health(cluster: Cluster, health: Mapping[str, Sequence[Finding]]) -> None:
    if not isinstance(cluster, ConditionSink):
        return
    try:
        cluster.publish_conditions(health)
    except Exception as error:  # noqa: BLE001 a condition is a courtesy to other tools; the round goes on
        log.warning("actuator: could not publish node conditions: %s: %s", type(error).__name__, error)
