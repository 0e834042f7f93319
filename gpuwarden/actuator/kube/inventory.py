"""A ``ClusterSnapshot`` from a few paged lists: nodes, namespaces, pods, jobs, PDBs, PriorityClasses
and, where the CRDs exist, Kueue Workloads, ClusterQueues and WorkloadPriorityClasses. The number
of requests grows with pages, never with pods (no per-pod GETs).

Kubernetes does not name GPUs, so GPUs are ``NODE/gpu-I`` in the snapshot and pods are laid on them
in order; findings reach pods through their node, namespace and pod name.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, UTC
from typing import TypeVar

from kubernetes.utils import parse_quantity

from gpuwarden.fleet import (ClusterSnapshot, FleetValueError, Gpu, GpuRequest, Location, MigInstance, Node,
                             Placement, PriceTier, PriorityClass, Team, Topology, Workload, WorkloadKind,
                             WorkloadPhase, WorkloadState, workload_key)

from .api import Json, KubeApi, KubeFailure

log = logging.getLogger("gpuwarden.actuator.kube")

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
TEAM_LABEL = "gpuwarden.io/team"
GUARANTEE_ANNOTATION = "gpuwarden.io/guaranteed-gpus"
BURST_ANNOTATION = "gpuwarden.io/burst-gpus"
CHECKPOINT_ANNOTATION = "gpuwarden.io/checkpointable"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
KUEUE = ("kueue.x-k8s.io", "v1beta1")
ACTIVE_PHASES = "status.phase!=Succeeded,status.phase!=Failed"

E = TypeVar("E", bound=enum.Enum)


@dataclass
class PodRef:
    namespace: str
    name: str
    node: str
    daemonset: bool
    mirror: bool


@dataclass
class Inventory:
    """What the cluster needs beyond the snapshot to act: how each workload is run."""

    controller: dict[str, str] = field(default_factory=dict)  # "ns/name" -> Job, JobSet, Workload, Pod, ...
    pods: dict[str, list[str]] = field(default_factory=dict)
    kueue_workload: dict[str, str] = field(default_factory=dict)  # "ns/name" -> Kueue Workload name
    pdbs: int = 0
    priority_classes: dict[str, int] = field(default_factory=dict)
    workload_priority_classes: dict[str, int] = field(default_factory=dict)
    kueue: bool = False


def _gpu_request(pod: Json) -> tuple[int, str | None]:
    count, mig = 0, None
    for container in pod.get("spec", {}).get("containers") or ():
        resources = container.get("resources") or {}
        wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for key, value in wanted.items():
            if key == GPU:
                count += int(parse_quantity(value))
            elif key.startswith(MIG_PREFIX) and int(parse_quantity(value)) > 0:
                mig = key[len(MIG_PREFIX):]
    return count, mig


def _tolerations(pod: Json) -> tuple[str, ...]:
    """``spec.tolerations`` as ``Workload.tolerations`` (``fleet.taints.taint_blocks``):
    operator Exists names no value; an empty key tolerates every taint."""
    out = []
    for entry in (pod.get("spec") or {}).get("tolerations") or ():
        value = None if entry.get("operator") == "Exists" else str(entry.get("value") or "")
        out.append(str(entry.get("key") or "") + ("" if value is None else f"={value}")
                   + (f":{entry['effect']}" if entry.get("effect") else ""))
    return tuple(out)


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _priority(name: str | None) -> PriorityClass:
    for member in PriorityClass:
        if name and member.value in name.lower():
            return member
    return PriorityClass.NORMAL


def _label(enum_type: type[E], labels: Mapping[str, str], key: str, default: str) -> E:
    """A node label's value as ``enum_type``, or FleetValueError naming the label and the allowed values."""
    value = labels.get(key) or default
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in enum_type)
        raise FleetValueError(f"label {key}={value!r} is not one of: {allowed}") from None


