"""What one pod (or a Job's pod template) says, read for the snapshot: its GPU request, its
tolerations, times, priority class and kube-scheduler's reason for leaving it Pending."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from gpuwarden.fleet import PriorityClass
from gpuwarden.fleet.node_selection import LabelRequirement, NodeSelection, selection_of
from gpuwarden.fleet.mig_geometry import check_profile

from .api import Json
from .dra_nodes import DRA_NODE_LABEL, PLUGIN_NODE_LABEL
from .inventory_nodes import GPU, MIG_PREFIX, SHARED_GPU, PodRequest, quantity


def gpu_request(pod_spec: Mapping[str, Any]) -> PodRequest:
    """What a pod spec asks of GPUs; ValueError naming the resource and value it cannot take."""
    count, shares, mig = 0, 0, None
    for container in pod_spec.get("containers") or ():
        resources = container.get("resources") or {}
        for key, value in {**(resources.get("requests") or {}), **(resources.get("limits") or {})}.items():
            if key == GPU:
                count += int(quantity(value, f"resource {key}"))
            elif key == SHARED_GPU:
                shares += int(quantity(value, f"resource {key}"))
            elif key.startswith(MIG_PREFIX) and quantity(value, f"resource {key}") > 0:
                mig = key[len(MIG_PREFIX):]
                check_profile(mig)
    if sum(bool(x) for x in (count, shares, mig)) > 1:
        raise ValueError(f"asks for more than one of {GPU}, {SHARED_GPU} and {MIG_PREFIX}<profile>; one kind per pod")
    if shares > 1:
        raise ValueError(f"asks for {shares} of {SHARED_GPU}; one share per pod is supported (the device plugin "
                         "may hand several from different GPUs)")
    return PodRequest(count, mig, shares)


def cpu_memory_request(pod_spec: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU milli, memory bytes) a pod asks of its node, as kube-scheduler counts it: containers'
    requests (else limits) summed, each init container's as a floor, plus the pod's overhead. An
    unreadable quantity counts as 0 (the GPU request is what gpuwarden refuses on)."""
    def reads(part: str) -> tuple[tuple[str, str], ...]:
        out = []
        for container in pod_spec.get(part) or ():
            resources = (container.get("resources") or {}) if isinstance(container, Mapping) else {}
            merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            out.append((str(merged.get("cpu", "0")), str(merged.get("memory", "0"))))
        return tuple(out)

    overhead = pod_spec.get("overhead") or {}
    return _cpu_memory(reads("containers"), reads("initContainers"),
                       (str(overhead.get("cpu", "0")), str(overhead.get("memory", "0"))))


@lru_cache(maxsize=4096)  # pods of one template ask the same: parsing quantities is most of the cost
def _cpu_memory(containers: tuple[tuple[str, str], ...], init: tuple[tuple[str, str], ...],
                overhead: tuple[str, str]) -> tuple[int, int]:
    def amounts(pair: tuple[str, str]) -> tuple[int, int]:
        cpu, memory = pair
        try:
            return int(quantity(cpu, "cpu") * 1000), int(quantity(memory, "memory"))
        except ValueError:
            return 0, 0

    cpu, memory = map(sum, zip(*(amounts(c) for c in containers), strict=True)) if containers else (0, 0)
    for pair in init:
        c, m = amounts(pair)
        cpu, memory = max(cpu, c), max(memory, m)
    c, m = amounts(overhead)
    return cpu + c, memory + m


def _tolerations(pod: Json) -> tuple[str, ...]:
    """``spec.tolerations`` as ``Workload.tolerations`` (``fleet.taints.taint_blocks``):
    operator Exists names no value; an empty key tolerates every taint."""
    out = []
    for entry in (pod.get("spec") or {}).get("tolerations") or ():
        value = None if entry.get("operator") == "Exists" else str(entry.get("value") or "")
        out.append(str(entry.get("key") or "") + ("" if value is None else f"={value}")
                   + (f":{entry['effect']}" if entry.get("effect") else ""))
    return tuple(out)


def node_selection(pod: Json, request: PodRequest | None = None) -> NodeSelection:
    """``spec.nodeSelector`` and the required node-affinity terms' ``matchExpressions``
    (:mod:`gpuwarden.fleet.node_selection`), and where its claims ask devices not allocated yet, the nodes
    whose published devices match them (``request.dra_nodes``, on the snapshot's :data:`.dra_nodes.DRA_NODE_LABEL`):
    kube-scheduler allocates claims only where devices match, so a plan never pins the pod elsewhere."""
    spec = pod.get("spec") or {}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [[LabelRequirement(str(e["key"]), str(e["operator"]), tuple(str(v) for v in e.get("values") or ()))
              for e in term.get("matchExpressions") or ()]
             for term in required.get("nodeSelectorTerms") or ()]
    selection = selection_of(spec.get("nodeSelector") or {}, [t for t in terms if t])
    if request is None or (request.dra_nodes is None and not request.plugin):
        return selection
    devices = (LabelRequirement(DRA_NODE_LABEL, "In", request.dra_nodes) if request.dra_nodes is not None
               else LabelRequirement(PLUGIN_NODE_LABEL, "Exists", ()))
    return tuple((*term, devices) for term in selection) if selection else ((devices,),)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def priority_of(name: str | None) -> PriorityClass:
    for member in PriorityClass:
        if name and member.value in name.lower():
            return member
    return PriorityClass.NORMAL


def _unscheduled_reason(pod: Json) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "Unschedulable")
    return "no reason given by kube-scheduler"
