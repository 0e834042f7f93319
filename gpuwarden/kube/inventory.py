"""A ``ClusterSnapshot`` from a few paged lists: nodes, namespaces, pods, jobs, PDBs, PriorityClasses
and, where the CRDs exist, Kueue Workloads, ClusterQueues and WorkloadPriorityClasses. The number
of requests grows with pages, never with pods (no per-pod GETs).

Nodes are read by :mod:`.inventory_nodes` (GPUs, MIG, time-slicing, topology labels), pods and Jobs
grouped into workloads by :mod:`.inventory_workloads` (gated, admitted, timed out, refused).
Where the cluster serves Dynamic Resource Allocation (``resource.k8s.io/v1``), its slices and
claims are read first (:mod:`.dra`, four more lists): a node's published GPUs, and the devices a
pod's claims hold, in GPU units (``Inventory.dra``).
Kubernetes does not name GPUs, so GPUs are ``NODE/gpu-I`` in the snapshot and pods are laid on them
in order; findings reach pods through their node, namespace and pod name.

Teams: the namespaces labelled ``gpuwarden.io/queue`` and their quota annotations
(:mod:`.team_quotas`), or a Kueue ClusterQueue's GPU quota. The snapshot says which namespaces are
in the queue (``ClusterSnapshot.queue_namespaces``): work elsewhere holds capacity and is never
touched. Bound pods asking no GPU are counted as each node's CPU and memory overhead.
"""

from __future__ import annotations

import logging

from kubernetes.utils import parse_quantity

from gpuwarden.fleet import NO_CAP_GPUS, ClusterSnapshot, Team
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .answers import reading
from .api import Json, KubeApi, KubeFailure
from .dra import read_dra
from .dra_nodes import DRA_NODE_LABEL, DRA_ONLY_NODE_LABEL, PLUGIN_NODE_LABEL, devices_gone
from .inventory_nodes import DEFAULT_LABELS, GPU, NodeLabels, NodeOffer, read_node, serves_plugin_gpus
from .inventory_model import Group, Inventory
from .inventory_workloads import WorkloadReader
from .podgroups import read_pod_groups
from .team_quotas import TeamQuotas

log = logging.getLogger("gpuwarden.kube")

KUEUE = ("kueue.x-k8s.io", "v1beta1")
ACTIVE_PHASES = "status.phase!=Succeeded,status.phase!=Failed"
ADMISSION_TIMEOUT_SECONDS = 300.0  # an admitted pod not bound by then releases its capacity

__all__ = ["Inventory", "KUEUE", "NodeLabels", "read_snapshot"]


