"""What the actuator tells other tools about each GPU node's health, in every mode.

A ``Cluster`` that can take it (fleet's :class:`~gpuwarden.fleet.capabilities.ConditionSink`: ``KubeCluster``
writes the ``GPUHealthy`` NodeCondition, :mod:`gpuwarden.kube.conditions`) is handed the round's open health findings per node; one
that cannot (the simulated fleet) is left alone. A failure is logged and never stops the round:
the condition is a courtesy to other tools, the audit log is the actuator's record.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from gpuwarden.fleet import Cluster, Finding
from gpuwarden.fleet.capabilities import ConditionSink

log = logging.getLogger("gpuwarden.actuator")


def publish_health(cluster: Cluster, health: Mapping[str, Sequence[Finding]]) -> None:
    if not isinstance(cluster, ConditionSink):
        return
    try:
        cluster.publish_conditions(health)
    except Exception as error:  # noqa: BLE001 a condition is a courtesy to other tools; the round goes on
        log.warning("actuator: could not publish node conditions: %s: %s", type(error).__name__, error)