def _node(item: Json) -> tuple[Node, list[Gpu]] | None:
    meta, status = item["metadata"], item.get("status") or {}
    capacity = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    gpus = int(parse_quantity(capacity.get(GPU, "0")))
    mig = {k[len(MIG_PREFIX):]: int(parse_quantity(v)) for k, v in capacity.items() if k.startswith(MIG_PREFIX)}
    if gpus <= 0 and not any(mig.values()):
        return None  # not a GPU node
    labels = meta.get("labels") or {}
    name = meta["name"]
    zone = labels.get("topology.kubernetes.io/zone", "")
    physical = max(gpus, int(labels.get("nvidia.com/gpu.count", "0") or 0), 1 if mig else 0)
    try:
        node = Node(
            name=name, pool=labels.get("gpuwarden.io/pool") or labels.get("nvidia.com/gpu.product", "default"),
            location=_label(Location, labels, "gpuwarden.io/location",
                            "cloud" if item.get("spec", {}).get("providerID") else "on-prem"),
            price_tier=_label(PriceTier, labels, "gpuwarden.io/price-tier", "on-demand"),
            topology=Topology(labels.get("nvidia.com/gpu.clique", name), labels.get("gpuwarden.io/leaf-switch", zone),
                              labels.get("gpuwarden.io/rack", zone)),
            gpu_model=labels.get("nvidia.com/gpu.product", "unknown"), gpu_count=physical,
            cpu_milli=int(parse_quantity(capacity.get("cpu", "0")) * 1000),
            memory_bytes=int(parse_quantity(capacity.get("memory", "0"))),
        )
    except FleetValueError as error:
        log.warning("node %s: %s; its labels are ignored", name, error)
        node = Node(name, "default", Location.ON_PREM, PriceTier.ON_DEMAND, Topology(name, zone, zone), "unknown",
                    physical, 0, 0)
    instances = [MigInstance(i + 1, profile) for profile, n in sorted(mig.items()) for i in range(n)]
    out = []
    for index in range(physical):
        mine = tuple(instances[index::physical]) if mig else ()
        out.append(Gpu(f"{name}/gpu-{index}", index, name, node.gpu_model, mig_enabled=bool(mine), mig_instances=mine))
    return node, out


