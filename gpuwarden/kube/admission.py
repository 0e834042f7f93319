"""The admit patch: one merge PATCH per gated pod that admits it to the node the plan chose.

The API server lets a gated pod's scheduling be tightened, never loosened (Pod Scheduling
Readiness): scheduling gates may only be removed, and required node affinity may only gain
requirements (ANDed onto each existing ``nodeSelectorTerm``, or a first term where there was none).
So the patch

- removes only gpuwarden's gate (``gpuwarden.io/admission``), keeping every other gate in order
  (a merge patch replaces the list whole: the list written is the pod's own, less ours);
- ANDs ``matchFields metadata.name In [node]`` onto every required term (a term may hold only one
  ``metadata.name`` value, so the node is one requirement added to each term), and leaves the
  preferred terms and the rest of the affinity alone;
- writes ``gpuwarden.io/admitted-node`` and ``gpuwarden.io/admitted-at``, so the next snapshot
  counts the pod on that node until kube-scheduler binds it;
- carries the pod's ``metadata.resourceVersion`` as read in the snapshot: a pod changed since is
  the API server's 409, and the caller re-reads that one pod.

kube-scheduler then binds the pod to that node and enforces everything else (taints, CPU, memory).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .api import Json, KubeApi, KubeFailure, MERGE_PATCH
from .failure import Conflict
from .gates import (ADMISSION_GATE, ADMITTED_AT_ANNOTATION, ADMITTED_NODE_ANNOTATION, RESERVED_AT_ANNOTATION,
                    RESERVED_NODES_ANNOTATION, gated_by_gpuwarden, scheduling_gates)

CONFLICT_RETRIES = 3



@dataclass
class PodView:
    """What admitting or annotating a pod needs of it, kept from the snapshot's pod list."""

    name: str
    resource_version: str
    gates: tuple[str, ...] = ()
    terms: list[Json] = field(default_factory=list)  # required nodeSelectorTerms, as read
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def gated(self) -> bool:
        return ADMISSION_GATE in self.gates


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    return PodView(str(meta.get("name")), str(meta.get("resourceVersion") or ""), tuple(scheduling_gates(pod)),
                   list(required.get("nodeSelectorTerms") or ()), dict(meta.get("annotations") or {}))


def node_requirement(node: str) -> Json:
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def admitted_terms(terms: list[Json], node: str) -> list[Json]:
    """``terms`` each narrowed to ``node`` (one term for ``node`` when there were none)."""
    wanted = node_requirement(node)
    return [{**term, "matchFields": [*(f for f in term.get("matchFields") or () if f != wanted), wanted]}
            for term in (terms or [{}])]


def admit_patch(pod: PodView, node: str, at_iso: str) -> Json:
    """The merge patch that admits ``pod`` to ``node`` (``at_iso``: the admission time, ISO-8601 UTC)."""
    gates = [{"name": name} for name in pod.gates if name != ADMISSION_GATE]
    notes: dict[str, str | None] = {ADMITTED_NODE_ANNOTATION: node, ADMITTED_AT_ANNOTATION: at_iso}
    # a hold for it (gpuwarden.io/reserved-nodes) ends with its admission
    notes.update({key: None for key in (RESERVED_NODES_ANNOTATION, RESERVED_AT_ANNOTATION) if key in pod.annotations})
    return {
        "metadata": {"resourceVersion": pod.resource_version, "annotations": notes},
        "spec": {"schedulingGates": gates or None,
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                     "nodeSelectorTerms": admitted_terms(pod.terms, node)}}}},
    }


def pod_nodes(placements: Sequence[Mapping[str, Any]], pods: int) -> list[str]:
    """The node of each of ``pods`` pods from a BIND's placements: one per pod, or one per GPU slot
    (``pods`` equal runs, as the planner lists a multi-GPU pod's GPUs); ValueError when they disagree."""
    if pods < 1 or not placements or len(placements) % pods:
        raise ValueError(f"{len(placements)} placement(s) cannot be split over its {pods} pod(s)")
    per_pod = len(placements) // pods
    nodes = []
    for i in range(pods):
        names = {str(p["node"]) for p in placements[i * per_pod:(i + 1) * per_pod]}
        if len(names) != 1:
            raise ValueError(f"pod {i + 1} of {pods} is placed on several nodes ({', '.join(sorted(names))}); "
                             "a pod runs on one node")
        nodes.append(names.pop())
    return nodes


def admit_pods(api: KubeApi, namespace: str, pods: Sequence[PodView], nodes: Sequence[str], at_iso: str) -> list[str]:
    """Admit each of ``pods`` to its node, one PATCH per pod; the names admitted. A failure midway
    raises ``KubeFailure`` naming the pods admitted before it and those left gated."""
    admitted: list[str] = []
    for pod, node in zip(pods, nodes, strict=True):
        try:
            _admit(api, namespace, pod, node, at_iso)
        except (KubeFailure, ValueError) as error:
            if not admitted and isinstance(error, KubeFailure):
                raise
            left = [p.name for p in pods[len(admitted):]]
            done = ", ".join(admitted) or "none"
            status = error.status if isinstance(error, KubeFailure) and not error.conflict else None
            raise KubeFailure(status, f"pod {pod.name}: {error}; admitted before the failure: {done}; "
                                      f"still gated: {', '.join(left)}",
                              isinstance(error, KubeFailure) and error.temporary) from error
        admitted.append(pod.name)
    return admitted


def _admit(api: KubeApi, namespace: str, pod: PodView, node: str, at_iso: str) -> None:
    """One PATCH; on a 409 (the pod changed since the snapshot) re-read that pod and try again."""
    for attempt in range(CONFLICT_RETRIES + 1):
        try:
            api.call(api.core.patch_namespaced_pod, pod.name, namespace, admit_patch(pod, node, at_iso), verb="patch",
                     resource="pods", _content_type=MERGE_PATCH)
            return
        except Conflict:
            if attempt == CONFLICT_RETRIES:
                raise
        fresh = api.call(api.core.read_namespaced_pod, pod.name, namespace, verb="get", resource="pods")
        if not gated_by_gpuwarden(fresh):
            if ((fresh.get("metadata") or {}).get("annotations") or {}).get(ADMITTED_NODE_ANNOTATION) == node:
                return  # admitted already (a retried round)
            raise ValueError(f"pod {pod.name} is no longer gated by gpuwarden (its gate was removed by someone else)")
        pod = pod_view(fresh)