def read_snapshot(api: KubeApi, page_size: int = 500, clock: Clock = SYSTEM_CLOCK, labels: NodeLabels = DEFAULT_LABELS,
                  admission_timeout_seconds: float = ADMISSION_TIMEOUT_SECONDS,
                  previous: ClusterSnapshot | None = None) -> tuple[ClusterSnapshot, Inventory]:
    """The snapshot and the inventory; ``previous`` (the last snapshot) lends its ``Workload``
    objects to workloads that did not change."""
    taken_at = clock.now()
    inventory = Inventory(dra=read_dra(api, page_size))
    offers: dict[str, NodeOffer] = {}
    cordoned, taints, node_labels, listed = set(), {}, {}, set()
    for item in api.list_all(api.core.list_node, resource="nodes", page_size=page_size):
        with reading("node", item):
            listed.add(str(item["metadata"]["name"]))
            offer = read_node(item, labels, inventory.dra.by_node.get(item["metadata"]["name"], ()))
            if offer is None:
                continue
            name = offer.node.name
            offers[name] = offer
            spec = item.get("spec") or {}
            if spec.get("unschedulable"):
                cordoned.add(name)
            own = tuple(f"{t['key']}={t.get('value', '')}:{t.get('effect', '')}" for t in spec.get("taints") or ())
            if own:
                taints[name] = own
            node_labels[name] = dict(item["metadata"].get("labels") or {})
            if offer.dra_placements:  # the snapshot's own label: where pods' claims may be allocated
                node_labels[name][DRA_NODE_LABEL] = name
            if serves_plugin_gpus(item):  # and where the device plugin's resources can be bound
                node_labels[name][PLUGIN_NODE_LABEL] = "true"
            elif offer.dra_placements:
                inventory.dra.dra_only_nodes.add(name)
                node_labels[name][DRA_ONLY_NODE_LABEL] = "true"
    inventory.dra.attach(offers)

    namespace_labels: dict[str, dict[str, str]] = {}
    quotas = TeamQuotas()
    for item in api.list_all(api.core.list_namespace, resource="namespaces", page_size=page_size):
        with reading("namespace", item):
            meta = item["metadata"]
            namespace_labels[meta["name"]] = dict(meta.get("labels") or {})
            quotas.add_namespace(meta["name"], namespace_labels[meta["name"]], meta.get("annotations") or {})
    quotas.finish()
    inventory.queue_namespaces = set(quotas.queue_namespaces)
    inventory.refused_teams = dict(quotas.refused_at)
    team_quota: dict[str, tuple[float, float]] = {}  # Kueue ClusterQueues' GPU quotas: guaranteed, burst

    inventory.pdbs = len(api.list_all(api.policy.list_pod_disruption_budget_for_all_namespaces,
                                      resource="poddisruptionbudgets", page_size=page_size))
    with reading("priorityclasses"):
        inventory.priority_classes = {p["metadata"]["name"]: int(p.get("value", 0)) for p in api.list_all(
            api.scheduling.list_priority_class, resource="priorityclasses", page_size=page_size)}

    kueue_owner: dict[tuple[str, str, str], Json] = {}  # (namespace, owner kind, owner name) -> Workload
    kueue_workloads: list[Json] = []
    try:
        kueue_workloads = api.list_all(api.custom.list_cluster_custom_object, *KUEUE, "workloads",
                                       resource="workloads.kueue.x-k8s.io", page_size=page_size)
        inventory.kueue = True
        for queue in api.list_all(api.custom.list_cluster_custom_object, *KUEUE, "clusterqueues",
                                  resource="clusterqueues.kueue.x-k8s.io", page_size=page_size):
            with reading("clusterqueue", queue):
                nominal, borrow = 0.0, None
                for group in (queue.get("spec") or {}).get("resourceGroups") or ():
                    for flavor in group.get("flavors") or ():
                        for resource in flavor.get("resources") or ():
                            if resource.get("name") == GPU:
                                nominal += float(parse_quantity(resource.get("nominalQuota", "0")))
                                if resource.get("borrowingLimit") is not None:
                                    borrow = (borrow or 0.0) + float(parse_quantity(resource["borrowingLimit"]))
                team_quota[queue["metadata"]["name"]] = (nominal, nominal + borrow if borrow is not None else NO_CAP_GPUS)
        with reading("workloadpriorityclasses"):
            inventory.workload_priority_classes = {
                p["metadata"]["name"]: int(p.get("value", 0)) for p in api.list_all(
                    api.custom.list_cluster_custom_object, *KUEUE, "workloadpriorityclasses",
                    resource="workloadpriorityclasses.kueue.x-k8s.io", page_size=page_size)}
    except KubeFailure as failure:
        if failure.status == 403:  # installed, but the chart did not grant Kueue (remediation.kueue=false)
            log.warning("Kueue: %s; planning without Kueue", failure.message)
            inventory.kueue = False
        elif not failure.gone:
            raise
    for kueue_workload in kueue_workloads:
        with reading("workload", kueue_workload):
            meta = kueue_workload["metadata"]
            for owner in meta.get("ownerReferences") or ():
                kueue_owner[(meta.get("namespace", ""), owner.get("kind"), owner.get("name"))] = kueue_workload

    pod_groups = read_pod_groups(api, page_size)  # native gangs (scheduling.k8s.io), where served
    reader = WorkloadReader(inventory, taken_at, admission_timeout_seconds,
                            {w.workload.key: w.workload for w in previous.workloads} if previous else None,
                            pod_groups=pod_groups)
    for pod in api.list_all(api.core.list_pod_for_all_namespaces, resource="pods", page_size=page_size,
                            field_selector=ACTIVE_PHASES):
        with reading("pod", pod):
            reader.add_pod(pod)
    # Suspended Jobs have no pods: the jobs list shows them (and lets a resume be planned).
    for job in api.list_all(api.batch.list_job_for_all_namespaces, resource="jobs", page_size=page_size):
        with reading("job", job):
            reader.add_job(job)
    for (namespace, _, owner_name), kueue_workload in kueue_owner.items():  # suspended-by, where Kueue suspends
        with reading("workload", kueue_workload):
            reader.add_kueue_annotations(f"{namespace}/{owner_name}",
                                         kueue_workload["metadata"].get("annotations") or {})

    def kueue_of(group: Group) -> Json | None:
        return kueue_owner.get((group.namespace, group.controller, group.name))

    with reading("pods and jobs"):
        workloads = reader.build(quotas.team_of, offers, kueue_of)
    teams = dict(quotas.teams)
    for name, (guaranteed, burst) in team_quota.items():
        if name not in quotas.refused:
            teams[name] = Team(name, guaranteed, burst)
    tainted = inventory.dra.health_notes()  # devices their driver took out: unhealthy, and findings
    snapshot = ClusterSnapshot(
        taken_at=taken_at, nodes=tuple(o.node for o in offers.values()),
        gpus=tuple(g for o in offers.values() for g in o.gpus), workloads=tuple(workloads),
        teams=tuple(teams[t] for t in sorted(teams)),
        cordoned=frozenset(cordoned), taints=taints, node_labels=node_labels, namespace_labels=namespace_labels,
        queue_namespaces=frozenset(quotas.queue_namespaces), ignored_pods=dict(inventory.ignored),
        unreadable=reader.unreadable(quotas.team_of), refused_teams=dict(quotas.refused),
        unschedulable=dict(inventory.unschedulable), node_overhead=reader.node_overhead(),
        kueue_managed=frozenset(inventory.kueue_workload), unhealthy_gpus=frozenset(n.gpu_uuid for n in tainted),
        device_health=tainted + devices_gone(previous, listed, node_labels, taken_at),
    )
    return snapshot, inventory