def read_snapshot(api: KubeApi, page_size: int = 500, clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                  ) -> tuple[ClusterSnapshot, Inventory]:
    taken_at = clock()
    inventory = Inventory()
    nodes, gpus, cordoned, taints, node_labels = [], [], set(), {}, {}
    for item in api.list_all(api.core.list_node, resource="nodes", page_size=page_size):
        built = _node(item)
        if built is None:
            continue
        node, node_gpus = built
        nodes.append(node)
        gpus.extend(node_gpus)
        spec = item.get("spec") or {}
        if spec.get("unschedulable"):
            cordoned.add(node.name)
        own = tuple(f"{t['key']}={t.get('value', '')}:{t.get('effect', '')}" for t in spec.get("taints") or ())
        if own:
            taints[node.name] = own
        node_labels[node.name] = dict(item["metadata"].get("labels") or {})

    namespace_labels: dict[str, dict[str, str]] = {}
    teams_by_ns: dict[str, str] = {}
    team_quota: dict[str, tuple[float, float]] = {}  # guaranteed, burst GPUs
    for item in api.list_all(api.core.list_namespace, resource="namespaces", page_size=page_size):
        meta = item["metadata"]
        labels = dict(meta.get("labels") or {})
        namespace_labels[meta["name"]] = labels
        team = labels.get(TEAM_LABEL, meta["name"])
        teams_by_ns[meta["name"]] = team
        notes = meta.get("annotations") or {}
        if GUARANTEE_ANNOTATION in notes:
            try:
                guaranteed = float(notes[GUARANTEE_ANNOTATION])
                team_quota[team] = (guaranteed, max(guaranteed, float(notes.get(BURST_ANNOTATION, guaranteed))))
            except ValueError:
                log.warning("namespace %s: %s=%r is not a number; ignored", meta["name"], GUARANTEE_ANNOTATION,
                            notes[GUARANTEE_ANNOTATION])

    inventory.pdbs = len(api.list_all(api.policy.list_pod_disruption_budget_for_all_namespaces,
                                      resource="poddisruptionbudgets", page_size=page_size))
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
            nominal, borrow = 0.0, None
            for group in (queue.get("spec") or {}).get("resourceGroups") or ():
                for flavor in group.get("flavors") or ():
                    for resource in flavor.get("resources") or ():
                        if resource.get("name") == GPU:
                            nominal += float(parse_quantity(resource.get("nominalQuota", "0")))
                            if resource.get("borrowingLimit") is not None:
                                borrow = (borrow or 0.0) + float(parse_quantity(resource["borrowingLimit"]))
            team_quota[queue["metadata"]["name"]] = (nominal, nominal + borrow if borrow is not None else 1e9)
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
        meta = kueue_workload["metadata"]
        for owner in meta.get("ownerReferences") or ():
            kueue_owner[(meta.get("namespace", ""), owner.get("kind"), owner.get("name"))] = kueue_workload

    groups: dict[str, Json] = {}
    for pod in api.list_all(api.core.list_pod_for_all_namespaces, resource="pods", page_size=page_size,
                            field_selector=ACTIVE_PHASES):
        count, mig = _gpu_request(pod)
        if count <= 0 and mig is None:
            continue
        meta = pod["metadata"]
        namespace, labels = meta.get("namespace", ""), meta.get("labels") or {}
        owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
        if owner is None:
            controller, name = "Pod", meta["name"]
        elif owner.get("kind") == "Job" and labels.get(JOBSET_LABEL):
            controller, name = "JobSet", labels[JOBSET_LABEL]
        else:
            controller, name = owner.get("kind", "Pod"), owner.get("name", meta["name"])
        key = workload_key(namespace, name)
        group = groups.setdefault(key, {"controller": controller, "namespace": namespace, "name": name, "pods": [],
                                        "count": count, "mig": mig, "annotations": {}, "phases": [],
                                        "created": [], "started": [], "priority": None, "labels": labels,
                                        "tolerations": _tolerations(pod)})
        group["pods"].append(pod)
        group["annotations"].update(meta.get("annotations") or {})
        group["phases"].append((pod.get("status") or {}).get("phase", "Pending"))
        group["created"].append(_time(meta.get("creationTimestamp")))
        group["started"].append(_time((pod.get("status") or {}).get("startTime")))
        group["priority"] = group["priority"] or (pod.get("spec") or {}).get("priorityClassName")

    # Suspended Jobs have no pods: the jobs list shows them (and lets a resume be planned).
    for job in api.list_all(api.batch.list_job_for_all_namespaces, resource="jobs", page_size=page_size):
        meta, spec = job["metadata"], job.get("spec") or {}
        key = workload_key(meta.get("namespace", ""), meta["name"])
        template = (spec.get("template") or {})
        if key in groups:
            groups[key]["annotations"].update(meta.get("annotations") or {})
            if spec.get("suspend"):  # its pods are being terminated by the Job controller
                groups[key]["phases"] = ["Suspended"] * len(groups[key]["phases"])
            continue
        if not spec.get("suspend"):
            continue
        count, mig = _gpu_request(template)
        if count <= 0 and mig is None:
            continue
        groups[key] = {"controller": "Job", "namespace": meta.get("namespace", ""), "name": meta["name"], "pods": [],
                       "count": count, "mig": mig, "annotations": dict(meta.get("annotations") or {}),
                       "phases": ["Suspended"] * int(spec.get("parallelism") or 1),
                       "created": [_time(meta.get("creationTimestamp"))], "started": [None],
                       "priority": (template.get("spec") or {}).get("priorityClassName"), "labels": {}}

    gpu_cursor: dict[str, int] = {}
    mig_cursor: dict[str, int] = {}
    gpus_on = {n.name: n.gpu_count for n in nodes}
    workloads = []
    for key, group in sorted(groups.items()):
        w = kueue_owner.get((group["namespace"], group["controller"], group["name"]))
        if w is not None:
            inventory.kueue_workload[key] = w["metadata"]["name"]
        inventory.controller[key] = group["controller"]
        inventory.pods[key] = [p["metadata"]["name"] for p in group["pods"]]
        phases = group["phases"]
        suspended = "Suspended" in phases or (w is not None and (w.get("spec") or {}).get("active") is False)
        phase = (WorkloadPhase.SUSPENDED if suspended else WorkloadPhase.RUNNING if phases and all(
            p == "Running" for p in phases) else WorkloadPhase.PENDING)
        placements = []
        if phase == WorkloadPhase.RUNNING:
            for pod in group["pods"]:
                node_name = (pod.get("spec") or {}).get("nodeName")
                if node_name not in gpus_on:
                    continue
                last = max(0, gpus_on[node_name] - 1)
                if group["mig"]:  # one MIG instance; up to 7 share a GPU
                    index = mig_cursor.get(node_name, 0)
                    mig_cursor[node_name] = index + 1
                    placements.append(Placement(node_name, f"{node_name}/gpu-{min(index // 7, last)}", index % 7 + 1))
                    continue
                for _ in range(max(1, group["count"])):  # Kubernetes does not say which GPU: lay pods in order
                    index = gpu_cursor.get(node_name, 0)
                    gpu_cursor[node_name] = index + 1
                    placements.append(Placement(node_name, f"{node_name}/gpu-{min(index, last)}"))
        annotations = group["annotations"]
        kind_label = group["labels"].get("gpuwarden.io/workload-kind")
        kind = WorkloadKind(kind_label) if kind_label in {k.value for k in WorkloadKind} else (
            WorkloadKind.TRAINING if group["controller"] in ("Job", "JobSet", "Workload") else
            WorkloadKind.NOTEBOOK if group["controller"] == "Pod" else WorkloadKind.INFERENCE)
        checkpointable = str(annotations.get(CHECKPOINT_ANNOTATION, "")).lower() == "true"
        priority_name = (w.get("spec") or {}).get("priorityClassName") if w is not None else group["priority"]
        workload_namespace: str = group["namespace"]
        workload = Workload(
            name=group["name"], namespace=workload_namespace, kind=kind,
            team=teams_by_ns.get(workload_namespace, workload_namespace), project=workload_namespace,
            priority_class=_priority(priority_name),
            gpus=GpuRequest(count=1, mig_profile=group["mig"]) if group["mig"] else GpuRequest(count=group["count"]),
            gang_size=max(1, len(phases)), checkpointable=checkpointable,
            checkpoint_interval_seconds=600.0 if checkpointable else None, tolerations=group.get("tolerations", ()),
        )
        created = [t for t in group["created"] if t] or [taken_at]
        started = [t for t in group["started"] if t]
        workloads.append(WorkloadState(
            workload=workload, phase=phase, submitted_at=min(created), started_at=min(started) if started else None,
            placements=tuple(placements), controller=group["controller"], pods=tuple(inventory.pods[key]),
            annotations=annotations, priority_override=priority_name if priority_name and _priority(
                priority_name).value != priority_name else None,
        ))  # attained_gpu_seconds stays 0 until it is measured from the store (issue 21)

    teams = {team for team in teams_by_ns.values()} | set(team_quota)
    team_objects = tuple(Team(t, *team_quota.get(t, (0.0, 1e9))) for t in sorted(teams))
    snapshot = ClusterSnapshot(
        taken_at=taken_at, nodes=tuple(nodes), gpus=tuple(gpus), workloads=tuple(workloads), teams=team_objects,
        cordoned=frozenset(cordoned), taints=taints, node_labels=node_labels, namespace_labels=namespace_labels,
    )
    return snapshot, inventory
