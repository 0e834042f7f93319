"""The scheduler's opt-in MIG manager (``gpuwarden scheduler run --mig-manager``): the MIG layout
advice (:mod:`gpuwarden.scheduling.mig_configs`) as a ``set-mig-config`` action, which sets a
node's ``nvidia.com/mig.config`` label; the GPU operator's MIG manager applies it.

Only MIG-managed nodes (the label is there) on which no GPU pod runs are changed, one a round, and
none while any node's change is still being applied (``nvidia.com/mig.config.state`` pending or
rebooting): each change is seen advertised before the next is weighed. The cluster re-checks that
the node is drained when it applies the action.
"""

from __future__ import annotations

from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot, WorkloadPhase
from gpuwarden.scheduling.mig_configs import MigNode, advise_change

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"
APPLYING = ("pending", "rebooting")


def _nodes(snapshot: ClusterSnapshot) -> list[MigNode]:
    busy: set[str] = set()
    held: dict[tuple[str, int], int] = {}  # (gpu uuid, instance id) in use
    for ws in snapshot.workloads:
        if ws.phase == WorkloadPhase.RUNNING:
            for placement in ws.placements:
                busy.add(placement.node)
                if placement.mig_instance_id is not None:
                    held[(placement.gpu_uuid, placement.mig_instance_id)] = 1
    free: dict[str, dict[str, int]] = {}
    gpus: dict[str, int] = {}
    for gpu in snapshot.gpus:
        gpus[gpu.node] = gpus.get(gpu.node, 0) + 1
        for instance in gpu.mig_instances:
            if (gpu.uuid, instance.gpu_instance_id) not in held and gpu.uuid not in snapshot.unhealthy_gpus:
                offer = free.setdefault(gpu.node, {})
                offer[instance.profile] = offer.get(instance.profile, 0) + 1
    out = []
    for node in snapshot.nodes:
        labels = snapshot.node_labels.get(node.name, {})
        if MIG_CONFIG_LABEL not in labels or node.name in snapshot.cordoned:
            continue
        out.append(MigNode(node.name, node.gpu_model, gpus.get(node.name, node.gpu_count), labels[MIG_CONFIG_LABEL],
                           drained=node.name not in busy, free=free.get(node.name, {})))
    return out


def mig_change(snapshot: ClusterSnapshot) -> Action | None:
    """The one ``set-mig-config`` action the waiting MIG work asks for now, or None."""
    if any(labels.get(MIG_CONFIG_STATE_LABEL) in APPLYING for labels in snapshot.node_labels.values()):
        return None
    demand: dict[str, int] = {}
    for ws in snapshot.workloads:
        profile = ws.workload.gpus.mig_profile
        if ws.phase == WorkloadPhase.PENDING and profile:
            demand[profile] = demand.get(profile, 0) + ws.workload.gang_size
    if not demand:
        return None
    change = advise_change(_nodes(snapshot), demand)
    if change is None:
        return None
    return Action(ActionKind.SET_MIG_CONFIG, change.node, change.reason,
                  {"config": change.wanted, "previous": change.current})
