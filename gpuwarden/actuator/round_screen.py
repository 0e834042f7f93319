"""Bad input, held out of a scheduling round: workloads that can never start as they are written.

A waiting workload is held (stays gated, planned by nobody, shown last in the queue with why) when:
- it asks for a MIG profile the GPU catalogue does not know;
- one of its pods asks for more whole GPUs than any node of the cluster has;
- its gang asks for more whole GPUs than the cluster has in all;
- the cluster itself refused to read it (``cluster.inventory.refused``: {workload key: why}, where
  the cluster has one; the Kubernetes snapshot fills it for pods it cannot make a workload of).
Holding them out keeps one bad workload from blocking or slowing the rest of the queue, and keeps
the round from failing on it. The round tells the owner once (:mod:`.queue_publication`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuwarden.fleet import ClusterSnapshot, WorkloadPhase
from gpuwarden.scheduling.mig import known_profile

WAITING = (WorkloadPhase.PENDING, WorkloadPhase.SUSPENDED)


def refused_by_cluster(cluster: object) -> dict[str, str]:
    """The cluster's own list of workloads it could not read, {key: why}; {} where it keeps none."""
    refused = getattr(getattr(cluster, "inventory", None), "refused", None)
    return {str(k): str(v) for k, v in refused.items()} if isinstance(refused, Mapping) else {}


def screen(snapshot: ClusterSnapshot, cluster: object = None) -> dict[str, str]:
    """{workload key: why it can never start as written} for the waiting workloads of ``snapshot``."""
    held = refused_by_cluster(cluster)
    per_node: dict[str, int] = {}
    for gpu in snapshot.gpus:
        if not gpu.mig_enabled:
            per_node[gpu.node] = per_node.get(gpu.node, 0) + 1
    largest, total = max(per_node.values(), default=0), sum(per_node.values())
    for ws in snapshot.workloads:
        if ws.phase not in WAITING:
            continue
        workload, request = ws.workload, ws.workload.gpus
        if request.mig_profile:
            if not known_profile(request.mig_profile):
                held[workload.key] = f"unknown MIG profile {request.mig_profile!r}"
            continue
        if request.fraction_milli < 1000 or not request.count:
            continue  # a fraction fits on any GPU
        if request.count > largest:
            held[workload.key] = (f"asks for {request.count} GPUs per pod; the largest node has {largest} "
                                  "whole GPUs")
        elif request.count * workload.gang_size > total:
            held[workload.key] = (f"gang of {workload.gang_size} pods x {request.count} GPUs = "
                                  f"{request.count * workload.gang_size} GPUs; the cluster has {total} whole GPUs")
    return held
